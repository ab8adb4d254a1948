"""Everything the eval stage measures on a trained model, in one call.

- held-out loss, perplexity and bits per byte, next to a unigram model of the same data; the same
  per source of a mixture (`val_by_source`), and for every checkpoint the train stage kept
  (`checkpoints`: a curve over training, read from the train folder's checkpoints/, which is optional:
  without it the curve is the final model alone);
- completions of fixed prompts (greedy and sampled);
- FIM infilling (single/multi-line, PSM/SPM): exact match and edit similarity; not run for a model
  trained without FIM (kiln.eval.infill.not_run_reason), which could only score noise;
- lm-eval tasks through the "kiln" model (local ones built from the held-out split);
- HumanEval pass@k and HumanEval-Infilling pass@1, every program run in a sandbox (kiln.eval.code);
- 13-gram contamination of each eval set against the training tokens.

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

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kiln.config.eval_sections import EvalSection, LmEval
from kiln.config.models import ModelConfig
from kiln.data.loader import ShardRows
from kiln.data.tokenizer import load_tokenizer
from kiln.eval.code import run_code_evals
from kiln.eval.infill import run_infill
from kiln.eval.lm_tasks import LOCAL_TASKS, current_names, run_lm_eval, write_task_configs
from kiln.eval.perplexity import BATCH, bits_per_byte, range_loss, source_ranges, val_rows_loss
from kiln.eval.prepared import EvalData
from kiln.generate.decode import describe
from kiln.generate.healing import complete
from kiln.io import read_json
from kiln.model.build import CONFIG_FILE, build_model, load_model
from kiln.train import checkpoint
from kiln.train.device import eval_autocast
from kiln.train.samples import Sampler

log = logging.getLogger("kiln.eval")
CPU = torch.device("cpu")


@dataclass(frozen=True)
class RunPaths:
    model: Path  # train stage folder (model_config.json, model.safetensors)
    shards: Path
    tokens: Path  # meta.json and val.bin (the per-source losses)
    tokenizer: Path
    eval_data: Path  # the eval_data stage's folder (kiln.eval.prepared)


def completions(model, tokenizer, cfg: EvalSection, seed: int) -> list[dict]:
    """Each prompt continued greedily and sampled (every prompt in one batch per mode), with token
    healing (kiln.generate.healing)."""
    generator = torch.Generator().manual_seed(seed)
    out = [{"prompt": prompt} for prompt in cfg.prompts]
    for name, temperature in (("greedy", 0.0), ("sampled", cfg.temperature)):
        texts = complete(
            model,
            tokenizer,
            cfg.prompts,
            cfg.max_new_tokens,
            temperature=temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            generator=generator,
        )
        for row, text in zip(out, texts):
            row[name] = text
    return out


def decoding(cfg: EvalSection) -> dict[str, str]:
    """completions()'s rows' keys -> how each was decoded (kiln.generate.decode.describe)."""
    return {"greedy": describe(0.0), "sampled": describe(cfg.temperature, cfg.top_k, cfg.top_p)}


@dataclass(frozen=True)
class HeldOut:
    """The validation data every model of a run is measured on: the val shard rows (the first
    max_batches batches of BATCH rows) for the overall loss, and val.bin with each source's token range
    for the per-source losses; those share max_batches between the sources, so measuring a model
    costs about 2 x max_batches batches whatever the number of sources."""

    rows: ShardRows
    tokens: np.ndarray  # val.bin
    ranges: dict  # source -> {start, end, docs, tokens, bytes} (source_ranges)
    split: dict  # meta.json splits.val: docs, tokens, bytes
    seq_len: int
    max_batches: int

    @classmethod
    def open(cls, shards: Path, tokens: Path, meta: dict, max_batches: int) -> "HeldOut":
        rows = ShardRows(shards, "val")
        return cls(
            rows,
            np.memmap(tokens / "val.bin", dtype=meta["dtype"], mode="r"),
            source_ranges(meta),
            meta["splits"]["val"],
            int(rows.manifest["seq_len"]),
            max_batches,
        )

    def overall(self, model) -> dict:
        """val_loss, val_bits_per_byte (the split's tokens/bytes) and val_tokens_evaluated."""
        loss, n = val_rows_loss(model, self.rows, BATCH, self.max_batches)
        return {
            "val_loss": loss,
            "val_bits_per_byte": bits_per_byte(loss, self.split["tokens"], self.split["bytes"]),
            "val_tokens_evaluated": n,
        }

    def by_source(self, model, overall: dict) -> dict[str, dict]:
        """{source: {loss, perplexity, bits_per_byte, tokens_evaluated}}, each on its own tokens, its
        bits per byte from its own tokens/bytes ratio; every source with validation tokens. A lone
        source is the whole split: its figures are `overall`'s (that model's), not measured again."""
        if len(self.ranges) == 1:
            name = next(iter(self.ranges))
            loss = overall["val_loss"]
            return {
                name: {
                    "loss": loss,
                    "perplexity": math.exp(loss),
                    "bits_per_byte": overall["val_bits_per_byte"],
                    "tokens_evaluated": overall["val_tokens_evaluated"],
                }
            }
        batches = max(1, -(-self.max_batches // max(len(self.ranges), 1)))
        out = {}
        for name, r in self.ranges.items():
            if r["end"] - r["start"] < 2:
                continue
            loss, n = range_loss(model, self.tokens, r["start"], r["end"], self.seq_len, BATCH, batches)
            out[name] = {
                "loss": loss,
                "perplexity": math.exp(loss),
                "bits_per_byte": bits_per_byte(loss, r["tokens"], r["bytes"]),
                "tokens_evaluated": n,
            }
        return out


def kept_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """(step, checkpoint folder) of the checkpoints the train stage kept in model_dir/checkpoints,
    by step (kiln.train.checkpoint.kept); none when there are none."""
    return checkpoint.kept(Path(model_dir) / "checkpoints")


def load_checkpoint(folder: Path, model_dir: Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, dict]:
    """(model in eval mode on `device`, {step, tokens}) from a kept checkpoint, shaped by the train
    folder's model_config.json (the checkpoints of a run share its model: their fingerprint says so)."""
    weights, at = checkpoint.load_weights(folder)
    cfg = ModelConfig(**read_json(Path(model_dir) / CONFIG_FILE))
    if cfg.tie_embeddings and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["wte.weight"]
    model = build_model(cfg)
    model.load_state_dict(weights)
    return model.to(device).eval(), at


def checkpoint_curve(model_dir: Path, held_out: HeldOut, final: dict, device: torch.device | str = "cpu") -> list[dict]:
    """[{step, tokens, val_loss, val_bits_per_byte, final[, by_source]}] for every checkpoint kept in
    model_dir/checkpoints and the final model (`final`: its entry, already measured), by step; a
    checkpoint at the final model's step is that model and is not measured twice. by_source ({source:
    {loss, bits_per_byte}}) only for mixtures. A checkpoint that does not load into the run's model
    (left from another run) is skipped with a warning."""
    mixture = len(held_out.ranges) > 1
    curve = [final]
    for step, folder in kept_checkpoints(model_dir):
        if step == final.get("step"):
            continue
        try:
            model, at = load_checkpoint(folder, model_dir, device)
        except (RuntimeError, KeyError) as exc:
            log.warning("checkpoint %s skipped: it does not load into this run's model: %s", folder, exc)
            continue
        log.info("held-out loss of checkpoint %s", folder.name)
        point = held_out.overall(model)
        entry = {**at, "val_loss": point["val_loss"], "val_bits_per_byte": point["val_bits_per_byte"], "final": False}
        if mixture:
            entry["by_source"] = {
                s: {"loss": m["loss"], "bits_per_byte": m["bits_per_byte"]}
                for s, m in held_out.by_source(model, point).items()
            }
        curve.append(entry)
        del model
        release_cast_weights()
    return sorted(curve, key=lambda e: (e["step"] is None, e["step"] or 0))


def _lm_eval(
    paths: RunPaths,
    cfg: LmEval,
    tasks: list[str],
    data: EvalData,
    tasks_dir: Path,
    device: torch.device,
    precision: str,
) -> dict:
    """lm-eval results by task; tasks that cannot be loaded (a hub task offline) are reported, not fatal.
    The local tasks' YAMLs go in tasks_dir, naming the eval_data stage's files."""
    write_task_configs(data.task_data, tasks_dir)
    model_args = {
        "pretrained": str(paths.model),
        "tokenizer": str(paths.tokenizer),
        "device": str(device),
        "precision": precision,
    }
    results = {}
    for task in tasks:
        try:
            results.update(run_lm_eval("kiln", model_args, [task], tasks_dir, limit=cfg.limit))
        except Exception as exc:  # lm-eval raises many kinds for a task it cannot fetch or build
            if task in LOCAL_TASKS:
                raise
            log.warning("lm-eval task %s unavailable: %s", task, exc)
            results[task] = {"unavailable": str(exc)[:300]}
    return results


def release_cast_weights() -> None:
    """Drop autocast's bf16 copies of the weights. Inside one autocast region (all of `evaluate`, on a
    GPU) torch keeps a cast copy of every weight it has cast until the region ends: without this,
    every checkpoint of the curve and lm-eval's model would each leave a bf16 copy of the model on
    the device, a 1B model's 2 GB apiece. The next forward casts again, as it would in a new region."""
    torch.clear_autocast_cache()


def evaluate(
    paths: RunPaths,
    cfg: EvalSection,
    seed: int,
    work_dir: Path,
    device: torch.device = CPU,
    precision: str = "fp32",
    sampler: Sampler | None = None,
) -> tuple[dict, dict]:
    """(metrics, samples) for the run, the model on `device` with train.precision's autocast there
    (eval_autocast); lm-eval's task files go under work_dir. sampler: train.samples' prompts,
    completed by the final model here, so changing them shows new completions without training again."""
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
) -> tuple[dict, dict]:
    torch.manual_seed(seed)
    model, tokenizer = load_model(paths.model, device), load_tokenizer(paths.tokenizer)
    meta = read_json(paths.tokens / "meta.json")
    data = EvalData.read(paths.eval_data, cfg.max_batches)
    held_out = HeldOut.open(paths.shards, paths.tokens, meta, cfg.max_batches)
    log.info("held-out loss on up to %d batches", cfg.max_batches)
    overall = held_out.overall(model)
    loss, n_tokens = overall["val_loss"], overall["val_tokens_evaluated"]
    log.info("held-out loss per source: %s", ", ".join(held_out.ranges))
    by_source = held_out.by_source(model, overall)
    summary_path = paths.model / "summary.json"  # the train stage's: steps, tokens_seen
    summary = read_json(summary_path) if summary_path.exists() else {}
    final = {
        "step": summary.get("steps"),
        "tokens": summary.get("tokens_seen"),
        "val_loss": loss,
        "val_bits_per_byte": overall["val_bits_per_byte"],
        "final": True,
    }
    if len(held_out.ranges) > 1:
        final["by_source"] = {s: {"loss": m["loss"], "bits_per_byte": m["bits_per_byte"]} for s, m in by_source.items()}
    curve = checkpoint_curve(paths.model, held_out, final, device)
    val = meta["splits"]["val"]

    if data.infill_not_run:
        log.info("infilling not run: %s", data.infill_not_run)
        infill = {"scores": {"not_run": data.infill_not_run}, "examples": []}
    else:
        log.info("infilling: %d problems", len(data.infill_problems))
        infill = run_infill(model, tokenizer, list(data.infill_problems))
    code, code_examples = run_code_evals(model, tokenizer, cfg, seed, infill_not_run=data.infill_not_run)
    tasks = current_names(cfg.lm_eval.tasks)
    log.info("lm-eval tasks: %s", ", ".join(tasks))
    release_cast_weights()  # the final model's, before lm-eval loads its own copy of it
    harness = _lm_eval(paths, cfg.lm_eval, tasks, data, work_dir / "lm_eval_tasks", device, precision)
    release_cast_weights()  # lm-eval's model's
    metrics = {
        "val_loss": loss,
        "val_perplexity": math.exp(loss),
        "val_bits_per_byte": bits_per_byte(loss, val["tokens"], val["bytes"]),
        "val_tokens_evaluated": n_tokens,
        "val_by_source": by_source,
        "checkpoints": curve,
        "unigram_val_loss": data.unigram_val_loss,
        "unigram_bits_per_byte": bits_per_byte(data.unigram_val_loss, val["tokens"], val["bytes"]),
        "infill": infill["scores"],
        "lm_eval": harness,
        "code": code,  # kiln.eval.code: HumanEval and HumanEval-Infilling, run in the sandbox
        "contamination": data.contamination,
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    samples = {
        "completions": completions(model, tokenizer, cfg, seed),
        "decoding": decoding(cfg),  # what the report labels each completion with
        "infill": infill["examples"],  # greedy: scored by exact match
        "code": code_examples,
        "train_prompts": sampler(model) if sampler else [],  # train.samples, from the final model
    }
    return metrics, samples
