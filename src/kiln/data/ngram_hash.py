"""64-bit hashes of every window of n consecutive ids: the n-gram index of the eval stage's
contamination check (token ids, kiln.eval.contamination) and of the held-out split's decontamination
(word ids, kiln.data.heldout). A polynomial hash in wrapping uint64 arithmetic: the same in every
process, on every machine.
"""

from __future__ import annotations

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio)


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of every window of n consecutive ids (len(ids) - n + 1 of them)."""
    ids = np.asarray(ids, dtype=np.uint64)
    if len(ids) < n:
        return np.empty(0, dtype=np.uint64)
    out = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):  # in place: one array of hashes, not a temporary per operation
            np.multiply(out, _BASE, out=out)
            out += ids[k : len(ids) - n + 1 + k]
            out += np.uint64(1)
    return out
