"""Scaled dot-product attention with the kernel order set, not left to the torch release.

SDPA picks a kernel per call from the inputs (device, dtype, head dim, mask); which it tries first
is a heuristic that moves between releases (torch 2.11 took cuDNN on an H200 where the pinned 2.13
may not). As torchtitan does (models/common/attention.py), every call here runs under
`sdpa_kernel(SDPA_PRIORITY, set_priority=True)`: cuDNN's fused attention first, then flash, the
memory-efficient kernel, the math fallback. A backend that cannot take the inputs is skipped, so on
a CPU (flash or math) nothing changes. `kernel_name` says which one a shape gets: the smoke stage
records it (smoke/report.json's attention_kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kiln.config.models import ModelConfig

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


def kernel_name(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> str:
    """The SDPA kernel a training row of `cfg` gets on `device` in `dtype` (one row: the choice does
    not depend on the batch): "FLASH_ATTENTION", "CUDNN_ATTENTION", ...; "flex_attention" where a
    document mask takes flex attention's path (kiln.model.documents)."""
    if cfg.document_mask and device.type == "cuda" and cfg.dropout == 0:
        return "flex_attention"
    q = torch.zeros(1, cfg.n_head, cfg.seq_len, cfg.head_dim, device=device, dtype=dtype)
    kv = torch.zeros(1, cfg.n_kv_head, cfg.seq_len, cfg.head_dim, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, cfg.seq_len, cfg.seq_len, device=device, dtype=dtype) if cfg.document_mask else None
    with sdpa_kernel(SDPA_PRIORITY, set_priority=True):
        choice = torch._fused_sdp_choice(
            q, kv, kv, mask, cfg.dropout, mask is None, enable_gqa=cfg.n_kv_head != cfg.n_head
        )
    return SDPBackend(choice).name
