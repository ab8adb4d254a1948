"""Peak resident memory of the eval stage's passes over the train split (the unigram baseline and the
13-gram contamination check) at 1x and 4x the train tokens, each in a fresh child process.

    python bench/eval_memory.py                              # 1x = 1 GiB of uint16 ids (512M tokens), 4x = 4 GiB
    python bench/eval_memory.py --gib 0.25 --old-gib 0.0625  # smaller; the old code at 1/16 GiB and 1/4 GiB
    python bench/eval_memory.py --quick     # 128 KiB, 1x only, old code too, one child: tests/bench/test_bench.py

The synthetic split is what pretokenize writes and eval reads: train.bin, flat ids (uint16 below
65,536 ids), drawn at random over GPT-2's padded 50,304 ids, written under --dir (default /tmp);
beside it a small val shard folder in the shard stage's format (the unigram loss is measured on its
rows) and the eval sets (400 items of 1,000 tokens, a tenth of them cut from train.bin, so
contaminated). Each (size, implementation, part) runs in its own child, so ru_maxrss is that run's
peak; `rss_start` is the child's resident set after its imports, before the part runs.

Implementations:
  new   the eval stage's own functions: kiln.eval.perplexity.unigram_loss (counts streamed with plain
        reads, kiln.eval.stream) and kiln.eval.contamination.overlaps (the eval sets' 13-grams as the
        index, the split streamed past it);
  mmap  (unigram only) the same streamed counts, but over slices of a memory map of train.bin: what
        a streaming fix that kept np.memmap would show (mapped pages stay resident once read);
  old   the code before: np.bincount over the memory-mapped split, and a sorted index of every train
        13-gram (contamination.train_index), as they were, copied here. 8+ bytes a token: run at
        --old-gib only, which defaults to 1/8 of --gib.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np

VOCAB = 50_304  # GPT-2's 50,257 ids padded to 64, the FineWeb runs' vocabulary
BLOCK = 1 << 26  # ids generated and written at a time
ROW_LEN = 1025


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_split(folder: Path, n_tokens: int, seed: int) -> None:
    """train.bin of n_tokens random ids, the val shards, and eval items (items.npy) under folder."""
    from kiln.data.shards import shard_split
    from kiln.io import write_json

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(folder / "train.bin", "wb") as f:
        for start in range(0, n_tokens, BLOCK):
            rng.integers(0, VOCAB, size=min(BLOCK, n_tokens - start), dtype=np.uint16).tofile(f)
    shards = folder / "shards"
    shards.mkdir(exist_ok=True)
    val = rng.integers(0, VOCAB, size=64 * ROW_LEN, dtype=np.uint16)
    write_json(
        shards / "manifest.json",
        {
            "seq_len": ROW_LEN - 1,
            "row_len": ROW_LEN,
            "dtype": "uint16",
            "vocab_size": VOCAB,
            "padded_vocab_size": VOCAB,
            "splits": {"val": shard_split(val, shards, "val", ROW_LEN, 1 << 20, VOCAB)},
        },
    )
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    items = rng.integers(0, VOCAB, size=(400, 1000), dtype=np.uint16)
    for i, at in enumerate(rng.integers(0, n_tokens - 1000, size=40)):
        items[i] = train[at : at + 1000]
    np.save(folder / "items.npy", items)


# The code before issue 18, item 4, as it was (kiln.eval.perplexity.unigram_loss's count and
# kiln.eval.contamination.train_index / overlap).
def _old_counts(train_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(train_ids, minlength=vocab_size)


def _old_train_index(train_ids: np.ndarray, chunk: int = 1 << 24) -> np.ndarray:
    from kiln.eval.contamination import N, ngram_hashes

    parts = [
        np.unique(ngram_hashes(train_ids[start : start + chunk + N - 1], N))
        for start in range(0, max(len(train_ids) - N + 1, 1), chunk)
    ]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)


def _old_overlap(index: np.ndarray, items) -> dict:
    from kiln.eval.contamination import N, ngram_hashes

    hit = total = found = 0
    for ids in items:
        hashes = ngram_hashes(np.asarray(ids), N)
        at = np.searchsorted(index, hashes).clip(max=max(len(index) - 1, 0))
        present = index[at] == hashes
        total, found, hit = total + len(hashes), found + int(present.sum()), hit + bool(present.any())
    return {"items": len(items), "contaminated_items": hit, "ngram_overlap": found / total}


def child(folder: Path, impl: str, part: str) -> dict:
    from kiln.data.loader import ShardRows
    from kiln.eval import contamination
    from kiln.eval.perplexity import unigram_loss
    from kiln.eval.stream import CHUNK, TokenFile

    rows = ShardRows(folder / "shards", "val")
    items = [list(map(int, row)) for row in np.load(folder / "items.npy")]
    train_file = TokenFile(folder / "train.bin", "uint16")
    rss_start = _rss_mb()
    t0 = time.perf_counter()
    if part == "unigram" and impl == "new":
        result = unigram_loss(train_file, rows, VOCAB, 16, 4)
    elif part == "unigram":
        mm = np.memmap(train_file.path, dtype=np.uint16, mode="r")
        if impl == "old":
            counts = _old_counts(mm, VOCAB)
        else:  # mmap: streamed counts over slices of the map
            counts = np.zeros(VOCAB, dtype=np.int64)
            for start in range(0, len(mm), CHUNK):
                counts += np.bincount(mm[start : start + CHUNK], minlength=VOCAB)
        result = int(counts.sum())
    elif impl == "new":
        result = contamination.overlaps(train_file, {"eval": items})["eval"]
    else:
        index = _old_train_index(np.memmap(train_file.path, dtype=np.uint16, mode="r"))
        result = _old_overlap(index, items)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "impl": impl,
        "part": part,
        "tokens": len(train_file),
        "rss_start_mb": round(rss_start),
        "peak_rss_mb": round(peak),
        "seconds": round(seconds, 1),
        "result": result,
    }


def run_child(folder: Path, impl: str, part: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(folder), impl, part], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="the 1x split's size in GiB of uint16 ids")
    parser.add_argument("--old-gib", type=float, default=None, help="1x size for the old code (default gib/8; 0: skip)")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kiln-eval-memory"))
    parser.add_argument("--keep", action="store_true", help="leave the synthetic splits on disk")
    parser.add_argument("--child", nargs=3, metavar=("FOLDER", "IMPL", "PART"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:  # every implementation and part once, on one split of 128 KiB
        vars(args).update(
            gib=2**-13, old_gib=2**-13, scales=[1], dir=Path(tempfile.mkdtemp(prefix="kiln-eval-memory-"))
        )
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1], args.child[2])))
        return
    old_gib = args.gib / 8 if args.old_gib is None else args.old_gib
    plan = [
        (args.gib, impl, part) for impl, part in (("new", "unigram"), ("mmap", "unigram"), ("new", "contamination"))
    ]
    if old_gib:
        plan += [(old_gib, "old", part) for part in ("unigram", "contamination")]
    rows = []
    for gib in sorted({g for g, _, _ in plan}):
        for scale in args.scales:
            n_tokens = int(gib * scale * (1 << 30)) // 2
            folder = args.dir / f"{gib:g}gib-x{scale}"
            if not (folder / "items.npy").exists():
                write_split(folder, n_tokens, seed=scale)
            for g, impl, part in plan:
                if g == gib:
                    # --quick: the first part in a child as always (its command line, its JSON), the
                    # others in this process (a child's imports cost seconds; the figures mean nothing)
                    how = child if args.quick and rows else run_child
                    row = how(folder, impl, part) | {"scale": scale, "split_gib": gib * scale}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            if not args.keep:
                for path in sorted(folder.rglob("*"), reverse=True):
                    path.rmdir() if path.is_dir() else path.unlink()
                folder.rmdir()
    print(
        "\n| part | implementation | split | tokens | peak RSS (MB) | RSS after imports (MB) | growth over imports | s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['part']} | {r['impl']} | {r['split_gib']:g} GiB ({r['scale']}x) | {r['tokens']:,} | "
            f"{r['peak_rss_mb']:,} | {r['rss_start_mb']:,} | {r['peak_rss_mb'] - r['rss_start_mb']:,} | {r['seconds']} |"
        )
    if args.quick:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
