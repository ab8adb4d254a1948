"""The tokenizer stage's peak memory and time as train_bytes grows, against tokenizers' own trainer
reading the same sample from files, with a fit of memory against bytes that says what a larger
train_bytes needs.

    python bench/tokenizer_scale.py                       # 30, 100 and 300 MB of site-packages' Python code
    python bench/tokenizer_scale.py --sizes-mb 10,30      # other sizes
    python bench/tokenizer_scale.py --quick               # 1 and 2 MB of the standard library (tests/test_bench.py)

The corpus is real code: every .py file under this interpreter's site-packages (~300 MB with Kiln's
requirements installed), read by a `local` download source into a raw folder once (exact duplicates
dropped, the other cleaning off: this measures the tokenizer). Each size then runs in a process of its
own: Kiln's `build_tokenizer` (the stage's sampling of documents by seeded hash, held-out documents
aside, a byte-level BPE of --vocab tokens trained from that stream), and the baseline, tokenizers'
`Tokenizer.train(files)` on the same sample written out as files first. Peak RSS is each process's.
The fit is least squares of peak RSS on train bytes (MB = a + b x bytes); the plan's figure for the
tokenizer job (kiln.plan.tokenizer.memory_mb) was set from it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from dataprep import uncleaned_raw  # bench/ is sys.path[0]

from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.tokenizer_build import _sample as tokenizer_sample  # the stage's own sample, for the baseline
from kiln.data.tokenizer_build import build_tokenizer
from kiln.io import read_json

SEED = 1337


def raw_corpus(out: Path, pattern: str) -> Path:
    return uncleaned_raw({"name": "code", "kind": "local", "paths": [pattern]}, out, rows_per_part=2000)


def tokenizer_section(train_bytes: int, vocab: int):
    from kiln.config.data_sections import TokenizerSection

    heldout = 5 if vocab <= 512 else 50  # --quick's corpus is ~60 files
    return TokenizerSection.of(
        {"kind": "train", "heldout_docs": heldout, "vocab_size": vocab, "train_bytes": train_bytes}
    )


def child(arm: str, raw: Path, train_bytes: int, vocab: int, scratch: Path) -> None:
    start = time.perf_counter()
    if arm == "kiln":
        _, stats = build_tokenizer(raw, tokenizer_section(train_bytes, vocab), SEED)
        used = stats["train_bytes"]
    else:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        # the same documents the stage would train on, as files, then the library's file trainer
        manifest, used_stats = read_json(raw / "manifest.json"), {"docs": 0, "bytes": 0, "by_source": {}}
        files = []
        for i, text in enumerate(tokenizer_sample(raw, manifest, set(), train_bytes, SEED, used_stats)):
            path = scratch / f"{i // 1000:05d}.txt"
            with open(path, "a", encoding="utf-8") as f:
                f.write(text + "\n")
            if not files or files[-1] != path:
                files.append(path)
        start = time.perf_counter()  # the library's part: training from its files
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tokenizer.train([str(f) for f in files], trainer)
        used = used_stats["bytes"]
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"bytes": used, "seconds": seconds, "peak_mb": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", default="30,100,300", help="train_bytes to measure, in MB")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--quick", action="store_true", help="1 and 2 MB of the standard library, vocab 512")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # arm raw bytes scratch
    args = parser.parse_args()
    if args.child:
        arm, raw, size, scratch = args.child
        return child(arm, Path(raw), int(size), args.vocab, Path(scratch))
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes_mb.split(",")]
    vocab = 512 if args.quick else args.vocab
    root = Path(sysconfig.get_paths()["stdlib"] if args.quick else sysconfig.get_paths()["purelib"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_corpus(Path(tmp) / "raw", f"{root}/[a-e]*.py" if args.quick else f"{root}/**/*.py")
        corpus_mb = read_json(raw / "manifest.json")["bytes"] / 1e6
        for size in sizes:
            row = {"mb": size}
            for arm in ("kiln", "library"):
                scratch = Path(tmp) / f"{arm}-{size}"
                scratch.mkdir()
                cmd = [
                    sys.executable,
                    __file__,
                    "--vocab",
                    str(vocab),
                    "--child",
                    arm,
                    str(raw),
                    str(size * 10**6),
                    str(scratch),
                ]
                row[arm] = json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
                )
            rows.append(row)
    print(f"corpus: {root} (.py files, {corpus_mb:,.0f} MB after exact dedup); BPE vocab {vocab:,}\n")
    print(
        "| train_bytes MB | Kiln s | Kiln peak RSS MiB | tokenizers train(files) s | its peak RSS MiB | Kiln / library time | memory |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        k, b = r["kiln"], r["library"]
        print(
            f"| {k['bytes'] / 1e6:,.0f} | {k['seconds']:.1f} | {k['peak_mb']:,.0f} | {b['seconds']:.1f} | {b['peak_mb']:,.0f} | "
            f"{k['seconds'] / b['seconds']:.2f}x | {k['peak_mb'] / b['peak_mb']:.2f}x |"
        )
    x = np.array([r["kiln"]["bytes"] / 1e9 for r in rows])
    if len(set(x)) < 2:
        print("\nfit: needs two sizes that sample different bytes (the corpus may be smaller than the sizes)")
        return
    y = np.array([r["kiln"]["peak_mb"] for r in rows])
    slope, intercept = np.polyfit(x, y, 1)
    per_gb = np.polyfit(x, np.array([r["kiln"]["seconds"] for r in rows]), 1)[0]
    print(
        f"\nfit: peak RSS = {intercept:,.0f} MiB + {slope:,.0f} MiB per GB of train_bytes; time {per_gb:,.0f} s per GB "
        f"(this machine). At 2 GB: {intercept + 2 * slope:,.0f} MiB, {2 * per_gb / 60:,.0f} min"
    )


if __name__ == "__main__":
    main()
