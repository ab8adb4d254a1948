"""Pretokenize: a disjoint, stable train/val split, EOS after every document, FIM on train only,
and token streams that decode back to the documents."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.data.sources import write_raw
from kiln.config import SPECIAL_TOKENS
from kiln.data.fim import fim_pieces, restore_document
from kiln.data.pretokenize import SPLITS, is_val, pretokenize, token_dtype
from kiln.data.sources import read_documents
from kiln.errors import KilnError
from kiln.io import read_json

SEED = 7
CFG = {
    "val_fraction": 0.25,
    "fim": {"rate": 0.5, "psm": 0.5, "spm": 0.25, "middle_only": 0.25, "min_chars": 100},
}
EOS_ID = 0
FIM_IDS = {1: "<fim_prefix>", 2: "<fim_middle>", 3: "<fim_suffix>"}


def run(raw_dir, tokenizer_path, out, cfg=CFG):
    out.mkdir(parents=True, exist_ok=True)
    return pretokenize(raw_dir, tokenizer_path, out, SEED, cfg)


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


def test_writes_expected_files_and_meta(tokens, tokenizer):
    out, meta, docs, streams = tokens
    assert {p.name for p in out.iterdir()} == {"train.bin", "val.bin", "val_ids.txt"}
    assert meta["dtype"] == "uint16" == token_dtype(meta["padded_vocab_size"]).name
    assert meta["vocab_size"] == tokenizer.get_vocab_size()
    assert meta["padded_vocab_size"] % 64 == 0
    assert meta["eos_id"] == EOS_ID == tokenizer.token_to_id(SPECIAL_TOKENS[0])
    for split in SPLITS:
        assert meta["splits"][split]["tokens"] == len(streams[split]) > 0
        assert (out / f"{split}.bin").stat().st_size == 2 * len(streams[split])
    assert meta["splits"]["train"]["docs"] + meta["splits"]["val"]["docs"] == len(docs)
    assert meta["splits"]["train"]["bytes"] + meta["splits"]["val"]["bytes"] == sum(
        len(d.text.encode("utf-8")) for d in docs
    )
    assert sum(meta["fim_modes"].values()) == meta["splits"]["train"]["docs"]
    assert meta["fim_modes"].get("psm", 0) > 0  # FIM did happen on the train side


def test_splits_are_disjoint_and_follow_is_val(tokens):
    out, meta, docs, _ = tokens
    val_ids = (out / "val_ids.txt").read_text(encoding="utf-8").splitlines()
    assert len(val_ids) == len(set(val_ids)) == meta["splits"]["val"]["docs"]
    assert val_ids == [d.id for d in docs if is_val(d.id, CFG["val_fraction"])]
    train_ids = [d.id for d in docs if not is_val(d.id, CFG["val_fraction"])]
    assert len(train_ids) == meta["splits"]["train"]["docs"]
    assert not set(val_ids) & set(train_ids)
    assert set(val_ids) | set(train_ids) == {d.id for d in docs}


def test_is_val_is_stable_and_near_fraction():
    ids = [f"src/file{i}.py" for i in range(20_000)]
    share = sum(is_val(i, 0.1) for i in ids) / len(ids)
    assert abs(share - 0.1) < 4 * (0.1 * 0.9 / len(ids)) ** 0.5
    assert [is_val(i, 0.1) for i in ids[:100]] == [is_val(i, 0.1) for i in ids[:100]]
    # A larger fraction only adds documents to validation.
    assert all(is_val(i, 0.2) for i in ids if is_val(i, 0.1))


def test_eos_count_equals_doc_count_per_split(tokens):
    _, meta, docs, streams = tokens
    for split in SPLITS:
        assert int((streams[split] == EOS_ID).sum()) == meta["splits"][split]["docs"]
        assert streams[split][-1] == EOS_ID


def test_val_has_no_fim_sentinels_and_decodes_to_documents(tokens, tokenizer):
    _, _, docs, streams = tokens
    val_docs = [d for d in docs if is_val(d.id, CFG["val_fraction"])]
    # The fixture puts documents quoting every special spelling on the val side; they stay text.
    assert any("<fim_middle>" in d.text and "<|endoftext|>" in d.text for d in val_docs)
    assert not set(np.unique(streams["val"]).tolist()) & set(FIM_IDS)
    chunks = per_doc(streams["val"])
    assert [tokenizer.decode(c[:-1]) for c in chunks] == [d.text for d in val_docs]


def test_train_side_is_fim_of_each_document_in_order(tokens, tokenizer):
    _, meta, docs, streams = tokens
    train_docs = [d for d in docs if not is_val(d.id, CFG["val_fraction"])]
    chunks = per_doc(streams["train"])
    assert len(chunks) == len(train_docs)
    modes = {}
    for doc, chunk in zip(train_docs, chunks):
        pieces, run = [], []
        for tok in chunk[:-1]:
            if tok in FIM_IDS:
                if run:
                    pieces.append(("text", tokenizer.decode(run)))
                    run = []
                pieces.append(("special", FIM_IDS[tok]))
            else:
                run.append(tok)
        if run:
            pieces.append(("text", tokenizer.decode(run)))
        mode, expected = fim_pieces(doc.text, SEED, doc.id, CFG["fim"])
        modes[mode] = modes.get(mode, 0) + 1
        assert pieces == expected, doc.id
        if mode != "middle_only":
            assert restore_document(pieces) == doc.text
    assert modes == meta["fim_modes"]


def test_rerun_is_byte_identical(tokens, raw_dir, tokenizer_path, tmp_path):
    out, meta, _, _ = tokens
    again = run(raw_dir, tokenizer_path, tmp_path / "again")
    assert again == meta
    for name in ("train.bin", "val.bin", "val_ids.txt"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()


def test_seed_changes_train_side_only(tokens, raw_dir, tokenizer_path, tmp_path):
    out, _, _, _ = tokens
    other = tmp_path / "seed"
    other.mkdir()
    pretokenize(raw_dir, tokenizer_path, other, SEED + 1, CFG)
    assert (other / "val.bin").read_bytes() == (out / "val.bin").read_bytes()
    assert (other / "val_ids.txt").read_bytes() == (out / "val_ids.txt").read_bytes()
    assert (other / "train.bin").read_bytes() != (out / "train.bin").read_bytes()


@pytest.fixture(scope="module")
def few_docs_raw(tmp_path_factory):
    raw = tmp_path_factory.mktemp("few") / "raw"
    write_raw([{"name": "std", "kind": "stdlib", "include": ["json/*.py"]}], raw, rows_per_part=10)
    return raw


@pytest.mark.parametrize("fraction, empty", [(1e-9, "val"), (1 - 1e-9, "train")])
def test_empty_split_raises_naming_it(few_docs_raw, tokenizer_path, tmp_path, fraction, empty):
    ids = [d.id for d in read_documents(few_docs_raw, read_json(few_docs_raw / "manifest.json"))]
    assert len({is_val(i, fraction) for i in ids}) == 1  # the premise: everything on one side
    with pytest.raises(KilnError, match=rf"the {empty} split is empty \({len(ids)} documents"):
        run(few_docs_raw, tokenizer_path, tmp_path / "out", dict(CFG, val_fraction=fraction))
