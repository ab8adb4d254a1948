"""Document-aware attention in packed rows (model.document_mask).

A training row packs documents back to back, each ended by the end-of-text token (EOS). Kiln's
default is plain causal attention over the whole row (`is_causal=True`, as GPT-2, nanoGPT and llm.c
train): a token may attend to the end of the previous document in its row. With model.document_mask
each token attends only to the earlier tokens of its own document (block-causal). A token's document
is the number of EOS strictly before it, so an EOS belongs to the document it ends (torchtitan's
get_document_mask_mod counts the same way); a row's first document may have begun in the row before,
and its last may be cut by the row's end: each is attended to as far as the row holds it.

Two ways to compute it, with the same result:
- dense: a (B, 1, T, T) additive mask (0 where a query may attend, -inf where not), built once per
  forward in the dtype the attention computes in and shared by every layer. Handed a boolean mask,
  SDPA converts it to this per call and keeps each layer's copy for backward; built once, autograd
  keeps the one tensor. Any device and kernel, attention dropout included: what the CPU runs.
- flex (a GPU, no attention dropout): flex attention's BlockMask (torch.nn.attention.flex_attention),
  the mask as 128 x 128 tiles where a tile wholly across documents is skipped and one wholly inside a
  document needs no mask: a few KiB per row where the dense mask is T^2 elements (128 MiB a row at
  8k in bf16), and one compiled kernel. flex_attention is compiled here unless the blocks already
  are (train.compile), and run compiled even where the caller turned compiling off
  (`torch.compiler.set_stance("force_eager")`: the smoke gate's validations, sampling): flex's eager
  path materialises the scores, (B, H, T, T) fp32, 51.5 GB at seed 000's 6 x 32 x 8192^2.

Positions: RoPE is relative, so a document's scores are the same at any offset in the row, and its
positions are left as they are (torchtitan does not restart them by default either). gpt2's learned
positions are absolute: they restart at 0 at each document (`positions`), so a document reads the
rows it reads when alone. Either way a packed row computes each of its documents exactly as that
document alone would, to rounding (tests/unit/model/test_documents.py).

KV-cached decoding does not use it: a prompt is one document.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from kiln.config.models import ModelConfig
from kiln.errors import KilnError
from kiln.model.sdpa import sdpa

_compiled_flex = None  # torch.compile(flex_attention), made on first use: one compiled kernel per process
_flex_devices = frozenset({"cuda"})  # device types whose document mask is flex's (kiln.rehearse adds the CPU)


def document_ids(idx: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) ids -> (B, T) int32: each token's document within its row, the count of EOS before it."""
    ends = (idx == eos_id).to(torch.int32)
    return ends.cumsum(dim=1) - ends  # exclusive: an EOS is still in the document it ends


def positions(docs: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> (B, T) long: each token's position within its document (0 at its first)."""
    T = docs.size(1)
    t = torch.arange(T, device=docs.device).expand_as(docs)
    first = torch.ones_like(docs, dtype=torch.bool)
    first[:, 1:] = docs[:, 1:] != docs[:, :-1]
    start = torch.where(first, t, 0).cummax(dim=1).values  # the index of the token's document's first token
    return t - start


def require_eos(cfg: ModelConfig) -> None:
    """A KilnError unless a model with model.document_mask knows the token its documents end with."""
    if cfg.document_mask and cfg.eos_id is None:
        raise KilnError(
            "model.document_mask: the end-of-text id is unknown (kiln.config.models.model_config got none); "
            "a run reads it from its shards' manifest.json (kiln.data.shards.row_model)"
        )


def takes_flex(device: torch.device) -> bool:
    """Whether rows on `device` take flex's block mask (a GPU), not the dense one."""
    return device.type in _flex_devices


@contextlib.contextmanager
def flex_on(device_type: str):
    """Within it, rows on device_type take flex's branch too: kiln.rehearse runs a GPU's step on fake
    CPU tensors, and the GPU's attention with it."""
    global _flex_devices
    before = _flex_devices
    _flex_devices = before | {device_type}
    try:
        yield
    finally:
        _flex_devices = before


def compiled_flex():
    """flex_attention compiled, once per process, run compiled whatever stance its caller set: a
    force_eager stance would turn this compile off too, and flex would take its eager path, which
    materialises the scores (tests/unit/model/test_documents.py; kiln.rehearse charges that path)."""
    global _compiled_flex
    if _compiled_flex is None:
        kernel = torch.compile(flex_attention)

        @functools.wraps(flex_attention)
        def run(*args, **kwargs):
            with torch.compiler.set_stance("default"):
                return kernel(*args, **kwargs)

        _compiled_flex = run
    return _compiled_flex


class DocumentMask:
    """What the attention reads for one forward of packed rows: the dense mask or the block mask. It
    takes the place a KVCache takes when decoding (a block's `cache` argument), and the attention
    reads it the same way (kiln.model.layers.attend)."""

    def __init__(self, idx: torch.Tensor, eos_id: int, dtype: torch.dtype, flex: bool):
        B, T = idx.shape
        self.docs = document_ids(idx, eos_id)  # (B, T)
        self.dense: torch.Tensor | None = None
        self.block: BlockMask | None = None
        if flex:
            docs = self.docs

            def same_document(b, h, q, kv):
                return (docs[b, q] == docs[b, kv]) & (q >= kv)

            self.block = create_block_mask(same_document, B, None, T, T, device=idx.device, _compile=idx.is_cuda)
        else:
            t = torch.arange(T, device=idx.device)
            allowed = (self.docs[:, :, None] == self.docs[:, None, :]) & (t[:, None] >= t[None, :])  # (B, T, T)
            self.dense = torch.zeros(B, 1, T, T, dtype=dtype, device=idx.device)
            self.dense.masked_fill_(~allowed[:, None], float("-inf"))

    @classmethod
    def of(cls, cfg: ModelConfig, idx: torch.Tensor) -> DocumentMask | None:
        """The mask of a forward over rows idx (B, T) when the model has model.document_mask, else None.
        Dense in the dtype the attention runs in (autocast's, else torch's default: the weights'); flex
        on a GPU unless the model has attention dropout."""
        if not cfg.document_mask:
            return None
        require_eos(cfg)
        kind = idx.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else torch.get_default_dtype()
        return cls(idx, cfg.eos_id, dtype, flex=takes_flex(idx.device) and cfg.dropout == 0)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> torch.Tensor:
        """(B, H, T, D) queries over (B, K, T, D) keys and values, each within its document."""
        gqa = k.size(1) != q.size(1)
        if self.block is None:
            return sdpa(q, k, v, attn_mask=self.dense.to(q.dtype), dropout_p=dropout, enable_gqa=gqa)
        # inside a compiled block flex is traced into the block's graph; outside, its own compiled kernel
        flex = flex_attention if torch.compiler.is_compiling() else compiled_flex()
        return flex(q, k, v, block_mask=self.block, enable_gqa=gqa)
