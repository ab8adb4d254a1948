"""The console lines a training run prints at its log and validation steps (rank 0 only; the figures
come from the metrics.jsonl record the trainer builds, so the two never disagree)."""

from __future__ import annotations

import logging

from kiln.plan.tables import format_eta

log = logging.getLogger("kiln.train")


def log_model(cfg, n_params: int, world: int, strategy: str, plan) -> None:
    """The run's shape, once at its start: model settings, parameters, and the batch as
    ranks x micro-batches x rows x tokens (kiln.config.batch.split_batch)."""
    log.info(
        "model: %s, %s parameters; %d ranks (%s) x %d micro-batches x %d rows x %d tokens = %d tokens/step",
        cfg.to_dict(),
        f"{n_params:,}",
        world,
        strategy,
        plan.grad_accum,
        plan.micro_batch,
        cfg.seq_len,
        plan.tokens_per_step,
    )


def log_progress(record: dict, max_steps: int, tokens_per_step: int, steady_tokens_per_s: float | None) -> None:
    """`step s/N | loss | lr | grad | tok/s | TFLOP/s [| MFU] | MB | ETA`, the ETA at the steady rate
    (kiln.train.metrics.Throughput), or at this window's before the rate has settled."""
    rate = steady_tokens_per_s or record["tokens_per_s"]
    eta = (max_steps - record["step"]) * tokens_per_step / rate
    mfu = (
        f" | MFU {record['mfu']:.1%} (torchtitan transformers-backend count {record['mfu_torchtitan']:.1%})"
        if record["mfu"] is not None
        else ""
    )
    bpb = "" if record["bpb"] is None else f" ({record['bpb']:.3f} bits/byte)"
    held = record.get("memory_reserved_mb")  # on a GPU: the allocator's hold beside the tensors'
    memory = f"{record['memory_mb']:.0f} MB" + ("" if held is None else f" ({held:.0f} reserved)")
    log.info(
        "step %d/%d | loss %.4f%s | lr %.2e | grad %.3f | %s tok/s | %.2f TFLOP/s%s | %s | ETA %s",
        record["step"],
        max_steps,
        record["loss"],
        bpb,
        record["lr"],
        record["grad_norm"],
        f"{record['tokens_per_s']:,.0f}",
        record["tflops"],
        mfu,
        memory,
        format_eta(eta),
    )


def log_validation(record: dict, samples: list[dict]) -> None:
    """`step s | val loss [| bits/byte]`, then each sample's prompt and completion."""
    step, bpb = record["step"], record["val_bpb"]
    log.info("step %d | val loss %.4f%s", step, record["val_loss"], "" if bpb is None else f" | {bpb:.4f} bits/byte")
    for row in samples:
        log.info("step %d | sample %r -> %r", step, row["prompt"], row["completion"])


def log_start_validation(val_loss: float, source: str) -> None:
    """`step 0 | val loss (the weights of <source>)`: a run that starts from another model's weights."""
    log.info("step 0 | val loss %.4f (the weights of %s)", val_loss, source)
