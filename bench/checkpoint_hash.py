"""Rank 0's full-format checkpoint write: torch.save to the path and then hashing the file read back
(what kiln.train.checkpoint does) against hashing state.pt as it is written, through a stream that
hashes what passes (issue 29's S8, "hash beside the write", measured here and not adopted: torch
writes a stream slower than a path, and the sha256 is the same work either way; the file read back
comes from the page cache that has just written it). Alternating rounds, the same state.

    python bench/checkpoint_hash.py                 # 2 GiB of fp32 tensors, 3 rounds each way
    python bench/checkpoint_hash.py --mib 256 --rounds 5
    python bench/checkpoint_hash.py --quick         # tests/test_bench.py

Between rounds the file is deleted and the page cache asked to drop it (posix_fadvise DONTNEED).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kiln.io import fsync_path, sha256_file


class HashingWriter:
    """A binary file that hashes what is written through it."""

    def __init__(self, file):
        self.file, self.digest = file, hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def save_then_hash(state: dict, path: Path) -> str:
    torch.save(state, path)
    fsync_path(path)
    _drop_cache(path)
    return sha256_file(path)


def save_hashing(state: dict, path: Path) -> str:
    with open(path, "wb") as f:
        written = HashingWriter(f)
        torch.save(state, written)
    fsync_path(path)
    return written.digest.hexdigest()


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2048, help="state size, MiB of fp32 tensors")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 1 round: the table only")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.rounds = 8, 1
    tensors = max(1, args.mib // 64)  # 64 MiB tensors, as a model's and optimizer's are many
    state = {f"t{i}": torch.randn(args.mib * 2**18 // tensors) for i in range(tensors)}
    times: dict[str, list[float]] = {"Kiln: save, then read back and hash": [], "hash as written": []}
    with tempfile.TemporaryDirectory(prefix="kiln-ckpt-hash-") as tmp:
        path = Path(tmp) / "state.pt"
        right = True  # each way's hash is its file's (torch writes a path and a stream a few bytes apart)
        for _ in range(args.rounds):
            for name, fn in zip(times, (save_then_hash, save_hashing)):
                start = time.perf_counter()
                digest = fn(state, path)
                times[name].append(time.perf_counter() - start)
                right &= digest == sha256_file(path)
                _drop_cache(path)
                path.unlink()
    print(f"| write | s (median of {args.rounds}) | GiB/s |\n|---|---:|---:|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.2f} | {args.mib / 1024 / median:.2f} |")
    before, after = (statistics.median(s) for s in times.values())
    print(
        f"\nKiln / hash as written: {before / after:.2f}x (above 1: hashing as written is faster); "
        f"each hash is its file's: {right}"
    )


if __name__ == "__main__":
    main()
