"""A shard folder with learnable structure, and validated train- and smoke-stage sections, for the
training tests (test_trainer and test_smoke in-process, test_distributed under torchrun).

The token stream is EOS-separated words drawn from a small fixed lexicon: within a word the next id
is certain, so a handful of steps lowers the loss of a tiny model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln import config as kiln_config
from kiln.data.shards import shard_split
from kiln.io import write_json

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 16
VOCAB, PADDED_VOCAB = 60, 64
TRAIN_ROWS, VAL_ROWS = 64, 16  # 64 rows: a whole number of micro-batches of 2, 4 and 8
TINY_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32}


def _stream(n_tokens: int, seed: int) -> np.ndarray:
    lex_rng = np.random.default_rng(0)
    words = [lex_rng.integers(1, VOCAB, size=int(lex_rng.integers(3, 7))) for _ in range(6)]
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n_tokens:
        out.extend(words[int(rng.integers(len(words)))].tolist())
        out.append(0)
    return np.asarray(out[:n_tokens], dtype=np.uint16)


def write_shards(out: Path, train_tokens: np.ndarray | None = None, padded_vocab: int = PADDED_VOCAB) -> Path:
    """A shard folder as workflow/scripts/shard.py writes it (the train split over three shards);
    train_tokens replaces the train split's stream; padded_vocab widens the model's embedding (the
    ids stay below VOCAB), for a test that decodes with a real tokenizer."""
    row_len = SEQ_LEN + 1
    out.mkdir(parents=True, exist_ok=True)
    train = _stream(TRAIN_ROWS * row_len + 5, seed=1) if train_tokens is None else train_tokens
    splits = {
        # a few extra tokens per split that do not fill a row and are dropped
        "train": shard_split(train, out, "train", row_len, 24, padded_vocab),
        "val": shard_split(_stream(VAL_ROWS * row_len + 3, seed=2), out, "val", row_len, 24, padded_vocab),
    }
    write_json(
        out / "manifest.json",
        {
            "seq_len": SEQ_LEN,
            "row_len": row_len,
            "dtype": "uint16",
            "vocab_size": VOCAB,
            "padded_vocab_size": padded_vocab,
            "splits": splits,
            "documents": {"eos_id": 0, "bos_id": None},  # _stream ends each word with 0
        },
    )
    return out


def _tiny_without(*sections: str) -> dict:
    """tests/configs/tiny.yaml as written, less the sections a caller gives whole."""
    raw = kiln_config.read_yaml(REPO / "tests" / "configs" / "tiny.yaml")
    return {key: value for key, value in raw.items() if key not in sections}


def train_sections(model: dict | None = None, nproc_per_node: int = 1, **train) -> dict:
    """The train stage's sections from tests/configs/tiny.yaml with a tiny model and fp32, validated."""
    defaults = {
        "nproc_per_node": nproc_per_node,
        "micro_batch": 8,
        "max_steps": 20,
        "lr": 1e-2,
        "min_lr": 1e-3,
        "warmup_steps": 2,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "precision": "fp32",
        "compile": False,
        "log_every": 5,
        "eval_every": 10,
        "eval_batches": 2,
        "checkpoint_every": 10,
        "keep_checkpoints": 2,
    }
    return kiln_config.stage_sections(
        "train",
        _tiny_without("model", "train"),
        model=TINY_MODEL if model is None else model,  # {}: none (train.init_from.hf gives it)
        shard={"seq_len": SEQ_LEN},  # what the synthetic shards hold
        train=defaults | train,
    )


def smoke_sections(model: dict | None = None, train: dict | None = None, **smoke) -> dict:
    """The smoke stage's sections: tests/configs/tiny.yaml with a tiny model on the synthetic shards."""
    train_defaults = {
        "micro_batch": 8,
        "max_steps": 1000,
        "lr": 1e-2,
        "min_lr": 1e-3,
        "warmup_steps": 2,
        "precision": "fp32",
        "compile": False,
    }
    smoke_defaults = {
        "steps": 12,
        "warmup_steps": 2,
        "min_loss_drop": 0.1,
        "val_batches": 2,
        "overfit": {"rows": 4, "max_steps": 150, "max_loss": 1.0},
    }
    return kiln_config.stage_sections(
        "smoke",
        _tiny_without("model", "train", "smoke"),
        model=model or TINY_MODEL,
        shard={"seq_len": SEQ_LEN},
        train=train_defaults | (train or {}),
        smoke=smoke_defaults | smoke,
    )


SAMPLE_PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


def greedy_sampler(model, agree=None) -> list[dict]:
    """A Trainer.fit sampler on token ids (the synthetic data has no tokenizer)."""
    from kiln.generate.decode import generate

    new = generate(model, SAMPLE_PROMPTS, 6, agree=agree)
    return [{"prompt": str(p), "completion": str(n)} for p, n in zip(SAMPLE_PROMPTS, new)]
