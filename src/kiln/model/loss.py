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
The head's weight gradient is a sum over the chunks' (V, C) products, which autograd adds in the dtype
of the tensor the chunks share. Under bf16 autocast that was bf16 (issue 59, defect 7): in eager, on the
plain rank, autocast's one cached bf16 copy of the fp32 weight; eager or compiled under FSDP2, the bf16
weight itself (param_dtype, kiln.train.parallel). A compiled chunk given an fp32 weight casts it inside
its graph and hands its product back in fp32. `_accumulating_head` now gives the chunks an fp32 view
that no cache shares: each chunk casts its own bf16 copy, its product comes back upcast, and the sum
stays fp32 until the weight's gradient takes it (fp32 .grad on the plain rank; one rounding to bf16
under FSDP2, whose reduce-scatter and micro-batch accumulation are fp32). One chunk is one matmul,
summing its rows in fp32 already. At 32 chunks the head's gradient erred 2.4x one chunk's against
fp32's, now as one chunk's; the fp32 sum costs 2 bytes an element of the head at the loss's backward,
8 under FSDP2 (docs/benchmarks.md, "The tied weight's gradient under bf16").
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
    head = _accumulating_head(weight, h.device.type)
    total = torch.zeros((), device=h.device, dtype=torch.float32)
    for start in range(0, n_rows, rows):
        total = total + checkpoint(
            chunk_loss, h[start : start + rows], head, y[start : start + rows], use_reentrant=False
        )
    return total / n_rows


def _accumulating_head(weight: torch.Tensor, device_type: str) -> torch.Tensor:
    """The (V, C) weight the chunks share, such that autograd sums their gradients in fp32: under bf16
    autocast with gradients on, an fp32 view (a view, so autocast's cache of leaf weights skips it);
    a bf16 weight is upcast first, an fp32 copy held until the loss's backward (V*C*4 bytes). Else the
    weight (no autocast: the chunks' products are in the weight's own dtype, a bf16 model's included)."""
    if not (torch.is_autocast_enabled(device_type) and torch.is_grad_enabled() and weight.requires_grad):
        return weight
    return weight.float().view(weight.shape)
