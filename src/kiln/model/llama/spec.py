"""What config and plan know of Llama's shape, torch-free (kiln.model.registry.Spec): SwiGLU's width
8/3 x 4C rounded up, no learned positions, no biases but Qwen2's on q, k and v (model.qkv_bias),
Llama 3.1's RoPE scaling (model.rope_scaling) checked here, and its counts.

Shapes: C = d_model, K = key/value width n_kv_head x head dim, F = d_ff, H query heads; a = 2 bytes
(bf16 autocast) or 4 (fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.model.registry import Params

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig

SWIGLU_MULTIPLE = 256  # Llama rounds its SwiGLU width up to a multiple of this (multiple_of)
# kiln.config.models.RECIPE_OPTIONS this family builds: every one
OPTIONS = ("qk_norm", "mlp_activation", "zero_init_projections")


def default_d_ff(cfg: ModelConfig) -> int:
    # SwiGLU has three matrices instead of two: 2/3 of 4*d keeps the parameter count of a 4*d MLP.
    hidden = int(2 * 4 * cfg.d_model / 3)
    return -(-hidden // SWIGLU_MULTIPLE) * SWIGLU_MULTIPLE


def default_max_positions(cfg: ModelConfig) -> int | None:
    return None  # RoPE: no table


def problems(cfg: ModelConfig) -> list[str]:
    out = []
    if cfg.head_dim % 2:
        out.append(f"model.n_head: RoPE needs an even head dim, d_model/n_head = {cfg.head_dim}")
    if cfg.bias:
        out.append("model.bias: llama has no biases (q/k/v biases: model.qkv_bias)")
    if cfg.max_positions is not None:
        out.append(f"model.max_positions: {cfg.family} has no learned positions (RoPE covers any seq_len)")
    if cfg.rope_scaling is not None:
        out.extend(cfg.rope_scaling.problems())
    return out


def params(cfg: ModelConfig) -> Params:
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    attn = d * cfg.n_head * hd + 2 * d * cfg.n_kv_head * hd + cfg.n_head * hd * d  # q, k, v, o
    attn += (cfg.n_head + 2 * cfg.n_kv_head) * hd * int(cfg.qkv_bias)  # q, k, v biases
    attn += 2 * hd * int(cfg.qk_norm)  # the query's and key's per-head RMSNorm gains
    mlp = 3 * d * f  # gate, up, down
    norm = d  # RMSNorm gain
    return Params(block=attn + mlp + 2 * norm, final_norm=norm)


def block_weights(cfg: ModelConfig) -> tuple[int, int]:
    """(matmul weights, all parameters); the latter leaves out Qwen2's q/k/v biases, 3 vectors a block."""
    d, f, k = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim
    mat = 2 * d * d + 2 * d * k + 3 * d * f
    return mat, mat + 2 * d + 2 * cfg.head_dim * int(cfg.qk_norm)


def block_activation_bytes(cfg: ModelConfig, bf16: bool, compiled: bool, cuda: bool) -> int:
    """Eager 16C + a(nC + 2C + 2K + 4F): RMSNorm keeps its fp32 input and normalised input (2 x 2 x
    4C); its output is cast once per matmul under autocast (n = 5: q, k, v, gate, up) or kept once in
    fp32 (n = 2); q and the attention output (2C), k and v (2K), SwiGLU's gate, silu, up and product
    (4F). Compiled 4C + a(5C + 2K + 3F): the block input and matmul-sized tensors (kiln.plan.memory).
    The same bytes as transformers' LlamaDecoderLayer (docs/benchmarks.md, "Seed 000's memory")."""
    a = 2 if bf16 else 4
    C, F, K, H = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim, cfg.n_head
    casts = 5 if bf16 else 2
    per_token = 4 * C + a * (5 * C + 2 * K + 3 * F) if compiled else 16 * C + a * (casts * C + 2 * C + 2 * K + 4 * F)
    return per_token + 8 + 4 * H  # two RMSNorms' rstd; log-sum-exp


def final_norm_bytes(cfg: ModelConfig) -> int:
    return 12 * cfg.d_model  # RMSNorm: its input and normalised input, and its output
