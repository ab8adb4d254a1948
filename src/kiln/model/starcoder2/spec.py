"""What config and plan know of StarCoder2's shape, torch-free (kiln.model.registry.Spec): d_ff 4C,
no learned positions, plain RoPE, biases on every Linear but the head when model.bias says (its
LayerNorms always have one), and its counts.

Shapes: C = d_model, K = key/value width n_kv_head x head dim, F = d_ff, H query heads; a = 2 bytes
(bf16 autocast) or 4 (fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.model.registry import Params

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig


def default_d_ff(cfg: ModelConfig) -> int:
    return 4 * cfg.d_model


def default_max_positions(cfg: ModelConfig) -> int | None:
    return None  # RoPE: no table


def problems(cfg: ModelConfig) -> list[str]:
    out = []
    if cfg.head_dim % 2:
        out.append(f"model.n_head: RoPE needs an even head dim, d_model/n_head = {cfg.head_dim}")
    if cfg.max_positions is not None:
        out.append(f"model.max_positions: {cfg.family} has no learned positions (RoPE covers any seq_len)")
    if cfg.qkv_bias:
        out.append("model.qkv_bias: llama only (starcoder2's biases, on every Linear, are model.bias)")
    if cfg.rope_scaling is not None:
        out.append("model.rope_scaling: llama only (starcoder2 computes plain RoPE)")
    return out


def params(cfg: ModelConfig) -> Params:
    d, f, hd, b = cfg.d_model, cfg.d_ff, cfg.head_dim, int(cfg.bias)
    attn = d * cfg.n_head * hd + 2 * d * cfg.n_kv_head * hd + cfg.n_head * hd * d  # q, k, v, o
    attn += ((cfg.n_head + 2 * cfg.n_kv_head) * hd + d) * b  # their biases
    mlp = 2 * d * f + (f + d) * b  # up, down
    norm = 2 * d  # LayerNorm gain and bias
    return Params(block=attn + mlp + 2 * norm, final_norm=norm)


def block_weights(cfg: ModelConfig) -> tuple[int, int]:
    d, f, k, b = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim, int(cfg.bias)
    mat = 2 * d * d + 2 * d * k + 2 * d * f
    return mat, mat + b * (d + 2 * k + d + f + d) + 4 * d  # LayerNorms: gain and bias


def block_activation_bytes(cfg: ModelConfig, bf16: bool, compiled: bool, cuda: bool) -> int:
    """Measured as tests/unit/plan/test_memory.py does for Llama's block (kiln.plan.memory)."""
    a = 2 if bf16 else 4
    C, F, K, H = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim, cfg.n_head
    casts = 6 if bf16 else 4
    per_token = 4 * C + a * (5 * C + 2 * K + 2 * F) if compiled else 8 * C + a * (casts * C + 2 * K + 2 * F)
    return per_token + 16 + 4 * H  # two LayerNorms' mean and rstd; log-sum-exp


def final_norm_bytes(cfg: ModelConfig) -> int:
    return 8 * cfg.d_model  # LayerNorm: its fp32 input, and its output
