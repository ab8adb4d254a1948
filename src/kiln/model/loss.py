"""The training loss of both families: cross-entropy over the vocabulary, computed a chunk of rows at a
time so the (B, T, V) logits never exist at once, in any dtype.

Shapes: N = B*T rows (positions), C = d_model, V = padded vocab, n = rows per chunk.

The plain loss, `F.cross_entropy(lm_head(h).float(), y)`, holds the bf16 logits (N, V), their fp32
copy and the log-softmax that cross_entropy saves for backward, all alive until backward reaches the
head: at llama3.2-1b's flagship shape (6 x 8192 rows, V 32,768) that is 3.2 GB + 6.4 GB + 6.4 GB.
Here each chunk's head matmul and cross-entropy run under torch.utils.checkpoint (non-reentrant):
the forward keeps only the chunk's loss sum, and backward recomputes the chunk's logits from the
hidden states and the head weight, one chunk at a time (torchtitan's and Liger-Kernel's chunked
loss, done with checkpoint rather than a fused kernel). The price is the head's forward matmul once
more, 2*N*V*C FLOPs: ~2% of llama3.2-1b's step, more for a model whose head is a large share of it;
when one chunk holds every row there is nothing to gain, and no recompute.
Under bf16 autocast every chunk computes exactly what the plain loss computes for its rows (bf16
logits upcast to fp32), so the two agree to fp32 rounding of the sum (tests/unit/model/test_loss.py).

Rows per chunk come from kiln.config.models.loss_chunk_rows (torch-free, so the memory estimate
kiln.plan.memory counts the same chunk).

`chunk_loss` is the per-chunk function; a compiled run passes it compiled (the model's chunk_loss,
set by kiln.train.parallel.compile_blocks), which fuses the upcast, log-softmax and gather into a
few kernels instead of the eager path's fp32 copy of each chunk's logits (docs/benchmarks.md, "The compiled loss on CPU").
The head's weight gradient is a sum over chunks accumulated into its fp32 .grad either way: each
chunk's bf16 product is upcast before autograd adds it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kiln.config.models import loss_chunk_rows


def chunk_loss_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(n, C) hidden states, (V, C) head weight, (n,) ids -> the summed cross-entropy of the n rows (fp32)."""
    logits = F.linear(h, weight)  # (n, V): bf16 under autocast, as the plain head computes it
    return F.cross_entropy(logits.float(), targets, reduction="sum")


ChunkLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int | None = None,
    chunk_loss: ChunkLoss = chunk_loss_sum,
) -> torch.Tensor:
    """Mean next-token cross-entropy of hidden (B, T, C), the final norm's output, through the head
    `weight` (V, C) against targets (B, T): equal to F.cross_entropy(F.linear(hidden, weight).float()
    .flatten(0, 1), targets.flatten()), without its (N, V) tensors alive at once. Every target counts
    (Kiln's rows have no padding: no ignore_index)."""
    h, y = hidden.flatten(0, 1), targets.reshape(-1)  # (N, C), (N,)
    n_rows = h.size(0)
    rows = chunk_rows or loss_chunk_rows(weight.size(0))
    if n_rows <= rows:
        # One chunk: its logits are what backward uses first, so recomputing them would free nothing
        # at the peak (the same 12 bytes a logit either way, measured) and only cost the matmul again.
        return chunk_loss(h, weight, y) / n_rows
    total = torch.zeros((), device=h.device, dtype=torch.float32)
    for start in range(0, n_rows, rows):
        total = total + checkpoint(
            chunk_loss, h[start : start + rows], weight, y[start : start + rows], use_reentrant=False
        )
    return total / n_rows
