"""GPT-2 as an nn.Module (nanoGPT's shape): learned positions, pre-LayerNorm blocks, GELU MLP, tied head.

Shapes: B batch, T sequence length, C = d_model, H heads, D = C // H head dim, F = d_ff, V padded vocab.
Weights map one to one onto Hugging Face's GPT2LMHeadModel (kiln.model.gpt2.hf), whose Conv1D layers
store the transpose of ours.

Attention is causal over the whole packed row (`is_causal=True`), so a token may attend to the end
of the previous document in the same row, as in GPT-2, nanoGPT and llm.c: the EOS token between
documents marks the boundary and the model learns to discount what precedes it. With
model.document_mask it attends only within its own document, and the learned positions restart at
each document (kiln.model.documents).

Decoding passes a KVCache (kiln.model.kv_cache): each forward then feeds only the new tokens, which
read their positions and attention mask from the cache and attend over its keys and values.
Without one (training, scoring) the forward is the plain causal one.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from kiln.config.models import ModelConfig
from kiln.model.documents import DocumentMask, positions
from kiln.model.kv_cache import KVCache
from kiln.model.layers import Context, GeluMLP, attend
from kiln.model.loss import chunk_loss_sum, lm_loss


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.blockwise = False  # kiln.model.sdpa.blockwise_causal when compiled (kiln.model.layers.attend)

    def forward(self, x: torch.Tensor, cache: Context | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> 3 x (B, H, T, D)
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = attend(q, k, v, cache, layer, self.dropout if self.training else 0.0, self.blockwise)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.mlp = GeluMLP(cfg)

    def forward(self, x: torch.Tensor, cache: Context | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    family = "gpt2"  # the model.family it builds (kiln.model.registry)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.family != self.family:
            raise ValueError(f"GPT builds the {self.family} family, not {cfg.family}")
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.chunk_loss = chunk_loss_sum  # compiled by kiln.train.parallel.compile_blocks on a compiled run
        self.loss_rows: int | None = None  # rows per loss chunk; the trainer's pick (kiln.plan.memory.loss_rows)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # saves V*C parameters, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2L) so the residual stream's variance
        # does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once (tied weights once). non_embedding leaves out the tables that are
        only looked up, never multiplied: the positions, and the token table unless it is the head.
        That is the N of the 6N FLOPs-per-token estimate."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.wte.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx (B, T) ids -> (logits (B, T, V), None); with targets (B, T), (None, the mean
        cross-entropy), computed in chunks without the logits (kiln.model.loss).
        With a cache, idx holds only the tokens after those cached, and the logits are the last
        position's (B, 1, V): decoding needs no others, and a long batched prefill would otherwise
        hold B*T*V of them."""
        B, T = idx.shape
        if T > self.config.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds the model's {self.config.max_positions} positions")
        documents = DocumentMask.of(self.config, idx) if cache is None else None  # model.document_mask
        if documents is not None:
            pos = positions(documents.docs)  # (B, T): learned positions restart at each document
        else:
            pos = torch.arange(T, device=idx.device) if cache is None else cache.begin(T)  # (T,) or (B, T)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        if cache is None:
            for block in self.blocks:
                x = block(x, documents)
        else:
            for layer, block in enumerate(self.blocks):
                x = block(x, cache, layer)
            cache.commit(T)
            x = x[:, -1:]  # (B, 1, C)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x), None  # (B, T, V); (B, 1, V) with a cache
        # No logits with targets: the chunked loss never holds (B, T, V) of them (kiln.model.loss), and
        # none are returned for a caller to keep alive through backward.
        return None, lm_loss(x, self.lm_head.weight, targets, self.loss_rows, self.chunk_loss)
