"""A pass over a split's flat token file (pretokenize's train.bin) in pieces of a fixed size, for the
eval stage's statistics of the training tokens (the unigram counts, the contamination check).

At seed scale the train split is 10-20B tokens (20-80 GB): anything the size of the split (a copy
of it, its 13-gram hashes) cannot live in an eval job's memory. So each statistic is folded up one
piece at a time, and the pieces are read with plain reads into fresh arrays rather than sliced from a
memory map: the pages of a mapped file, once touched, stay resident in the process (RssFile) for as
long as the map is open, so one pass over a memory-mapped 40 GB split shows 40 GB resident, which
Slurm's per-process RSS accounting and Snakemake's benchmark both count (bench/eval_memory.py
measured the difference: docs/benchmarks.md, "Eval memory at 1x and 4x the train tokens"). Read
pages go to the kernel's page cache, which the process does not hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK = 1 << 22  # tokens per piece: 4M, 8-32 MB read and ~100 MB of hashes at a time


@dataclass(frozen=True)
class TokenFile:
    """A flat file of token ids of one dtype (train.bin, val.bin)."""

    path: Path
    dtype: str

    def __len__(self) -> int:
        return Path(self.path).stat().st_size // np.dtype(self.dtype).itemsize

    def chunks(self, size: int = CHUNK, overlap: int = 0) -> Iterator[np.ndarray]:
        """The file's ids in order, `size` new ids at a time, each piece after the first starting
        with the last `overlap` ids of the one before (so a window of overlap + 1 ids that straddles
        two pieces lies whole in the second). Every piece is a fresh array; none is a view of the file."""
        if size < 1 or overlap < 0:
            raise ValueError(f"chunk size {size} and overlap {overlap}: need size >= 1, overlap >= 0")
        tail = np.empty(0, dtype=self.dtype)
        with open(self.path, "rb") as f:
            while True:
                new = np.fromfile(f, dtype=self.dtype, count=size)
                if not len(new):
                    return
                piece = np.concatenate([tail, new]) if len(tail) else new
                yield piece
                tail = piece[len(piece) - overlap :].copy() if overlap else tail
