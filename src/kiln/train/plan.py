"""How one optimizer step's tokens split across ranks and micro-batches (torch-free, so config
validation can check it before any job starts), and the arithmetic of the smoke stage's plan of the
full run (kiln.train.tables renders it).

The global batch is given in tokens (train.batch_tokens); each of W ranks runs micro-batches of
micro_batch rows of seq_len tokens, so gradient accumulation is
batch_tokens / (W * micro_batch * seq_len), which must be a whole number.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import KilnError


@dataclass(frozen=True)
class BatchPlan:
    world: int
    micro_batch: int
    seq_len: int
    grad_accum: int

    @property
    def tokens_per_step(self) -> int:
        return self.world * self.grad_accum * self.micro_batch * self.seq_len


def plan_batch(batch_tokens: int | None, micro_batch: int, seq_len: int, world: int) -> BatchPlan:
    """The plan for a global batch of batch_tokens (None: one micro-batch per rank per step)."""
    per_pass = world * micro_batch * seq_len
    if batch_tokens is None:
        return BatchPlan(world, micro_batch, seq_len, 1)
    if batch_tokens % per_pass:
        nearest = sorted({max(1, batch_tokens // per_pass) * per_pass, (batch_tokens // per_pass + 1) * per_pass})
        raise KilnError(
            f"train.batch_tokens: {batch_tokens} is not a multiple of {world} ranks x "
            f"train.micro_batch {micro_batch} x shard.seq_len {seq_len} = {per_pass} tokens "
            f"(nearest that are: {' or '.join(map(str, nearest))})"
        )
    return BatchPlan(world, micro_batch, seq_len, batch_tokens // per_pass)


CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal at ~20 tokens per parameter


def full_run_plan(*, batch: BatchPlan, max_steps: int, tokens_per_s: float, n_params: int,
                  train_tokens: int, checkpoint_bytes: int, keep_checkpoints: int, model_bytes: int,
                  price_per_gpu_hour: float | None = None) -> dict:
    """What the full run will take, from the smoke stage's steady-state tokens/s (all ranks together).

    Total tokens are max_steps x the global batch; time is that over tokens/s; cost is the
    device-hours (time x ranks) at price_per_gpu_hour. Disk counts the checkpoints kept at the same
    time plus the final weights twice (model.safetensors and the Hugging Face export)."""
    total_tokens = max_steps * batch.tokens_per_step
    eta_s = total_tokens / tokens_per_s if tokens_per_s > 0 else float("inf")
    device_hours = eta_s / 3600 * batch.world
    return {
        "ranks": batch.world, "micro_batch": batch.micro_batch, "seq_len": batch.seq_len,
        "grad_accum": batch.grad_accum, "tokens_per_step": batch.tokens_per_step, "max_steps": max_steps,
        "total_tokens": total_tokens,
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_rank": tokens_per_s / batch.world,
        "eta_s": eta_s, "eta_h": eta_s / 3600, "device_hours": device_hours,
        "price_per_gpu_hour": price_per_gpu_hour,
        "cost": device_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None,
        "n_params": n_params, "tokens_per_param": total_tokens / n_params,
        "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * n_params,
        "train_tokens": train_tokens, "epochs": total_tokens / train_tokens if train_tokens else None,
        "checkpoint_bytes": checkpoint_bytes, "keep_checkpoints": keep_checkpoints,
        "disk_bytes": keep_checkpoints * checkpoint_bytes + 2 * model_bytes,
    }
