"""Llama 3 as an nn.Module: RMSNorm, rotary positions (RoPE), grouped-query attention, SwiGLU MLP.

Shapes: B batch, T sequence length, C = d_model, F = d_ff; the attention, RoPE and the decoder around
the blocks are shared with starcoder2 (kiln.model.layers, kiln.model.decoder). Weights map onto
LlamaForCausalLM (Qwen2ForCausalLM with model.qkv_bias) without permuting q and k (kiln.model.llama.hf).

Two options exist for continuing stock checkpoints (kiln.config.hf_source), both off by default: Llama 3.1's
RoPE frequency scaling (config.rope_scaling) and biases on the query, key and value projections
(config.qkv_bias: Qwen2 and Qwen2.5, otherwise Llama's shape).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.config.models import ModelConfig
from kiln.model.decoder import RopeDecoder
from kiln.model.layers import Attention, Context


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (Primer; modded-nanogpt's MLP), transformers' hidden_act "relu2"."""
    return F.relu(x).square()


ACTIVATIONS = {"silu": F.silu, "relu2": relu2}  # model.mlp_activation


class SwiGLU(nn.Module):
    """Llama's gated MLP, down(act(gate(x)) * up(x)): SiLU (SwiGLU) unless model.mlp_activation says relu2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.act = ACTIVATIONS[cfg.mlp_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))  # (B, T, C) -> (B, T, F) -> (B, T, C)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Context | None = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class Llama(RopeDecoder):
    family = "llama"
    block = Block
    final_norm = nn.RMSNorm
