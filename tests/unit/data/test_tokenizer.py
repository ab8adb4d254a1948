"""The byte-level BPE: special token ids, lossless round trips, special spellings stay text."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TOKENIZER_CFG, TRICKY_TEXTS, download_cfg, tokenizer_cfg, typed_section, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.config.data_sections import TokenizerSection
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.encoders import tiktoken_encoding
from kiln.data.raw import write_raw
from kiln.data.source_kinds.stdlib.reader import stdlib_root
from kiln.data.sources import read_documents
from kiln.data.tokenizer import EOS, load_tokenizer, padded_vocab_size, special_ids
from kiln.data.tokenizer_build import build_tokenizer, bytes_per_token, encode_batch, train_bpe
from kiln.errors import KilnError
from kiln.io import read_json, stable_hash


def pretrained_cfg(**values) -> TokenizerSection:
    """The section of a pretrained tokenizer (kind file or tiktoken), three documents held out."""
    return typed_section("tokenizer", {"heldout_docs": 3, **values})


def test_special_tokens_take_ids_0_to_6_in_order(tokenizer):
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert special_ids(tokenizer) == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    assert tokenizer.id_to_token(0) == EOS


def test_trained_vocab_size(tokenizer):
    assert tokenizer.get_vocab_size() == TOKENIZER_CFG["vocab_size"]


@pytest.mark.parametrize(
    "n, padded", [(1, 64), (63, 64), (64, 64), (65, 128), (512, 512), (8193, 8256), (50257, 50304)]
)
def test_padded_vocab_size_rounds_up_to_64(n, padded):
    assert padded_vocab_size(n) == padded
    assert padded_vocab_size(n) % 64 == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_decode_encode_roundtrips_any_unicode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "  leading and trailing  ",
        "\r\n\t\x00\x7f",
        "é",
        "🙂🙂",
        "\u200b\ufeff",
        "a" * 5000,
        "".join(SPECIAL_TOKENS),
        "\U0010ffff",
    ],
)
def test_decode_encode_roundtrips_edge_cases(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids) == text


@pytest.mark.parametrize("token", SPECIAL_TOKENS)
def test_special_token_spelling_in_a_document_is_plain_text(tokenizer, token):
    text = f"before {token} after"
    ids = encode_batch(tokenizer, [text])[0]
    assert not set(ids) & set(range(len(SPECIAL_TOKENS)))
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_token_spelling_is_plain_text_after_reload_and_before_save(trained, tokenizer_path):
    text = TRICKY_TEXTS[0]
    for tok in (trained[0], load_tokenizer(tokenizer_path)):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.token_to_id(EOS) not in ids
        assert tok.decode(ids) == text


def test_bytes_per_token_above_one_on_code(tokenizer):
    texts = [p.read_text(encoding="utf-8") for p in sorted(stdlib_root().glob("csv.py"))]
    assert texts
    assert bytes_per_token(tokenizer, texts) > 1.5
    # A pure byte-level tokenizer (no merges) sits at or below 1 byte per token on ASCII code.
    bare = train_bpe(["x"], vocab_size=300)
    assert bytes_per_token(bare, texts) <= 1.0


def test_build_tokenizer_holds_out_documents_and_reports_stats(raw_dir, trained):
    tokenizer, stats = trained
    manifest = read_json(raw_dir / "manifest.json")
    docs = list(read_documents(raw_dir, manifest))
    n = TOKENIZER_CFG["heldout_docs"]
    heldout = sorted(docs, key=lambda d: stable_hash(7, "tokenizer-heldout", d.id))[:n]
    assert stats["heldout_docs"] == n
    assert stats["train_docs"] == len(docs) - n
    assert stats["train_bytes"] == sum(len(d.text.encode("utf-8")) for d in docs) - sum(
        len(d.text.encode("utf-8")) for d in heldout
    )
    assert stats["vocab_size"] == tokenizer.get_vocab_size() == TOKENIZER_CFG["vocab_size"]
    assert stats["padded_vocab_size"] == padded_vocab_size(stats["vocab_size"])
    assert stats["special_token_ids"] == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    assert stats["heldout_bytes_per_token"] == pytest.approx(bytes_per_token(tokenizer, [d.text for d in heldout]))
    assert stats["heldout_bytes_per_token"] > 1.0


def test_build_tokenizer_is_deterministic_and_seed_changes_heldout(raw_dir, trained):
    cfg = tokenizer_cfg(heldout_docs=10)
    a_tok, a = build_tokenizer(raw_dir, cfg, seed=7)
    b_tok, b = build_tokenizer(raw_dir, cfg, seed=7)
    assert a == b and a_tok.to_str() == b_tok.to_str()
    _, c = build_tokenizer(raw_dir, cfg, seed=8)
    assert c["train_bytes"] != a["train_bytes"]  # another held-out set (sizes differ with ~certainty)


def test_build_tokenizer_respects_train_bytes(raw_dir):
    manifest = read_json(raw_dir / "manifest.json")
    sizes = [len(d.text.encode("utf-8")) for d in read_documents(raw_dir, manifest)]
    budget = sum(sizes) // 4
    _, stats = build_tokenizer(raw_dir, tokenizer_cfg(train_bytes=budget), seed=7)
    assert 0 < stats["train_bytes"] <= budget
    assert 0 < stats["train_docs"] < len(sizes) - TOKENIZER_CFG["heldout_docs"]


def test_build_tokenizer_refuses_to_hold_out_everything(tmp_path):
    raw = tmp_path / "raw"
    write_raw(download_cfg([{"name": "std", "kind": "stdlib", "include": ["json/*.py"]}]), raw)
    n = read_json(raw / "manifest.json")["rows"]
    with pytest.raises(KilnError, match=rf"heldout_docs={n}\b.*{n} documents"):
        build_tokenizer(raw, tokenizer_cfg(heldout_docs=n), seed=1)


def test_training_bytes_are_sampled_across_sources(tmp_path, monkeypatch):
    """A small budget draws from every source in proportion to its size, not the first source only."""
    monkeypatch.chdir(tmp_path)  # relative paths: document ids, and so the sample, are the same every run
    write_jsonl(Path("a.jsonl"), [{"text": f"alpha {i} " * 40} for i in range(200)])
    write_jsonl(Path("b.jsonl"), [{"text": f"beta {i} " * 40} for i in range(100)])
    raw = tmp_path / "raw"
    sources = [{"name": n, "kind": "local", "paths": [f"{n}.jsonl"], "text_column": "text"} for n in ("a", "b")]
    manifest = write_raw(download_cfg(sources, rows_per_part=50), raw)
    budget = manifest["bytes"] // 4
    _, stats = build_tokenizer(raw, tokenizer_cfg(vocab_size=300, train_bytes=budget), seed=7)
    assert 0 < stats["train_bytes"] <= budget
    assert stats["train_bytes"] == sum(stats["train_bytes_by_source"].values())
    share_b = stats["train_bytes_by_source"]["b"] / stats["train_bytes"]
    assert 0.2 < share_b < 0.47  # b holds about a third of the bytes


def test_pretrained_tokenizer_json_gets_the_missing_special_tokens(tmp_path, raw_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    pretrained = Tokenizer(models.BPE())
    pretrained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    pretrained.decoder = decoders.ByteLevel()
    pretrained.train_from_iterator(
        ["def f(x):\n    return x\n"] * 50,
        trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    path = tmp_path / "pretrained.json"
    pretrained.save(str(path))
    n = pretrained.get_vocab_size()
    tokenizer, stats = build_tokenizer(raw_dir, pretrained_cfg(kind="file", path=str(path)), seed=7)
    assert stats["kind"] == "file" and stats["train_docs"] == 0
    assert stats["special_token_ids"] == {EOS: 0, **{t: n + i for i, t in enumerate(SPECIAL_TOKENS[1:])}}
    assert stats["vocab_size"] == tokenizer.get_vocab_size() == n + 6
    text = "x = '<fim_prefix>' + '<|endoftext|>'"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert not set(ids) & set(stats["special_token_ids"].values()) and tokenizer.decode(ids) == text


def test_unreadable_pretrained_tokenizer_names_the_key_and_file(tmp_path, raw_dir):
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(KilnError, match=rf"tokenizer.path: cannot load '{path}' as a tokenizer.json"):
        build_tokenizer(raw_dir, pretrained_cfg(kind="file", path=str(path)), seed=7)


def test_a_local_tiktoken_encoding_becomes_the_same_tokenizer(tmp_path, raw_dir, tokenizer):
    """Our trained vocabulary, saved as a .tiktoken ranks file, comes back as a tokenizer.json that
    gives the same ids, with every special token at its id."""
    import base64

    path = tmp_path / "kiln.tiktoken"  # tiktoken's format: base64 of a token's bytes, its rank
    ranks = tiktoken_encoding(tokenizer)._mergeable_ranks
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()), encoding="ascii")
    converted, stats = build_tokenizer(raw_dir, pretrained_cfg(kind="tiktoken", path=str(path)), seed=7)
    texts = [d.text for d in read_documents(raw_dir, read_json(raw_dir / "manifest.json"))]
    assert encode_batch(converted, texts) == encode_batch(tokenizer, texts)
    appended = {t: converted.token_to_id(t) for t in SPECIAL_TOKENS}
    assert sorted(appended.values()) == list(range(tokenizer.get_vocab_size(), tokenizer.get_vocab_size() + 7))
    assert stats["heldout_bytes_per_token"] > 1.5


def test_tiktoken_encoding_missing_offline_is_a_clear_error(raw_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(KilnError, match=r"tokenizer.encoding: tiktoken cannot load 'r50k_base' here"):
        build_tokenizer(raw_dir, pretrained_cfg(kind="tiktoken", encoding="r50k_base"), seed=7)
