"""Decontamination against the run's own held-out split (pretokenize.heldout_ngram, kiln.data.heldout):
a train sample that shares a run of n words with a held-out document is left out of train.bin, named
in meta.json, and the same whether one job encodes or the parts are gathered; text that more than
heldout_guard train samples share (a licence) removes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import download_cfg, write_jsonl
from test_pretokenize import CFG, SEED
from test_pretokenize_scatter import one_job, scattered

from kiln.config.data_sections import PretokenizeSection
from kiln.data.pretokenize import pretokenize
from kiln.data.raw import write_raw
from kiln.errors import KilnError

PAIRS = 12
LICENCE = " ".join(f"clause{i} permits copying under condition{i}" for i in range(14))  # 70 words, in all


def passage(k: int) -> str:
    """60 words that only the two documents of pair k hold."""
    return " ".join(f"pair{k} shares sentence{j} verbatim" for j in range(15))


def filler(tag: str) -> str:
    return " ".join(f"{tag} word{j} stands alone" for j in range(30))


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """PAIRS pairs of documents sharing a 60-word passage (and a licence every document holds), the
    rest of each document its own."""
    base = tmp_path_factory.mktemp("heldout")
    rows = []
    for k in range(PAIRS):
        for member in "ab":
            text = f"# {LICENCE}\n{filler(f'doc{k}{member}x')}\n{passage(k)}\n{filler(f'doc{k}{member}y')}\n"
            rows.append({"text": text})
    source = {"name": "docs", "kind": "local", "paths": [str(write_jsonl(base / "docs.jsonl", rows))]}
    write_raw(
        download_cfg([source | {"text_column": "text"}], rows_per_part=5, near_dup={"enabled": False}), base / "raw"
    )
    return base / "raw", rows


CONFIG = dict(CFG, val_tokens=1500, heldout_ngram=50, heldout_guard=10, fim=dict(CFG["fim"], rate=0.0))


def encode(raw, tokenizer_path, out, cfg=CONFIG) -> dict:
    out.mkdir(parents=True)
    return pretokenize(raw, tokenizer_path, out, SEED, PretokenizeSection.of(cfg))


def train_text(out, tokenizer) -> str:
    return tokenizer.decode(np.fromfile(out / "train.bin", dtype=np.uint16).tolist())


def test_the_other_half_of_a_held_out_pair_is_left_out_of_train(paired, tokenizer_path, tokenizer, tmp_path):
    raw, rows = paired
    meta = encode(raw, tokenizer_path, tmp_path / "tokens")
    held = {int(line.rsplit("#", 1)[1]) for line in (tmp_path / "tokens" / "val_ids.txt").read_text().split()}
    partners = {row ^ 1 for row in held} - held  # the pair's other document, where it is not held out too
    assert 0 < len(held) < 2 * PAIRS and partners
    report = meta["heldout_overlap"]
    removed = {int(i.rsplit("#", 1)[1]) for example in report["examples"] for i in example["doc_ids"]}
    assert removed == partners and report["docs"] == len(partners) == meta["sources"]["docs"]["heldout_overlap_docs"]
    assert all("(50 words, in 1 train samples) with held-out docs/" in e["why"] for e in report["examples"])
    # the removal reaches train.bin: no held-out passage is there, every other pair's is
    text = train_text(tmp_path / "tokens", tokenizer)
    for k in range(PAIRS):
        assert (passage(k) in text) == (2 * k not in held and 2 * k + 1 not in held), k
    assert meta["splits"]["train"]["docs"] == 2 * PAIRS - len(held) - len(partners)
    assert meta["sources"]["docs"]["unused_docs"] == 0


def test_shared_boilerplate_removes_nothing_and_zero_turns_it_off(paired, tokenizer_path, tokenizer, tmp_path):
    raw, _ = paired
    # 65 words: only the licence is that long, and every document holds it (over heldout_guard)
    licence_only = encode(raw, tokenizer_path, tmp_path / "licence", dict(CONFIG, heldout_ngram=65))
    assert licence_only["heldout_overlap"]["docs"] == 0
    # ... until the guard lets it count: then every train document holds a held-out n-gram
    with pytest.raises(KilnError, match="the train split is empty"):
        encode(raw, tokenizer_path, tmp_path / "unguarded", dict(CONFIG, heldout_ngram=65, heldout_guard=2 * PAIRS))
    off = encode(raw, tokenizer_path, tmp_path / "off", dict(CONFIG, heldout_ngram=0))
    assert off["heldout_overlap"]["docs"] == 0
    assert (tmp_path / "off" / "train.bin").read_bytes() == (tmp_path / "licence" / "train.bin").read_bytes()
    text = train_text(tmp_path / "off", tokenizer)
    assert sum(passage(k) in text for k in range(PAIRS)) == PAIRS  # each pair has a member in train


def test_the_gathered_parts_and_two_workers_leave_out_what_one_job_does(paired, tokenizer_path, tmp_path):
    raw, _ = paired
    one = one_job(raw, tokenizer_path, tmp_path / "one", CONFIG)
    assert scattered(raw, tokenizer_path, tmp_path / "scatter", CONFIG) == one
    assert json.loads(one["meta.json"])["heldout_overlap"]["docs"] > 0
    (tmp_path / "two").mkdir()
    pretokenize(raw, tokenizer_path, tmp_path / "two", SEED, PretokenizeSection.of(CONFIG), workers=2)
    assert all((tmp_path / "two" / name).read_bytes() == one[name] for name in one)
