"""Scaled dot-product attention with the kernel order set, not left to the torch release.

SDPA picks a kernel per call from the inputs (device, dtype, head dim, mask); which it tries first
is a heuristic that moves between releases (torch 2.11 took cuDNN on an H200 where the pinned 2.13
may not). As torchtitan does (models/common/attention.py), every call here runs under
`sdpa_kernel(SDPA_PRIORITY, set_priority=True)`: cuDNN's fused attention first, then flash, the
memory-efficient kernel, the math fallback. A backend that cannot take the inputs is skipped, so on
a CPU (flash or math) nothing changes. `kernel_name` says which one a shape gets: the smoke stage
records it (smoke/report.json's attention_kernel).

A CPU's compiled step computes plain causal attention itself (`blockwise_causal`): SDPA's CPU flash
kernel is an opaque call in inductor's graph, while the scores written out in blocks of queries skip
the blocks above the diagonal and leave inductor the mask, softmax and casts to fuse around plain
matmuls. The default's step ran 1.15x faster so (kiln.config.models.QUERY_BLOCK says where it
applies). kiln.train.parallel.compile_blocks turns it on (each block's attention's `blockwise`);
eager calls, a GPU, decoding and document masks keep SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kiln.config.models import BLOCKWISE_CAUSAL, FLEX_ATTENTION, ModelConfig, blockwise_attention, query_blocks

SDPA_PRIORITY = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, **kwargs) under SDPA_PRIORITY."""
    with sdpa_kernel(SDPA_PRIORITY, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def blockwise_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of (B, H, T, D) queries over (B, K, T, D) keys and values, K dividing H, written
    out for inductor (module docstring): each block of queries (kiln.config.models.query_blocks)
    scores only the keys at or before its last query. Scores and softmax in fp32 whatever autocast
    says, as SDPA's kernels accumulate them; the probabilities meet v in v's dtype."""
    if k.size(1) != q.size(1):  # grouped-query: query head h reads key/value head h // (H / K)
        k, v = (x.repeat_interleave(q.size(1) // k.size(1), dim=1) for x in (k, v))
    scale, out = q.size(-1) ** -0.5, []
    with torch.autocast(q.device.type, enabled=False):
        for start, end in query_blocks(q.size(-2)):
            # (B, H, end - start, end): this block's queries (positions start..end-1) over keys 0..end-1
            scores = q[..., start:end, :].float() @ k[..., :end, :].float().transpose(-1, -2) * scale
            future = torch.ones(end - start, end, dtype=torch.bool, device=q.device).triu(start + 1)
            probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
            out.append(probs.to(v.dtype) @ v[..., :end, :])  # (B, H, end - start, D)
    return torch.cat(out, dim=-2)


def kernel_name(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> str:
    """The attention kernel a training row of `cfg` gets on `device` in `dtype` (one row: the choice
    does not depend on the batch): SDPA's "FLASH_ATTENTION", "CUDNN_ATTENTION", ...; "flex_attention"
    where a document mask takes flex attention's path (kiln.model.documents); "blockwise_causal" in a
    CPU's compiled step (kiln.config.models.blockwise_attention)."""
    if blockwise_attention(cfg, cuda=device.type == "cuda", compiled=compiled):
        return BLOCKWISE_CAUSAL
    if cfg.document_mask and device.type == "cuda" and cfg.dropout == 0:
        return FLEX_ATTENTION
    q = torch.zeros(1, cfg.n_head, cfg.seq_len, cfg.head_dim, device=device, dtype=dtype)
    kv = torch.zeros(1, cfg.n_kv_head, cfg.seq_len, cfg.head_dim, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, cfg.seq_len, cfg.seq_len, device=device, dtype=dtype) if cfg.document_mask else None
    with sdpa_kernel(SDPA_PRIORITY, set_priority=True):
        choice = torch._fused_sdp_choice(
            q, kv, kv, mask, cfg.dropout, mask is None, enable_gqa=cfg.n_kv_head != cfg.n_head
        )
    return SDPBackend(choice).name
