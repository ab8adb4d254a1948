"""What config and plan know of GPT-2's shape, torch-free (kiln.model.registry.Spec): d_ff 4C,
learned positions (seq_len rows unless max_positions says), one key/value head per head, biases
optional (model.bias: every Linear and LayerNorm), and its counts.

Shapes: C = d_model, F = d_ff, H heads, T = seq_len; a = 2 bytes (bf16 autocast) or 4 (fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.model.registry import Params

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig


def default_d_ff(cfg: ModelConfig) -> int:
    return 4 * cfg.d_model


def default_max_positions(cfg: ModelConfig) -> int | None:
    return cfg.seq_len


def problems(cfg: ModelConfig) -> list[str]:
    out = []
    if cfg.n_kv_head != cfg.n_head:
        out.append(f"model.n_kv_head: gpt2 has one key/value head per head ({cfg.n_head}), got {cfg.n_kv_head}")
    if cfg.seq_len > cfg.max_positions:
        out.append(
            f"model.max_positions: {cfg.max_positions} learned positions cannot cover shard.seq_len={cfg.seq_len}"
        )
    if cfg.qkv_bias:
        out.append("model.qkv_bias: llama only (gpt2's biases are model.bias)")
    if cfg.rope_scaling is not None:
        out.append("model.rope_scaling: llama only (gpt2 has learned positions)")
    return out


def params(cfg: ModelConfig) -> Params:
    d, f, b = cfg.d_model, cfg.d_ff, int(cfg.bias)
    attn = d * 3 * d + 3 * d * b + d * d + d * b  # qkv, proj
    mlp = d * f + f * b + f * d + d * b  # up, down
    norm = d + d * b  # LayerNorm gain (and bias)
    return Params(block=attn + mlp + 2 * norm, final_norm=norm, positions=cfg.max_positions * d)


def block_weights(cfg: ModelConfig) -> tuple[int, int]:
    d, f, b = cfg.d_model, cfg.d_ff, int(cfg.bias)
    mat = 4 * d * d + 2 * d * f
    return mat, mat + b * (3 * d + d + f + d) + 2 * d * (1 + b)


def block_activation_bytes(cfg: ModelConfig, bf16: bool, compiled: bool, cuda: bool) -> int:
    """Eager 8C + a(6C + 2F): the fp32 residual stream before each LayerNorm (2 x 4C); both LayerNorm
    outputs, q|k|v, the attention output, the MLP's two F-wide tensors. Compiled 4C + a(7C + 2F):
    inductor's min-cut partitioner keeps the block input and matmul-sized tensors, recomputing norms
    and pointwise ops (kiln.plan.memory)."""
    a = 2 if bf16 else 4
    C, F, H = cfg.d_model, cfg.d_ff, cfg.n_head
    per_token = 4 * C + a * (7 * C + 2 * F) if compiled else 8 * C + a * (6 * C + 2 * F)
    per_token += 16 + 4 * H  # two LayerNorms' mean and rstd; attention's log-sum-exp
    if cfg.dropout > 0 and not compiled:
        per_token += 2 * C  # the two residual dropouts' bool masks (compiled: regenerated from a seed)
    if cfg.dropout > 0 and not cuda:
        # SDPA's CPU kernels have no dropout: its math fallback keeps the (B, H, T, T) attention
        # weights, their mask and the dropped weights (measured: ~13 bytes an entry eager, ~8
        # compiled); flash on a GPU draws the mask inside the kernel and keeps none of it.
        per_token += (8 if compiled else 13) * H * cfg.seq_len
    return per_token


def final_norm_bytes(cfg: ModelConfig) -> int:
    return 8 * cfg.d_model  # LayerNorm: its fp32 input, and its output
