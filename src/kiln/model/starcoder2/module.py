"""StarCoder2 (Lozhkov et al. 2024, "StarCoder 2 and The Stack v2") as an nn.Module: Llama's attention
(RoPE, grouped-query) in a GPT-2-style block, LayerNorm and a GELU MLP, with biases on every Linear but
the head (config.bias: transformers' use_bias) and on every LayerNorm. It is seed 000's target shape,
and the family bigcode's checkpoints import as (kiln.config.hf_source).

Shapes: B batch, T sequence length, C = d_model, F = d_ff (StarCoder2: 4C). Parameter names follow
Llama's blocks (attn_norm, attn.q/k/v/o, mlp_norm) and GPT-2's MLP (mlp.up, mlp.down), and map onto
Starcoder2ForCausalLM's in kiln.model.starcoder2.hf. The published checkpoints attend within a sliding
window (4,096 positions); Kiln's full causal attention equals it up to that length, which
config.sliding_window enforces.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from kiln.config.models import ModelConfig
from kiln.model.decoder import RopeDecoder
from kiln.model.layers import Attention, Context, GeluMLP


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x)); the LayerNorms keep their bias
    whatever config.bias says, as StarCoder2's do."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = GeluMLP(cfg)  # (B, T, C) -> (B, T, F) -> tanh GELU -> (B, T, C)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Context | None = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class StarCoder2(RopeDecoder):
    """The shared RoPE decoder's embedding, tables, forward, init and KV-cache decoding, with
    StarCoder2's block and a final LayerNorm (with bias)."""

    family = "starcoder2"
    block = Block
    final_norm = nn.LayerNorm
