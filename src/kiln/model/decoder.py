"""The decoder the RoPE families share (llama, starcoder2): token embedding, rotary tables, a stack of
blocks, a final norm and the head, GPT-2's initialisation, the chunked loss and KV-cache decoding. A
family subclasses RopeDecoder with its block and final norm (kiln.model.llama.module,
kiln.model.starcoder2.module); the block is called as block(x, cos, sin, cache, layer).

Shapes: B batch, T sequence length, C = d_model, D head dim, V padded vocab.

Attention is causal over the whole packed row, as in kiln.model.gpt2.module: a token may attend to the
end of the previous document in the same row, the EOS between them marking the boundary. With
model.document_mask it attends only within its own document (kiln.model.documents), and the blocks
get the mask where a KVCache goes when decoding; RoPE positions are left as they are.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from kiln.config.models import ModelConfig
from kiln.model.documents import DocumentMask
from kiln.model.kv_cache import KVCache
from kiln.model.layers import rope_tables
from kiln.model.loss import chunk_loss_sum, lm_loss


class RopeDecoder(nn.Module):
    family = ""  # the model.family a subclass builds (kiln.model.registry)
    block: type[nn.Module]  # called as block(x, cos, sin, cache, layer); cache may be a DocumentMask
    final_norm: type[nn.Module] = nn.RMSNorm  # built as final_norm(d_model, eps=norm_eps)

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
        self.loss_rows: int | None = None  # rows per loss chunk; the trainer's pick (kiln.plan.memory.loss_rows)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        # Derived from the config, so not saved (persistent=False) and rebuilt on every load.
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's scheme (normal 0.02; residual projections 0.02/sqrt(2L), or zero with
        model.zero_init_projections); norm gains 1, biases 0."""
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() < 2:
                nn.init.ones_(p)
            elif name.endswith(("attn.o.weight", "mlp.down.weight")) and self.config.zero_init_projections:
                nn.init.zeros_(p)
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
            documents = DocumentMask.of(self.config, idx)  # None unless model.document_mask
            for block in self.blocks:
                x = block(x, cos, sin, documents)
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
        return None, lm_loss(x, self.lm_head.weight, targets, self.loss_rows, self.chunk_loss)
