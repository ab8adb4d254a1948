"""Near-duplicate removal: documents per second and peak memory of Kiln's index (kiln.data.near_dup,
rensa's MinHash and LSH) against datasketch's own MinHash LSH pipeline (the example of its docs:
one MinHash per document updated shingle by shingle, MinHashLSH query then insert), on the same
corpus, shingles, bands and rows, in one run.

    python bench/near_dup.py                 # the standard library's .py files (~1,750 documents)
    python bench/near_dup.py --copies 4      # ... each file 4 times with one word changed: 4x the documents
    python bench/near_dup.py --quick         # 100 documents: what tests/bench/test_bench.py runs

Each arm runs in a process of its own (peak RSS is that process's, the corpus read included, so the
two are comparable), reading the same documents in the same order; the table also says how many
near duplicates each found and how many of those both found (the two libraries hash differently, so
a document at the threshold can fall either way).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time

import common  # bench/ is sys.path[0]

from kiln.config.data_sections import NearDupSection, Source
from kiln.data.near_dup import NearDupIndex, shingles
from kiln.data.sources import SourceReader

CFG = NearDupSection(enabled=True, shingle=5, bands=25, rows=10, seed=42)  # download.near_dup's defaults


def corpus(limit: int | None, copies: int) -> list[tuple[str, str]]:
    """(id, text) of the standard library's .py files (valid UTF-8 ones), each `copies` times, the
    copies with their first word-character changed so that exact deduplication would not catch them."""
    spec = Source.of({"name": "stdlib", "kind": "stdlib", "include": ["**/*.py"], "quality": "none"})
    docs = [(d.id, str(d.text)) for d in SourceReader(spec).read() if d is not None][:limit]
    changed = [(f"{i}:{doc_id}", re.sub(r"\w", "Z", text, count=1)) for i in range(1, copies) for doc_id, text in docs]
    return docs + changed


def kiln_arm(docs: list[tuple[str, str]]) -> list[str]:
    index = NearDupIndex(CFG)
    return [doc_id for doc_id, text in docs if index.admit(text, doc_id)[0] is not None]


def datasketch_arm(docs: list[tuple[str, str]]) -> list[str]:
    from datasketch import MinHash, MinHashLSH

    num_perm = CFG.bands * CFG.rows
    lsh = MinHashLSH(num_perm=num_perm, params=(CFG.bands, CFG.rows))
    dropped = []
    for key, (doc_id, text) in enumerate(docs):
        grams = shingles(text, CFG.shingle)
        if not grams:
            continue
        minhash = MinHash(num_perm=num_perm, seed=CFG.seed)
        for gram in grams:
            minhash.update(gram.encode("utf-8"))
        if lsh.query(minhash):
            dropped.append(doc_id)
        else:
            lsh.insert(key, minhash)
    return dropped


def child(arm: str, limit: int | None, copies: int) -> None:
    docs = corpus(limit, copies)
    start = time.perf_counter()
    dropped = {"kiln": kiln_arm, "datasketch": datasketch_arm}[arm](docs)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"docs": len(docs), "seconds": seconds, "peak_mb": peak_mb, "dropped": dropped}))


def main() -> None:
    parser = common.parser(__doc__, quick="100 documents (tests/bench/test_bench.py)")
    parser.add_argument("--limit", type=int, help="the first N documents only")
    parser.add_argument("--copies", type=int, default=1, help="each document this many times, one word changed")
    parser.add_argument("--child", choices=["kiln", "datasketch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    limit = 100 if args.quick else args.limit
    if args.child:
        return child(args.child, limit, args.copies)
    results = {}
    for arm in ("datasketch", "kiln"):
        cmd = [sys.executable, __file__, "--child", arm, "--copies", str(args.copies)]
        cmd += ["--limit", str(limit)] if limit else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[arm] = json.loads(out.strip().splitlines()[-1])
    both = len(set(results["kiln"]["dropped"]) & set(results["datasketch"]["dropped"]))
    print(
        f"{results['kiln']['docs']:,} documents (the standard library's .py files x {args.copies}); "
        f"{CFG.shingle}-word shingles, {CFG.bands} bands x {CFG.rows} rows\n"
    )
    print("| near-dup | documents/s | seconds | peak RSS MiB | near duplicates | found by both |")
    print("|---|---:|---:|---:|---:|---:|")
    for arm, label in (("datasketch", "datasketch 2.0 MinHash + MinHashLSH"), ("kiln", "Kiln (rensa 0.5)")):
        r = results[arm]
        print(
            f"| {label} | {r['docs'] / r['seconds']:,.0f} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | "
            f"{len(r['dropped']):,} | {both:,} |"
        )
    speed = results["datasketch"]["seconds"] / results["kiln"]["seconds"]
    memory = results["kiln"]["peak_mb"] / results["datasketch"]["peak_mb"]
    print(f"\nKiln / datasketch: {speed:.1f}x the documents per second, {memory:.2f}x the peak memory")


if __name__ == "__main__":
    main()
