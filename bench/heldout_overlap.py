"""How much of the training split shares n-grams with the run's own held-out split: what removing
"documents that share n-grams with the held-out split" (issue 31, item 3) would cost on a code
corpus, at the token level (the eval stage's 13-gram check, kiln.eval.contamination) and at the word
level (the download's decontamination, kiln.data.decontaminate), with and without a boilerplate
guard (an n-gram counts only when at most --guard train samples hold it: a licence header shared by
hundreds of files is not a copy of one held-out file).

    python bench/heldout_overlap.py                  # config/config.yaml: the stdlib
    python bench/heldout_overlap.py --quick          # tests/configs/tiny.yaml

Builds the data stages once (snakemake --until pretokenize) in a scratch folder, then reads
val.bin/train.bin (samples cut at <|endoftext|>) and the held-out documents' text (val_ids.txt).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kiln import config as kiln_config
from kiln.data.decontaminate import ngrams
from kiln.data.ngram_hash import ngram_hashes
from kiln.data.sources import read_documents
from kiln.io import benchmark_seconds as seconds
from kiln.io import read_json
from kiln.layout import Layout

ROOT = Path(__file__).resolve().parents[1]


def token_samples(path: Path, dtype: np.dtype, eos: int) -> list[np.ndarray]:
    """The samples of a split file, each cut after its <|endoftext|>."""
    ids = np.fromfile(path, dtype=dtype)
    return np.split(ids, np.flatnonzero(ids == eos)[:-1] + 1) if len(ids) else []


def overlap(val: list[set], train: list[set], guards: list[int]) -> dict:
    """Train samples holding any held-out n-gram, and held-out samples holding one found in train;
    then, per guard g, the same counting only n-grams that at most g train samples hold."""
    owners = collections.defaultdict(set)  # held-out n-gram -> the held-out samples holding it
    for k, grams in enumerate(val):
        for gram in grams:
            owners[gram].add(k)
    hits = [grams & owners.keys() for grams in train]
    holders = collections.Counter(gram for shared in hits for gram in shared)
    out = {"any": (sum(map(bool, hits)), len({k for gram in holders for k in owners[gram]}))}
    for guard in guards:
        rare = {gram for gram, n in holders.items() if n <= guard}
        out[guard] = (sum(bool(shared & rare) for shared in hits), len({k for gram in rare for k in owners[gram]}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--ngrams", default="13,32,50")
    parser.add_argument("--guards", default="1,10")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.mkdtemp(prefix="kiln-heldout-overlap-")))
    parser.add_argument("--quick", action="store_true", help="tests/configs/tiny.yaml")
    args = parser.parse_args()
    if args.quick:
        args.configfile = ROOT / "tests" / "configs" / "tiny.yaml"
    configfile = args.configfile.resolve()
    print(f"data stages of {configfile.name} in {args.workdir}, nothing left out of train ...", flush=True)
    layout = build(args.workdir, configfile, {"heldout_ngram": 0})
    tokens, raw = layout.folder("pretokenize"), layout.folder("download")
    meta = read_json(tokens / "meta.json")
    dtype, eos = np.dtype(meta["dtype"]), meta["eos_id"]
    val_ids = (tokens / "val_ids.txt").read_text(encoding="utf-8").split()
    val_tok, train_tok = (token_samples(tokens / f"{s}.bin", dtype, eos) for s in ("val", "train"))
    texts = {d.id: d.text for d in read_documents(raw, read_json(raw / "manifest.json"))}
    held = set(val_ids)
    val_text = [texts[i] for i in val_ids]
    train_text = [t for i, t in texts.items() if i not in held]
    guards = [int(g) for g in args.guards.split(",")]
    print(
        f"\nheld-out: {len(val_tok)} samples ({sum(map(len, val_tok)):,} tokens); train: {len(train_tok)} samples "
        f"({sum(map(len, train_tok)):,} tokens, FIM-transformed as trained); {len(train_text)} train documents\n"
    )
    head = " | ".join(f"guard {g}: train / held-out" for g in guards)
    print(f"| n-gram | train samples holding a held-out one | held-out samples found in train | {head} |")
    print("|---|---:|---:|" + "---:|" * len(guards))
    for n in (int(x) for x in args.ngrams.split(",")):
        for unit, val, train in (
            (
                "tokens",
                [set(ngram_hashes(s, n).tolist()) for s in val_tok],
                [set(ngram_hashes(s, n).tolist()) for s in train_tok],
            ),
            ("words", [set(ngrams(t, n)) for t in val_text], [set(ngrams(t, n)) for t in train_text]),
        ):
            found = overlap(val, train, guards)
            (t, v), total = found["any"], len(train)
            cells = " | ".join(f"{found[g][0]} ({found[g][0] / total:.1%}) / {found[g][1]}" for g in guards)
            print(f"| {n} {unit} | {t} of {total} ({t / total:.1%}) | {v} of {len(val)} | {cells} |")
    removal(args.workdir, configfile, layout)
    shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


def build(workdir: Path, configfile: Path, pretokenize: dict) -> Layout:
    """The data stages up to pretokenize, with these pretokenize settings over the config's."""
    overrides = {"pretokenize": json.dumps(pretokenize)} if pretokenize else {}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--configfile", str(configfile), "--cores", "all", "--until", "pretokenize"]
    cmd += ["--config", *(f"{k}={v}" for k, v in overrides.items())] if overrides else []
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"$ {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return Layout(kiln_config.resolve([configfile], overrides), root=workdir / "results")


def removal(workdir: Path, configfile: Path, off: Layout) -> None:
    """The config's own pretokenize.heldout_ngram at work (kiln.data.heldout): what it left out, and
    the stage's time against the same stage with it off, from their benchmark files."""
    print("\npretokenize with the config's heldout_ngram ...", flush=True)
    on = build(workdir, configfile, {})
    overlap = read_json(on.folder("pretokenize") / "meta.json")["heldout_overlap"]
    print("\n| heldout_ngram | guard | train documents left out | pretokenize s | with it off s |")
    print("|---:|---:|---:|---:|---:|")
    times = [seconds(layout.benchmark("pretokenize")) for layout in (on, off)]
    print(f"| {overlap['ngram']} | {overlap['guard']} | {overlap['docs']} | {times[0]:.2f} | {times[1]:.2f} |")
    for example in overlap["examples"]:
        print(f"- {', '.join(example['doc_ids'])}: {example['why']}")


if __name__ == "__main__":
    sys.exit(main())
