"""What every eval metric is measured with (kiln.eval.metrics.registry): the run's folders, the eval
section, the loaded model and tokenizer, the eval_data stage's figures, the device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from kiln.config.eval_sections import EvalSection
from kiln.eval.prepared import EvalData


@dataclass(frozen=True)
class RunPaths:
    model: Path  # train stage folder (model_config.json, model.safetensors, summary.json, checkpoints/)
    shards: Path
    tokens: Path  # meta.json and val.bin (the per-source losses)
    tokenizer: Path
    eval_data: Path  # the eval_data stage's folder (kiln.eval.prepared)


@dataclass(frozen=True)
class Context:
    """A metric's inputs. The model is the final one, in eval mode on `device`, inside train.precision's
    autocast there (kiln.train.device.eval_autocast); a metric that loads another model (a checkpoint,
    lm-eval's copy) calls release_cast_weights after it."""

    paths: RunPaths
    cfg: EvalSection  # the eval section (each metric's keys: its section.py)
    seed: int  # train.seed: a metric that samples seeds its own generator with it
    work_dir: Path  # the eval stage's folder, for a metric's working files (lm-eval's task YAMLs)
    device: torch.device
    precision: str  # train.precision
    model: torch.nn.Module
    tokenizer: Tokenizer
    meta: dict  # the pretokenize stage's meta.json: splits, sources, dtype
    data: EvalData  # what the eval_data stage made of the data alone


def release_cast_weights() -> None:
    """Drop autocast's bf16 copies of the weights. Inside one autocast region (all of the eval, on a
    GPU) torch keeps a cast copy of every weight it has cast until the region ends: without this,
    every checkpoint of the curve and lm-eval's model would each leave a bf16 copy of the model on
    the device, a 1B model's 2 GB apiece. The next forward casts again, as it would in a new region."""
    torch.clear_autocast_cache()
