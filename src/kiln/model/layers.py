"""Layers more than one family builds from: rotary positions (RoPE), grouped-query attention with RoPE
(llama, starcoder2) and GPT-2's GELU MLP (gpt2, starcoder2). What only one family has stays in its
module.py (GPT-2's fused attention, Llama's SwiGLU).

Shapes: B batch, T sequence length, C = d_model, H query heads, K key/value heads (H % K == 0),
D = C // H head dim, F = d_ff.

RoPE here rotates the two halves of each head (Hugging Face's `rotate_half`), not interleaved pairs
(Meta's reference code), so weights map onto transformers' classes without permuting q and k
(kiln.model.<family>.hf). Decoding with a KVCache rotates each new query and key at its absolute
position before the key is cached.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.config.models import ModelConfig, RopeScaling
from kiln.model.documents import DocumentMask
from kiln.model.kv_cache import KVCache
from kiln.model.sdpa import blockwise_causal, sdpa


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """The (D/2,) rotation frequencies theta^(-2i/D); with Llama 3.1's scaling, the low ones slowed.

    Llama 3.1 was pretrained at 8k positions with plain RoPE, then stretched to 128k: a frequency
    whose wavelength (2*pi/freq) exceeds original/low_freq_factor positions never completed a turn
    in pretraining, so it is divided by `factor`; one whose wavelength is below original/high_freq_factor
    turned many times and is kept (local order); between the two, a linear blend in
    original/wavelength. Transformers' _compute_llama3_parameters, written as one clamped blend."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (D/2,)
    if scaling is None:
        return inv_freq
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq  # (D/2,) positions per turn
    # 1 where the frequency is kept, 0 where it is divided by factor, linear between
    keep = ((scaling.original_max_position_embeddings / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - keep) * inv_freq / scaling.factor + keep * inv_freq


def rope_tables(
    head_dim: int, seq_len: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, D) of position t times each frequency (rope_frequencies), each half of D repeated."""
    inv_freq = rope_frequencies(head_dim, theta, scaling)  # (D/2,)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, T, D) by position: pairs (x_i, x_{i+D/2}) turn by angle t*freq_i. cos and
    sin are (T, D), or (B, 1, T, D) when each row has its own positions."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


# What a block's attention reads besides q, k and v (its `cache` argument): a KVCache when decoding, a
# DocumentMask in a packed row's forward under model.document_mask; None: causal over the whole row.
Context = KVCache | DocumentMask


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: Context | None,
    layer: int,
    dropout: float,
    blockwise: bool = False,
) -> torch.Tensor:
    """Causal attention of (B, H, T, D) queries over (B, K, T, D) keys and values, K dividing H, the
    way every family computes it: over the whole row (no cache); within each document of a packed row
    (a DocumentMask, model.document_mask); or over a KVCache's slots when decoding, which stores k and
    v first. blockwise (the attention module's, set by kiln.train.parallel.compile_blocks on a CPU):
    a whole row's attention in a graph being compiled is kiln.model.sdpa.blockwise_causal."""
    # enable_gqa: each group of H/K query heads reads one key/value head without copying it
    gqa = k.size(1) != q.size(1)
    if cache is None:
        if blockwise and torch.compiler.is_compiling():  # set only without dropout (blockwise_attention)
            return blockwise_causal(q, k, v)
        return sdpa(q, k, v, is_causal=True, enable_gqa=gqa, dropout_p=dropout)
    if isinstance(cache, DocumentMask):
        return cache.attend(q, k, v, dropout)
    k, v = cache.update(layer, k, v)  # (B, K, S, D): every slot so far, these T included
    return sdpa(q, k, v, attn_mask=cache.mask, is_causal=cache.is_causal, enable_gqa=gqa)


class Attention(nn.Module):
    """Grouped-query attention with RoPE: q, k, v and o projections (Llama's, StarCoder2's). With
    model.qk_norm, each head's query and key pass an RMSNorm over the head dim before RoPE, one gain
    shared by the heads (OLMo 2's and Qwen3's q_norm and k_norm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qkv_bias = cfg.qkv_bias or cfg.bias  # Qwen2: q, k, v only; StarCoder2 (model.bias): o too
        self.q = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=qkv_bias)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=qkv_bias)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=qkv_bias)
        self.o = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.qk_norm = cfg.qk_norm
        self.dropout = cfg.dropout
        self.blockwise = False  # kiln.model.sdpa.blockwise_causal when compiled (attend)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Context | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim)  # (B, T, H, D)
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim)  # (B, T, K, D)
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, K, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attend(q, k, v, cache, layer, self.dropout if self.training else 0.0, self.blockwise)
        return self.o(y.transpose(1, 2).reshape(B, T, C))  # (B, H, T, D) -> (B, T, C)


class GeluMLP(nn.Module):
    """GPT-2's MLP (and StarCoder2's): up to F, tanh GELU, down to C, biases where model.bias says."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> (B, T, F) -> (B, T, C); tanh GELU is GPT-2's "gelu_new"
        return self.dropout(self.down(F.gelu(self.up(x), approximate="tanh")))
