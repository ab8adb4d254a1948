"""How one optimizer step's tokens split across ranks and micro-batches: a field derived from the
config (train.batch_tokens, train.micro_batch, shard.seq_len and the ranks), checked when the config
is validated, before any job starts.

The global batch is given in tokens (train.batch_tokens); each of W ranks runs micro-batches of
micro_batch rows of seq_len tokens, so gradient accumulation is
batch_tokens / (W * micro_batch * seq_len), which must be a whole number.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import KilnError


@dataclass(frozen=True)
class BatchSplit:
    world: int
    micro_batch: int
    seq_len: int
    grad_accum: int

    @property
    def global_rows(self) -> int:
        """Rows every rank's micro-batches of one optimizer step read together."""
        return self.world * self.grad_accum * self.micro_batch

    @property
    def tokens_per_step(self) -> int:
        return self.global_rows * self.seq_len


def split_batch(batch_tokens: int | None, micro_batch: int, seq_len: int, world: int) -> BatchSplit:
    """The plan for a global batch of batch_tokens (None: one micro-batch per rank per step)."""
    per_pass = world * micro_batch * seq_len
    if batch_tokens is None:
        return BatchSplit(world, micro_batch, seq_len, 1)
    if batch_tokens % per_pass:
        nearest = sorted({max(1, batch_tokens // per_pass) * per_pass, (batch_tokens // per_pass + 1) * per_pass})
        raise KilnError(
            f"train.batch_tokens: {batch_tokens} is not a multiple of {world} ranks x "
            f"train.micro_batch {micro_batch} x shard.seq_len {seq_len} = {per_pass} tokens "
            f"(nearest that are: {' or '.join(map(str, nearest))}){_same_batch(batch_tokens, micro_batch, seq_len, world)}"
        )
    return BatchSplit(world, micro_batch, seq_len, batch_tokens // per_pass)


def _same_batch(batch_tokens: int, micro_batch: int, seq_len: int, world: int) -> str:
    """The other fix: the largest micro-batch below micro_batch at which these ranks make the same
    global batch (a run moved to more nodes keeps its trajectory: seed 000's 196,608 tokens on 8
    ranks of 8,192-token rows is micro-batch 3), or nothing when there is none."""
    rows, left = divmod(batch_tokens, world * seq_len)
    m = next((m for m in range(min(micro_batch - 1, rows), 0, -1) if rows % m == 0), None)
    if left or m is None:
        return ""
    return f"; or keep the batch with train.micro_batch: {m} ({rows // m} micro-batch{'es' if rows // m > 1 else ''} a step)"
