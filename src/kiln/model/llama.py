"""Llama 3 in one file: RMSNorm, rotary positions (RoPE), grouped-query attention, SwiGLU MLP.

Shapes: B batch, T sequence length, C = d_model, H query heads, K key/value heads (H % K == 0),
D = C // H head dim, F = d_ff, V padded vocab.

RoPE here rotates the two halves of each head (Hugging Face's `rotate_half`), not interleaved pairs
(Meta's reference code), so weights map onto LlamaForCausalLM without permuting q and k
(kiln.hf). Attention is causal over the packed row, as in kiln.model.gpt; decoding with a
KVCache works as there too, RoPE rotating each new query and key at its absolute position before
the key is cached.

Two options exist for continuing stock checkpoints (kiln.config.hf_source), both off by default: Llama 3.1's
RoPE frequency scaling (config.rope_scaling) and biases on the query, key and value projections
(config.qkv_bias: Qwen2 and Qwen2.5, otherwise Llama's shape). StarCoder2 (kiln.model.starcoder2) is
this model with another block and final norm; its biases (config.bias) reach the output projection too.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.config.models import ModelConfig, RopeScaling
from kiln.model.kv_cache import KVCache
from kiln.model.loss import chunk_loss_sum, lm_loss


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qkv_bias = cfg.qkv_bias or cfg.bias  # Qwen2: q, k, v only; StarCoder2 (model.bias): o too
        self.q = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=qkv_bias)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=qkv_bias)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=qkv_bias)
        self.o = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa: each group of H/K query heads reads one key/value head without copying it
        gqa = self.n_kv_head != self.n_head
        if cache is None:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=gqa, dropout_p=self.dropout if self.training else 0.0
            )
        else:
            k, v = cache.update(layer, k, v)  # (B, K, S, D): every slot so far, these T included
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.mask, is_causal=cache.is_causal, enable_gqa=gqa)
        return self.o(y.transpose(1, 2).reshape(B, T, C))  # (B, H, T, D) -> (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (B, T, C) -> (B, T, F) -> (B, T, C)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    family = "llama"
    block = Block  # a subclass with another block (kiln.model.starcoder2) changes these two
    final_norm = nn.RMSNorm

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.family != self.family:
            raise ValueError(f"{type(self).__name__} builds the {self.family} family, not {cfg.family}")
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(self.block(cfg) for _ in range(cfg.n_layer))
        self.norm = self.final_norm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.chunk_loss = chunk_loss_sum  # compiled by kiln.train.parallel.compile_blocks on a compiled run
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        # Derived from the config, so not saved (persistent=False) and rebuilt on every load.
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's scheme (normal 0.02; residual projections 0.02/sqrt(2L)); norm gains 1, biases 0."""
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() < 2:
                nn.init.ones_(p)
            elif name.endswith(("attn.o.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once (tied weights once); non_embedding leaves out the token table
        when it is only looked up (untied), the N of the 6N FLOPs-per-token estimate."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and not self.config.tie_embeddings:
            n -= self.wte.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx (B, T) ids -> (logits (B, T, V), None); with targets (B, T), (None, the mean
        cross-entropy), computed in chunks without the logits (kiln.model.loss).
        With a cache, idx holds only the tokens after those cached, and the logits are the last
        position's (B, 1, V), as in GPT.forward."""
        B, T = idx.shape
        if T > self.config.seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds the model's {self.config.seq_len} positions")
        x = self.wte(idx)  # (B, T, C)
        if cache is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, D)
            for block in self.blocks:
                x = block(x, cos, sin)
        else:
            pos = cache.begin(T)  # (B, T)
            cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]  # (B, 1, T, D)
            for layer, block in enumerate(self.blocks):
                x = block(x, cos, sin, cache, layer)
            cache.commit(T)
            x = x[:, -1:]  # (B, 1, C)
        x = self.norm(x)
        if targets is None:
            return self.lm_head(x), None  # (B, T, V); (B, 1, V) with a cache
        # No logits with targets: the chunked loss never holds (B, T, V) of them (kiln.model.loss), and
        # none are returned for a caller to keep alive through backward.
        return None, lm_loss(x, self.lm_head.weight, targets, chunk_loss=self.chunk_loss)
