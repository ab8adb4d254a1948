"""What checking shards before use costs: the loader with and without ShardChecks, in one run.

    python bench/shard_verify.py                      # 256M tokens (512 MB) in 16 shards, seq_len 1024
    python bench/shard_verify.py --tokens 64e6 --batches 200
    python bench/shard_verify.py --quick          # 4 shards of 64 rows, 4 batches: what tests/bench/test_bench.py runs

Writes a synthetic shard folder (uint16 ids, the shard stage's layout) in a temporary folder, reads it
once untimed so that every figure below comes from the page cache, then, best of --rounds rounds:
- verify pass: kiln.data.shards.verify_shards over the folder (sha256 + id check in one read), GB/s;
- baseline: ShardRows(verify=False) + TrainBatches: time to open, to the first batch, and to serve
  --batches batches of --micro-batch rows (random rows across every shard, as training reads them);
- checked: the same with verification on (one background thread; the first batch waits for the
  shards its rows are in, verified by the loader's own thread if the background has not got there);
- checked, settled: the same batches once the background thread has finished (the steady state).
The overhead is the checked figure minus the baseline's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np

from kiln.data.loader import ShardRows, TrainBatches, forget_checked
from kiln.data.shards import shard_split, verify_shards
from kiln.io import read_json, write_json


def make_shards(out: Path, tokens: int, seq_len: int, rows_per_shard: int, vocab: int) -> int:
    stream = np.random.default_rng(0).integers(0, vocab, size=tokens, dtype=np.uint16)
    entry = shard_split(stream, out, "train", seq_len + 1, rows_per_shard, vocab)
    write_json(
        out / "manifest.json",
        {
            "seq_len": seq_len,
            "row_len": seq_len + 1,
            "dtype": "uint16",
            "vocab_size": vocab,
            "padded_vocab_size": vocab,
            "splits": {"train": entry},
        },
    )
    return sum((out / s["file"]).stat().st_size for s in entry["shards"])


def serve(shards: Path, verify: bool, batches: int, micro: int, settle: bool = False) -> dict:
    forget_checked()  # each round checks every shard, as a fresh process does
    t0 = time.perf_counter()
    rows = ShardRows(shards, "train", verify=verify)
    if settle:
        rows.checks.wait()
        t0 = time.perf_counter()
    loader = TrainBatches(rows, micro, seed=0)
    opened = time.perf_counter()
    loader.next()
    first = time.perf_counter()
    for _ in range(batches - 1):
        loader.next()
    end = time.perf_counter()
    if verify and not settle:
        rows.checks.wait()  # not timed: the next round must not share the disk with this one
    return {"open_s": opened - t0, "first_s": first - t0, "total_s": end - t0}


def main() -> None:
    parser = common.parser(__doc__, rounds=3, rounds_help="rounds, the variants in turns; the best is shown")
    parser.add_argument("--tokens", type=float, default=256e6)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows-per-shard", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    if args.quick:
        vars(args).update(
            tokens=4 * 64 * 65, seq_len=64, rows_per_shard=64, vocab=512, micro_batch=2, batches=4, rounds=1
        )
    with tempfile.TemporaryDirectory(prefix="kiln-shard-verify-") as tmp:
        shards = Path(tmp)
        size = make_shards(shards, int(args.tokens), args.seq_len, args.rows_per_shard, args.vocab)
        manifest = read_json(shards / "manifest.json")
        n_shards = len(manifest["splits"]["train"]["shards"])
        for path in shards.glob("*.bin"):  # into the page cache: every figure below reads from memory
            path.read_bytes()
        passes, runs = [], {"baseline": [], "checked": [], "checked, settled": []}
        for _ in range(args.rounds):  # in turns, so a slow spell of the machine hits every variant
            t0 = time.perf_counter()
            verify_shards(shards, manifest)
            passes.append(time.perf_counter() - t0)
            runs["baseline"].append(serve(shards, False, args.batches, args.micro_batch))
            runs["checked"].append(serve(shards, True, args.batches, args.micro_batch))
            runs["checked, settled"].append(serve(shards, True, args.batches, args.micro_batch, settle=True))
        best = min(passes)
        print(
            f"{n_shards} shards, {size / 1e6:.0f} MB, {int(args.tokens):,} tokens; "
            f"{args.batches} batches of {args.micro_batch} rows of {args.seq_len + 1}; best of {args.rounds}"
        )
        print(f"verify pass (sha256 + ids, one read): {best:.3f} s = {size / best / 1e9:.2f} GB/s")
        base = {k: min(r[k] for r in runs["baseline"]) for k in ("open_s", "first_s", "total_s")}
        print(f"\n| loader | open s | first batch s | {args.batches} batches s | overhead s |")
        print("|---|---:|---:|---:|---:|")
        for name, rounds in runs.items():
            fig = {k: min(r[k] for r in rounds) for k in ("open_s", "first_s", "total_s")}
            print(
                f"| {name} | {fig['open_s']:.4f} | {fig['first_s']:.4f} | {fig['total_s']:.4f} | "
                f"{fig['total_s'] - base['total_s']:+.4f} |"
            )


if __name__ == "__main__":
    main()
