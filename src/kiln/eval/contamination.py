"""13-gram overlap between evaluation sets and the training tokens (GPT-3's contamination check,
on token ids rather than words).

Every window of 13 consecutive token ids is hashed to 64 bits (a polynomial hash in wrapping uint64
arithmetic); an eval item is contaminated when any of its 13-grams occurs anywhere in the train split.

The index is built from the eval side, which is small and fixed (the held-out documents, the
infilling problems, the local lm-eval tasks: bounded by pretokenize.val_tokens and the eval
section's counts), and the train split streams past it a piece at a time (kiln.eval.stream),
marking which eval 13-grams it holds. An index of the train split's own 13-grams would be 8 bytes a
token, 80 GB at 10B tokens; this one is 8 bytes an eval 13-gram, plus one piece of the split, however
long the split. The figures are exact, the same as an index of every train 13-gram would give: each
train window is checked, none is sampled. Hash collisions can only over-report, at a rate of about
(eval 13-grams x train windows) / 2^64 in all: ~1e-2 false hits at 10M x 20B.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.data.ngram_hash import ngram_hashes
from kiln.eval.stream import CHUNK, TokenFile

N = 13


def _filter_bits(n_hashes: int) -> int:
    """log2 of the prefilter's size: ~8 slots per eval 13-gram (so ~1 train window in 8 passes it
    to the binary search), within 2^16..2^27 (at most 128 MB)."""
    return int(min(max(math.ceil(math.log2(max(n_hashes, 1) * 8)), 16), 27))


def train_hits(train: TokenFile, queries: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """For each of the sorted unique hashes `queries`, whether any 13-gram of the train split has it:
    one pass over the split, piece by piece (pieces overlap by N - 1 ids, so no window is lost).
    A train window's hash first goes through a table of the queries' top bits (a gather, cheap),
    and only those that pass it are looked up in `queries` (a binary search, dear)."""
    seen = np.zeros(len(queries), dtype=bool)
    if not len(queries):
        return seen
    bits = _filter_bits(len(queries))
    shift = np.uint64(64 - bits)
    table = np.zeros(1 << bits, dtype=bool)
    table[queries >> shift] = True
    for piece in train.chunks(chunk, overlap=N - 1):
        hashes = ngram_hashes(piece, N)
        hashes = hashes[table[hashes >> shift]]
        at = np.searchsorted(queries, hashes).clip(max=len(queries) - 1)
        seen[at[queries[at] == hashes]] = True
    return seen


def overlaps(train: TokenFile, sets: dict[str, list[list[int]]], chunk: int = CHUNK) -> dict[str, dict]:
    """{set name: overlap figures (see _figures)} of each eval set (items as token ids) against the
    train split, every set in the same single pass over the split."""
    hashed = {name: [ngram_hashes(np.asarray(ids), N) for ids in items] for name, items in sets.items()}
    every = [h for items in hashed.values() for h in items]
    queries = np.unique(np.concatenate(every)) if every else np.empty(0, dtype=np.uint64)
    seen = train_hits(train, queries, chunk)
    return {name: _figures(items, queries, seen) for name, items in hashed.items()}


def _figures(items: list[np.ndarray], queries: np.ndarray, seen: np.ndarray) -> dict:
    """Share of items with any 13-gram in the train split, and share of all their 13-grams found there."""
    hit_items = total = found = 0
    for hashes in items:
        present = seen[np.searchsorted(queries, hashes)]  # every item hash is in queries
        total += len(hashes)
        found += int(present.sum())
        hit_items += bool(present.any())
    return {
        "items": len(items),
        "contaminated_items": hit_items,
        "contaminated_fraction": hit_items / len(items) if items else None,
        "ngram_overlap": found / total if total else None,
    }
