"""A tiny run on a two-source mixture, made in-process for the eval tests: a raw folder with two sources
(predictable code, and letters drawn at random), pretokenized without FIM, sharded, and a tiny model
trained on it with checkpoints (tests/unit/eval/test_val_metrics.py, test_metric_extending.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
from conftest import download_cfg, write_jsonl
from synthetic import TINY_MODEL, train_sections
from train_stage import run

from kiln.config.data_sections import PretokenizeSection
from kiln.config.run_config import RunConfig
from kiln.data.pretokenize import pretokenize
from kiln.data.raw import write_raw
from kiln.data.shards import shard_split
from kiln.io import write_json

SEED = 7
SEQ_LEN = 16  # what train_sections sets shard.seq_len to
MAX_STEPS, CKPT_EVERY, KEEP = 30, 10, 3
PRETOKENIZE = {  # a whole section: the mixture names this run's sources, not tiny.yaml's
    "val_tokens": 3000,
    "mixture": {"code": 1, "noise": 1},
    "heldout_ngram": 50,
    "heldout_guard": 10,
    "repo_context": False,
    "encoder": "auto",
    "fim": {"rate": 0.0, "psm": 0.5, "spm": 0.25, "middle_only": 0.25, "min_chars": 100},
}


def mixture_run(base: Path, tokenizer_path: Path) -> Path:
    """raw/, tokens/, shards/ and train/ (checkpoints, final model, summary.json) of a two-source run in base."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz      "))
    code = [{"text": f"def alpha_{i}(x):\n    return x + {i}\n" * 3} for i in range(300)]
    noise = [{"text": "".join(rng.choice(letters, size=90)) + "\n"} for _ in range(300)]
    write_jsonl(base / "inputs" / "code.jsonl", code)
    write_jsonl(base / "inputs" / "noise.jsonl", noise)
    sources = [
        {"name": n, "kind": "local", "paths": [f"inputs/{n}.jsonl"], "text_column": "text"} for n in ("code", "noise")
    ]
    cwd = os.getcwd()
    os.chdir(base)  # relative paths: the same document ids, so the same split, on every run
    try:
        write_raw(download_cfg(sources, rows_per_part=50), base / "raw")
    finally:
        os.chdir(cwd)
    (base / "tokens").mkdir()
    meta = pretokenize(base / "raw", tokenizer_path, base / "tokens", SEED, PretokenizeSection.of(PRETOKENIZE))
    shards = base / "shards"
    shards.mkdir()
    splits = {
        split: shard_split(
            np.memmap(base / "tokens" / f"{split}.bin", dtype=meta["dtype"], mode="r"),
            shards,
            split,
            SEQ_LEN + 1,
            1000,
            meta["padded_vocab_size"],
        )
        for split in ("train", "val")
    }
    write_json(
        shards / "manifest.json",
        {
            "seq_len": SEQ_LEN,
            "row_len": SEQ_LEN + 1,
            "dtype": meta["dtype"],
            "vocab_size": meta["vocab_size"],
            "padded_vocab_size": meta["padded_vocab_size"],
            "splits": splits,
            "sources": meta["sources"],
        },
    )
    sections = train_sections(
        TINY_MODEL,
        max_steps=MAX_STEPS,
        micro_batch=16,
        checkpoint_every=CKPT_EVERY,
        keep_checkpoints=KEEP,
        eval_every=MAX_STEPS,
        log_every=10,
    )
    result = run(RunConfig.of(sections), shards, base / "train")
    write_json(base / "train" / "summary.json", dataclasses.asdict(result))
    return base
