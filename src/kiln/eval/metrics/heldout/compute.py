"""Held-out loss, perplexity and bits per byte (kiln.eval.perplexity) of the final model, overall and per
source of a mixture, and for every checkpoint the train stage kept (a curve over training, read from the
train folder's checkpoints/, which is optional: without it the curve is the final model alone); beside
them the unigram model's loss on the same batches (the eval_data stage's).

metrics.json keys: val_loss, val_perplexity, val_bits_per_byte, val_tokens_evaluated, val_by_source,
checkpoints, unigram_val_loss, unigram_bits_per_byte.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kiln.config.models import ModelConfig
from kiln.data.loader import ShardRows
from kiln.eval.context import Context, release_cast_weights
from kiln.eval.metrics.output import EvalOutput
from kiln.eval.perplexity import BATCH, bits_per_byte, range_loss, source_ranges, val_rows_loss
from kiln.io import read_json
from kiln.model.build import CONFIG_FILE, build_model
from kiln.train import checkpoint

log = logging.getLogger("kiln.eval")


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


def measure(ctx: Context) -> EvalOutput:
    cfg, model = ctx.cfg, ctx.model
    held_out = HeldOut.open(ctx.paths.shards, ctx.paths.tokens, ctx.meta, cfg.max_batches)
    log.info("held-out loss on up to %d batches", cfg.max_batches)
    overall = held_out.overall(model)
    loss = overall["val_loss"]
    log.info("held-out loss per source: %s", ", ".join(held_out.ranges))
    by_source = held_out.by_source(model, overall)
    summary_path = ctx.paths.model / "summary.json"  # the train stage's: steps, tokens_seen
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
    curve = checkpoint_curve(ctx.paths.model, held_out, final, ctx.device)
    val = ctx.meta["splits"]["val"]
    unigram = ctx.data.unigram_val_loss
    return EvalOutput(
        {
            "val_loss": loss,
            "val_perplexity": math.exp(loss),
            "val_bits_per_byte": bits_per_byte(loss, val["tokens"], val["bytes"]),
            "val_tokens_evaluated": overall["val_tokens_evaluated"],
            "val_by_source": by_source,
            "checkpoints": curve,
            "unigram_val_loss": unigram,
            "unigram_bits_per_byte": bits_per_byte(unigram, val["tokens"], val["bytes"]),
        }
    )
