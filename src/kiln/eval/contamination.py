"""13-gram overlap between evaluation sets and the training tokens (GPT-3's contamination check,
on token ids rather than words, so it costs one vectorised pass over train.bin).

Every window of 13 consecutive training token ids is hashed to 64 bits (a polynomial hash in
wrapping uint64 arithmetic) into one sorted array; an eval item is contaminated when any of its
13-grams is in that array. Hash collisions can only over-report, at a rate of about n/2^64.
"""

from __future__ import annotations

import numpy as np

N = 13
_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio)


def ngram_hashes(ids: np.ndarray, n: int = N) -> np.ndarray:
    """uint64 hash of every window of n consecutive ids (len(ids) - n + 1 of them)."""
    ids = np.asarray(ids, dtype=np.uint64)
    if len(ids) < n:
        return np.empty(0, dtype=np.uint64)
    out = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            out = out * _BASE + ids[k : len(ids) - n + 1 + k] + np.uint64(1)
    return out


def train_index(train_ids: np.ndarray, chunk: int = 1 << 24) -> np.ndarray:
    """Sorted unique 13-gram hashes of the training stream, built chunk by chunk (bounded memory
    per chunk; chunks overlap by n-1 ids so no window is lost)."""
    parts = [np.unique(ngram_hashes(train_ids[start : start + chunk + N - 1]))
             for start in range(0, max(len(train_ids) - N + 1, 1), chunk)]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)


def overlap(index: np.ndarray, items: list[list[int]]) -> dict:
    """Share of items with any 13-gram in the index, and share of all their 13-grams found there."""
    hit_items = total = found = 0
    for ids in items:
        hashes = ngram_hashes(np.asarray(ids))
        # binary search in the sorted index (np.isin would re-sort the whole index for every item)
        at = np.searchsorted(index, hashes).clip(max=max(len(index) - 1, 0))
        present = index[at] == hashes if len(index) else np.zeros(len(hashes), dtype=bool)
        total += len(hashes)
        found += int(present.sum())
        hit_items += bool(present.any())
    return {"items": len(items), "contaminated_items": hit_items,
            "contaminated_fraction": hit_items / len(items) if items else None,
            "ngram_overlap": found / total if total else None}
