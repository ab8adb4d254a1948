"""Held-out language-modelling metrics, and the unigram baseline every trained model must beat.

Loss is the mean next-token cross-entropy (nats) over validation rows. Bits per byte divides the
total bits by the UTF-8 bytes the tokens stand for, which makes models with different tokenizers
comparable: bpb = loss / ln 2 * tokens / bytes.

Per source (`range_loss`, `source_ranges`): the pretokenize stage writes val.bin source after source
and records each source's [start, end) token range, docs, tokens and bytes (meta.json `val_sources`);
a source's loss is measured on rows of seq_len + 1 tokens cut back to back from its own range, as
the shard stage cuts the whole split, and its bits per byte use its own tokens/bytes ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from kiln.data.loader import ShardRows, eval_batches
from kiln.errors import KilnError
from kiln.eval.stream import CHUNK, TokenFile

BATCH = 16  # held-out rows a batch: the model's val loss and the unigram baseline read the same batches


@torch.no_grad()
def batches_loss(model: torch.nn.Module, batches: Iterable[torch.Tensor]) -> tuple[float, int]:
    """(mean loss, number of target tokens) over batches of rows (B, T + 1): inputs row[:-1],
    targets row[1:]."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    for batch in batches:
        batch = batch.to(device)  # (B, T + 1)
        # With targets the model returns the loss of training's chunked head (kiln.model.loss): the
        # (B, T, V) logits and their fp32 copy never exist (16 rows of 8192 tokens over a 32k
        # vocabulary: 8 GiB of bf16 logits, 16 of fp32), and under a GPU's bf16 autocast each chunk
        # is computed as training computes it (bf16 logits, loss in fp32).
        _, loss = model(batch[:, :-1], batch[:, 1:])
        total += loss.item() * batch[:, 1:].numel()
        n += batch[:, 1:].numel()
    return total / n, n


def val_rows_loss(model: torch.nn.Module, rows: ShardRows, micro_batch: int, max_batches: int) -> tuple[float, int]:
    """(mean loss, number of target tokens) over at most max_batches batches of the val split."""
    return batches_loss(model, eval_batches(rows, micro_batch, max_batches))


def unigram_counts(train: TokenFile, vocab_size: int, chunk: int = CHUNK) -> np.ndarray:
    """How often each id occurs in the train split: (vocab_size,) int64, exactly np.bincount's, counted a
    piece at a time (kiln.eval.stream) so memory is the vocabulary's and one piece's, not the split's
    (np.bincount of the whole split first copies it to int64: 8 bytes a token, 80 GB at 10B tokens)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for piece in train.chunks(chunk):
        found = np.bincount(piece, minlength=vocab_size)
        if len(found) > vocab_size:
            raise KilnError(
                f"{train.path}: token id {len(found) - 1} is outside the padded vocabulary of "
                f"{vocab_size} (meta.json padded_vocab_size): the token folder and its meta.json disagree"
            )
        counts += found
    return counts


def unigram_loss(train: TokenFile, rows: ShardRows, vocab_size: int, micro_batch: int, max_batches: int) -> float:
    """Cross-entropy on the same val targets of a unigram model fit to the train split
    (add-one smoothed): the loss of a model that has learnt token frequencies and nothing else."""
    counts = unigram_counts(train, vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for batch in eval_batches(rows, micro_batch, max_batches):
        targets = batch[:, 1:].numpy().ravel()
        total -= log_probs[targets].sum()
        n += len(targets)
    return total / n


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    return loss / math.log(2) * tokens / n_bytes


def source_ranges(meta: dict) -> dict[str, dict]:
    """{source: {start, end, docs, tokens, bytes}} of the val split, for the sources that hold
    validation tokens, in val.bin order. From meta.json's `val_sources`; for a token folder written
    before it existed, derived from the per-source val counts (val.bin then already held the sources
    one after another, in the same order)."""
    if "val_sources" in meta:
        ranges = meta["val_sources"]
    else:
        ranges, at = {}, 0
        for name, src in meta["sources"].items():
            ranges[name] = {"start": at, "end": at + src["val"]["tokens"], **src["val"]}
            at += src["val"]["tokens"]
    return {name: dict(r) for name, r in ranges.items() if r["end"] > r["start"]}


def range_rows(tokens: np.ndarray, start: int, end: int, row_len: int, max_rows: int) -> Iterator[np.ndarray]:
    """Rows of row_len tokens cut back to back from tokens[start:end], at most max_rows of them. The
    tokens after the last full row make one shorter row when the cap leaves room for it (so a range
    shorter than a row is still measured); fewer than 2 tokens hold no target and are left out."""
    n_full = (end - start) // row_len
    for r in range(min(n_full, max_rows)):
        yield tokens[start + r * row_len : start + (r + 1) * row_len]
    tail = start + n_full * row_len
    if n_full < max_rows and end - tail >= 2:
        yield tokens[tail:end]


def range_loss(
    model: torch.nn.Module, tokens: np.ndarray, start: int, end: int, seq_len: int, micro_batch: int, max_batches: int
) -> tuple[float, int]:
    """(mean loss, number of target tokens) of model on tokens[start:end] (val.bin as a memmap, say),
    in non-overlapping rows of seq_len + 1 tokens batched by micro_batch, at most max_batches
    batches' worth of rows."""
    if end - start < 2:
        raise ValueError(f"range [{start}, {end}) holds no target token")
    return batches_loss(model, _range_batches(tokens, start, end, seq_len, micro_batch, max_batches))


def _range_batches(
    tokens: np.ndarray, start: int, end: int, seq_len: int, micro_batch: int, max_batches: int
) -> Iterator[torch.Tensor]:
    """range_rows stacked micro_batch at a time (the shorter tail row in a batch of its own)."""
    batch: list[np.ndarray] = []
    for row in range_rows(tokens, start, end, seq_len + 1, max_batches * micro_batch):
        if batch and (len(batch) == micro_batch or len(row) != len(batch[0])):
            yield torch.from_numpy(np.stack(batch).astype(np.int64))
            batch = []
        batch.append(np.asarray(row))
    if batch:
        yield torch.from_numpy(np.stack(batch).astype(np.int64))
