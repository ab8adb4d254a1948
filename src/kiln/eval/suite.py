"""Everything the eval stage measures on a trained model, in one call: every registered eval metric
(kiln.eval.metrics.registry), in registration order, each given the same Context (kiln.eval.context):

- held-out loss, perplexity and bits per byte beside a unigram model, per source and per kept
  checkpoint (heldout);
- completions of fixed prompts, greedy and sampled (completions);
- FIM infilling, not run for a model trained without FIM (infill);
- lm-eval tasks through the "kiln" model, local ones built from the held-out split (lm_eval);
- HumanEval pass@k and HumanEval-Infilling pass@1, every program run in a sandbox (code), at the
  sizes kiln.eval.sizes resolves for this device (`auto`: a few problems on a CPU, all on a GPU);
- 13-gram contamination of each eval set against the training tokens (contamination).

Then what is the model's, not a metric's: its parameters, and train.samples' prompts completed by it
(kiln.eval.metrics.output lays the result out).

What needs only the data (the unigram baseline, the infilling problems, the local tasks' data, the
contamination scan) was made by the eval_data stage on a CPU beside training (kiln.eval.prepared);
this stage reads it and runs the model, so a GPU job spends its time on the model. Nothing here
reads the train split: the stage's memory is the model's, the held-out data's and the vocabulary's.

The model runs on the device train.device names (kiln.train.device.select_device): on a GPU under
train's bf16 autocast, on the CPU in fp32 as always (kiln.train.device.eval_autocast). Each model
(the final one, then each kept checkpoint; lm-eval's adapter loads its own copy) is moved there once,
and only token batches travel after it.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import torch

from kiln.config.eval_sections import EvalSection
from kiln.data.tokenizer import load_tokenizer
from kiln.eval import sizes
from kiln.eval.context import Context, RunPaths
from kiln.eval.metrics import registry
from kiln.eval.metrics.output import EvalOutput
from kiln.eval.prepared import EvalData
from kiln.io import read_json
from kiln.model.build import load_model
from kiln.train.device import eval_autocast
from kiln.train.samples import Sampler

log = logging.getLogger("kiln.eval")
CPU = torch.device("cpu")


def evaluate(
    paths: RunPaths,
    cfg: EvalSection,
    seed: int,
    work_dir: Path,
    device: torch.device = CPU,
    precision: str = "fp32",
    sampler: Sampler | None = None,
) -> EvalOutput:
    """metrics.json and samples.json for the run, the model on `device` with train.precision's autocast
    there (eval_autocast); a metric's working files (lm-eval's task files) go under work_dir. sampler:
    train.samples' prompts, completed by the final model here, so changing them shows new completions
    without training again."""
    with eval_autocast(device, precision)():
        return _evaluate(paths, cfg, seed, work_dir, device, precision, sampler)


def _evaluate(
    paths: RunPaths,
    cfg: EvalSection,
    seed: int,
    work_dir: Path,
    device: torch.device,
    precision: str,
    sampler: Sampler | None,
) -> EvalOutput:
    torch.manual_seed(seed)
    model, tokenizer = load_model(paths.model, device), load_tokenizer(paths.tokenizer)
    # EvalData.read refuses data made for another eval.max_batches, before any metric runs
    meta, data = read_json(paths.tokens / "meta.json"), EvalData.read(paths.eval_data, cfg.max_batches)
    summary = paths.model / "summary.json"  # the train stage's time, which prices HumanEval's samples
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    cfg = sizes.for_run(cfg, model.config, card, read_json(summary) if summary.is_file() else {})
    ctx = Context(paths, cfg, seed, work_dir, device, precision, model, tokenizer, meta, data)
    out = EvalOutput()
    for metric in registry.metrics():
        log.info("eval metric %s: %s", metric.name, metric.about)
        out = out.add(importlib.import_module(metric.compute).measure(ctx), by=metric.name)
    return out.add(
        EvalOutput(
            {"n_params": sum(p.numel() for p in model.parameters())},
            {"train_prompts": sampler(model) if sampler else []},  # train.samples, from the final model
        ),
        by="the suite",
    )
