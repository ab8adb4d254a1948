"""Pretokenize: a validation split of a fixed token count chosen by document and disjoint from train,
EOS after every sample, FIM on train only, token budgets shared by mixture weight, repository context,
and output that depends on nothing but the data and the config (not the worker count, the encoder
library or the slicing of long texts)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import download_cfg, write_jsonl

from kiln.config.data_sections import Fim, PretokenizeSection
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.fim import fim_pieces, restore_document
from kiln.data.pretokenize import SPLITS, _select_val, pretokenize
from kiln.data.raw import write_raw
from kiln.data.sources import read_documents
from kiln.data.token_plan import plan, token_dtype
from kiln.data.tokenize_parts import WorkerPool, split_hash
from kiln.errors import KilnError
from kiln.io import read_json

SEED = 7
# A whole pretokenize section (every default given), so a test sets any key; read as the typed
# PretokenizeSection by run().
CFG = {
    "val_tokens": 30_000,
    "mixture": {},
    "heldout_ngram": 0,  # the split whole; tests/unit/data/test_heldout.py leaves overlaps out
    "heldout_guard": 10,
    "repo_context": False,
    "encoder": "auto",
    "fim": {"rate": 0.5, "psm": 0.5, "spm": 0.25, "middle_only": 0.25, "min_chars": 100},
}
EOS_ID = 0
FIM_IDS = {1: "<fim_prefix>", 2: "<fim_middle>", 3: "<fim_suffix>"}
SPECIAL = {i: t for i, t in enumerate(SPECIAL_TOKENS)}


def run(raw_dir, tokenizer_path, out, cfg=CFG, seed=SEED, **kwargs) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    return pretokenize(raw_dir, tokenizer_path, out, seed, PretokenizeSection.of(cfg), **kwargs)


def outputs(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("train.bin", "val.bin", "val_ids.txt")}


@pytest.fixture(scope="module")
def tokens(raw_dir, tokenizer_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    meta = run(raw_dir, tokenizer_path, out)
    docs = list(read_documents(raw_dir, read_json(raw_dir / "manifest.json")))
    streams = {s: np.fromfile(out / f"{s}.bin", dtype=meta["dtype"]) for s in SPLITS}
    return out, meta, docs, streams


def per_doc(stream: np.ndarray) -> list[list[int]]:
    """A split's stream cut after each EOS."""
    ends = np.flatnonzero(stream == EOS_ID)
    assert len(stream) == 0 or ends[-1] == len(stream) - 1, "stream does not end with EOS"
    return [chunk.tolist() for chunk in np.split(stream, ends + 1)[:-1]]


def pieces_of(ids: list[int], tokenizer) -> list:
    """Token ids back to pieces: special spellings and decoded text runs."""
    pieces, run_ = [], []
    for tok in ids:
        if tok in SPECIAL:
            if run_:
                pieces.append(tokenizer.decode(run_))
                run_ = []
            pieces.append(SPECIAL[tok])
        else:
            run_.append(tok)
    return pieces + ([tokenizer.decode(run_)] if run_ else [])


def test_writes_expected_files_and_meta(tokens, tokenizer):
    out, meta, docs, streams = tokens
    assert {p.name for p in out.iterdir()} == {"train.bin", "val.bin", "val_ids.txt", "meta.json"}
    assert json.loads((out / "meta.json").read_text()) == meta  # the stage's record, written by pretokenize itself
    assert meta["dtype"] == "uint16" == token_dtype(meta["padded_vocab_size"]).name
    assert meta["vocab_size"] == tokenizer.get_vocab_size() and meta["padded_vocab_size"] % 64 == 0
    assert meta["eos_id"] == EOS_ID == tokenizer.token_to_id(SPECIAL_TOKENS[0])
    assert meta["encoder"]["name"] == "tiktoken" and meta["encoder"]["differing_docs"] == 0
    for split in SPLITS:
        assert meta["splits"][split]["tokens"] == len(streams[split]) > 0
        assert (out / f"{split}.bin").stat().st_size == 2 * len(streams[split])
    assert meta["splits"]["train"]["docs"] + meta["splits"]["val"]["docs"] == len(docs)
    assert meta["splits"]["train"]["bytes"] + meta["splits"]["val"]["bytes"] == sum(
        len(d.text.encode("utf-8")) for d in docs
    )
    assert sum(meta["fim_modes"].values()) == meta["splits"]["train"]["docs"]
    assert meta["fim_modes"]["psm"] > 0  # FIM did happen on the train side
    assert set(meta["sources"]) == {"stdlib", "tricky"}
    assert all(src["unused_docs"] == 0 for src in meta["sources"].values())


def test_val_is_a_fixed_token_count_of_whole_documents_with_the_smallest_hashes(tokens):
    out, meta, docs, streams = tokens
    val_ids = (out / "val_ids.txt").read_text(encoding="utf-8").splitlines()
    chunks = dict(zip(val_ids, per_doc(streams["val"])))
    assert len(val_ids) == len(set(val_ids)) == meta["splits"]["val"]["docs"]
    assert val_ids == [d.id for d in docs if d.id in chunks]  # stored order
    for name, source in meta["sources"].items():
        mine = sorted((d for d in docs if d.source == name), key=lambda d: split_hash(d.id))
        taken = [d for d in mine if d.id in chunks]
        assert mine[: len(taken)] == taken  # a prefix in hash order ...
        sizes = [len(chunks[d.id]) for d in taken]
        assert sum(sizes) >= source["val_target_tokens"] > sum(sizes[:-1])  # ... just reaching the quota
        assert source["val"]["tokens"] == sum(sizes)
    assert sum(s["val_target_tokens"] for s in meta["sources"].values()) >= CFG["val_tokens"]


def test_no_document_is_in_both_splits(tokens, tokenizer):
    out, meta, docs, streams = tokens
    val_ids = set((out / "val_ids.txt").read_text(encoding="utf-8").splitlines())
    train_docs = [d for d in docs if d.id not in val_ids]
    train_texts = [
        "".join(p for p in pieces_of(c, tokenizer) if p not in SPECIAL_TOKENS) for c in per_doc(streams["train"])
    ]
    assert len(train_texts) == len(train_docs) == meta["splits"]["train"]["docs"]
    for doc, text in zip(train_docs, train_texts):
        assert sorted(text) == sorted(doc.text) or text in doc.text  # PSM/SPM/none, or middle-only
    val_texts = {d.text for d in docs if d.id in val_ids}
    assert not val_texts & {d.text for d in train_docs}


def test_eos_count_equals_doc_count_per_split(tokens):
    _, meta, _, streams = tokens
    for split in SPLITS:
        assert int((streams[split] == EOS_ID).sum()) == meta["splits"][split]["docs"]
        assert streams[split][-1] == EOS_ID


def test_val_has_no_fim_sentinels_and_decodes_to_documents(tokens, tokenizer):
    out, _, docs, streams = tokens
    val_ids = (out / "val_ids.txt").read_text(encoding="utf-8").splitlines()
    assert not set(np.unique(streams["val"]).tolist()) & set(FIM_IDS)
    by_id = {d.id: d for d in docs}
    assert [tokenizer.decode(c[:-1]) for c in per_doc(streams["val"])] == [by_id[i].text for i in val_ids]


def test_train_side_is_fim_of_each_document_in_order(tokens, tokenizer):
    out, meta, docs, streams = tokens
    val_ids = set((out / "val_ids.txt").read_text(encoding="utf-8").splitlines())
    train_docs = [d for d in docs if d.id not in val_ids]
    modes = {}
    for doc, chunk in zip(train_docs, per_doc(streams["train"]), strict=True):
        mode, expected = fim_pieces(len(doc.text), SEED, doc.id, Fim.of(CFG["fim"]))
        modes[mode] = modes.get(mode, 0) + 1
        assert pieces_of(chunk[:-1], tokenizer) == [
            p if isinstance(p, str) else doc.text[p[0] : p[1]] for p in expected
        ]
        if mode != "middle_only":
            assert restore_document(doc.text, expected) == doc.text
    assert modes == {m: n for m, n in meta["fim_modes"].items() if n}


def test_output_does_not_depend_on_workers_encoder_or_slicing(tokens, raw_dir, tokenizer_path, tmp_path):
    out, meta, _, _ = tokens
    variants = {
        "two-workers": ({}, {"workers": 2}),
        "tokenizers": ({"encoder": "tokenizers"}, {}),
        "sliced": ({}, {"max_chars": 500}),
    }
    for name, (cfg, kwargs) in variants.items():
        again = run(raw_dir, tokenizer_path, tmp_path / name, dict(CFG, **cfg), **kwargs)
        assert outputs(tmp_path / name) == outputs(out), name
        assert {k: v for k, v in again.items() if k != "encoder"} == {k: v for k, v in meta.items() if k != "encoder"}
    assert again["encoder"]["name"] == "tiktoken"


def test_seed_changes_train_side_only(tokens, raw_dir, tokenizer_path, tmp_path):
    out, _, _, _ = tokens
    run(raw_dir, tokenizer_path, tmp_path / "seed", seed=SEED + 1)
    for name in ("val.bin", "val_ids.txt"):
        assert (tmp_path / "seed" / name).read_bytes() == (out / name).read_bytes()
    assert (tmp_path / "seed" / "train.bin").read_bytes() != (out / "train.bin").read_bytes()


def test_val_selection_does_not_depend_on_the_size_estimate(raw_dir, tokenizer_path, tmp_path):
    """A low estimate of the corpus means more rounds, never another validation set."""
    made = plan(raw_dir, tokenizer_path, SEED, PretokenizeSection.of(CFG))
    quotas = {"stdlib": 20_000, "tricky": 500}
    at_once = dataclasses.replace(made, quotas=quotas, first_rates={"stdlib": 1.0, "tricky": 1.0})
    from_near_zero = dataclasses.replace(made, quotas=quotas, first_rates={"stdlib": 1e-9, "tricky": 1e-9})
    with WorkerPool(1, made.settings) as pool:
        exact = _select_val(pool, at_once, tmp_path)
        rounds = _select_val(pool, from_near_zero, tmp_path)
    assert [(v["part"], v["row"]) for v in rounds] == [(v["part"], v["row"]) for v in exact]


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """A raw folder with two jsonl sources of small documents."""
    base = tmp_path_factory.mktemp("mix")
    a = write_jsonl(base / "a.jsonl", [{"text": f"def alpha_{i}(x):\n    return x + {i}\n" * 3} for i in range(300)])
    b = write_jsonl(base / "b.jsonl", [{"text": f"Beta number {i} is a sentence of prose.\n"} for i in range(300)])
    sources = [{"name": n, "kind": "local", "paths": [str(p)], "text_column": "text"} for n, p in (("a", a), ("b", b))]
    write_raw(download_cfg(sources, rows_per_part=40), base / "raw")
    return base / "raw"


def test_mixture_shares_train_tokens_by_weight(two_sources, tokenizer_path, tmp_path):
    cfg = dict(CFG, val_tokens=400, train_tokens=6000, mixture={"a": 3, "b": 1})
    meta = run(two_sources, tokenizer_path, tmp_path / "mix", cfg)
    a, b = meta["sources"]["a"], meta["sources"]["b"]
    assert (a["train_target_tokens"], b["train_target_tokens"]) == (4500, 1500)
    assert (a["share"], b["share"]) == (0.75, 0.25)
    for src in (a, b):  # the first documents reaching the target, no more
        assert src["train_target_tokens"] <= src["train"]["tokens"] < src["train_target_tokens"] + 200
        assert src["unused_docs"] > 0
        assert src["val"]["tokens"] >= src["val_target_tokens"]
    assert meta["splits"]["train"]["tokens"] == len(np.fromfile(tmp_path / "mix" / "train.bin", dtype=np.uint16))
    again = run(two_sources, tokenizer_path, tmp_path / "mix2", cfg, workers=2)
    assert outputs(tmp_path / "mix2") == outputs(tmp_path / "mix") and again == meta


def test_a_source_left_out_of_the_mixture_is_not_used(two_sources, tokenizer_path, tmp_path):
    meta = run(
        two_sources, tokenizer_path, tmp_path / "only-a", dict(CFG, val_tokens=400, train_tokens=3000, mixture={"a": 1})
    )
    assert meta["sources"]["b"]["train"]["docs"] == meta["sources"]["b"]["val"]["docs"] == 0
    assert meta["sources"]["b"]["unused_docs"] == 300


def test_repository_context_groups_files_and_keeps_fim_off_the_metadata(tmp_path, tokenizer_path, tokenizer):
    rows = [
        {"text": f"# file {r}.{i}\n" + "value = compute(x)\n" * 8, "path": f"pkg/m{i}.py", "repo": f"org/r{r}"}
        for r in range(40)
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "code.jsonl", rows)
    spec = {
        "name": "code",
        "kind": "local",
        "paths": [str(path)],
        "text_column": "text",
        "path_column": "path",
        "repo_column": "repo",
    }
    # files alike on purpose: neither duplicate removal may thin the repositories
    write_raw(download_cfg([spec], rows_per_part=8, dedup=False, near_dup={"enabled": False}), tmp_path / "raw")
    cfg = dict(CFG, val_tokens=300, repo_context=True, fim=dict(CFG["fim"], rate=1.0, min_chars=0))
    meta = run(tmp_path / "raw", tokenizer_path, tmp_path / "out", cfg)
    val_ids = (tmp_path / "out" / "val_ids.txt").read_text().splitlines()
    assert len(val_ids) % 3 == 0 and meta["splits"]["val"]["docs"] == len(val_ids)  # whole repositories
    samples = per_doc(np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16))
    assert len(samples) == 40 - len(val_ids) // 3 and meta["splits"]["train"]["docs"] == 3 * len(samples)
    for ids in samples:
        pieces = pieces_of(ids, tokenizer)
        assert pieces[0] == "<repo_name>" and pieces[1].startswith("org/r") and pieces[-1] == "<|endoftext|>"
        seps = [i for i, p in enumerate(pieces) if p == "<file_sep>"]
        assert len(seps) == 3
        for i, sep in enumerate(seps):
            assert pieces[sep + 1] == f"pkg/m{i}.py\n"  # the path, whole, before any sentinel
            assert pieces[sep + 2] in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    val = pieces_of(per_doc(np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16))[0], tokenizer)
    assert val[0] == "<repo_name>" and not {"<fim_prefix>", "<fim_middle>", "<fim_suffix>"} & set(val)
    held = [r for i, r in enumerate(rows) if f"code/{path.as_posix()}#{i}" in val_ids]
    metadata = sum(len(r["path"]) + 1 for r in held) + sum(len(repo) for repo in {r["repo"] for r in held})
    assert meta["splits"]["val"]["bytes"] == sum(len(r["text"]) for r in held) + metadata


@pytest.fixture(scope="module")
def few_docs_raw(tmp_path_factory):
    raw = tmp_path_factory.mktemp("few") / "raw"
    write_raw(download_cfg([{"name": "std", "kind": "stdlib", "include": ["json/*.py"]}], rows_per_part=10), raw)
    return raw


def test_val_tokens_beyond_the_corpus_leave_an_empty_train_split(few_docs_raw, tokenizer_path, tmp_path):
    with pytest.raises(KilnError, match=r"the train split is empty \(\d+ documents in all\).*val_tokens"):
        run(few_docs_raw, tokenizer_path, tmp_path / "out", dict(CFG, val_tokens=10**9))


def test_val_sources_place_each_source_in_val_bin(tokens, tokenizer):
    """val.bin holds the sources one after another; val_sources gives each its token range and counts."""
    out, meta, docs, streams = tokens
    ranges, at = meta["val_sources"], 0
    assert list(ranges) == list(meta["sources"])  # manifest order
    val_ids = (out / "val_ids.txt").read_text(encoding="utf-8").splitlines()
    by_id = {d.id: d for d in docs}
    first_doc = 0
    for name, r in ranges.items():
        assert r["start"] == at <= r["end"]
        at = r["end"]
        assert {k: r[k] for k in ("docs", "tokens", "bytes")} == meta["sources"][name]["val"]
        chunks = per_doc(streams["val"][r["start"] : r["end"]])
        mine = [by_id[i] for i in val_ids[first_doc : first_doc + r["docs"]]]
        first_doc += r["docs"]
        assert len(chunks) == r["docs"] > 0 and {d.source for d in mine} == {name}
        assert [tokenizer.decode(c[:-1]) for c in chunks] == [d.text for d in mine]
        assert r["bytes"] == sum(len(d.text.encode("utf-8")) for d in mine)
    assert at == len(streams["val"]) and first_doc == len(val_ids)


def test_val_sources_list_a_source_without_validation_tokens_as_empty(two_sources, tokenizer_path, tmp_path):
    meta = run(
        two_sources, tokenizer_path, tmp_path / "only-a", dict(CFG, val_tokens=400, train_tokens=3000, mixture={"a": 1})
    )
    a, b = meta["val_sources"]["a"], meta["val_sources"]["b"]
    assert a["start"] == 0 and a["end"] == a["tokens"] == meta["splits"]["val"]["tokens"] > 0
    assert b["start"] == b["end"] == a["end"] and b["docs"] == b["tokens"] == b["bytes"] == 0
