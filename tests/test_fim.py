"""Fill-in-the-middle: deterministic per (seed, document), lossless, at the configured rates."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.data.fim import MIDDLE, MODES, PREFIX, SUFFIX, fim_pieces, restore_document

FIM = {"rate": 0.5, "psm": 0.5, "spm": 0.25, "middle_only": 0.25, "min_chars": 100}
ALWAYS = {"rate": 1.0, "psm": 0.5, "spm": 0.25, "middle_only": 0.25, "min_chars": 0}
TEXT = "def add(a, b):\n    return a + b\n" * 10


def test_fim_pieces_is_deterministic_in_seed_and_doc_id():
    for i in range(50):
        assert fim_pieces(TEXT, 3, f"doc{i}", FIM) == fim_pieces(TEXT, 3, f"doc{i}", FIM)


def test_fim_pieces_changes_with_seed_and_doc_id():
    by_seed = {seed: [fim_pieces(TEXT, seed, f"doc{i}", ALWAYS) for i in range(20)] for seed in (1, 2)}
    assert by_seed[1] != by_seed[2]
    by_id = [fim_pieces(TEXT, 1, f"doc{i}", ALWAYS) for i in range(20)]
    assert len({repr(p) for p in by_id}) > 15


def test_fim_pieces_layout_by_mode():
    seen = set()
    for i in range(200):
        mode, pieces = fim_pieces(TEXT, 0, f"d{i}", ALWAYS)
        seen.add(mode)
        specials = [v for k, v in pieces if k == "special"]
        texts = "".join(v for k, v in pieces if k == "text")
        assert all(k in ("special", "text") for k, _ in pieces)
        assert all(v for k, v in pieces if k == "text")  # no empty text pieces
        if mode == "psm":
            assert specials == [PREFIX, SUFFIX, MIDDLE]
            assert sorted(texts) == sorted(TEXT)
        elif mode == "spm":
            assert specials == [SUFFIX, PREFIX, MIDDLE]
            assert sorted(texts) == sorted(TEXT)
        else:
            assert mode == "middle_only" and specials == [MIDDLE]
            assert texts in TEXT
    assert seen == set(MODES)


@settings(max_examples=200, deadline=None)
@given(text=st.text(), seed=st.integers(min_value=0, max_value=2**32), doc_id=st.text(max_size=20))
def test_restore_document_inverts_psm_spm_and_none(text, seed, doc_id):
    mode, pieces = fim_pieces(text, seed, doc_id, ALWAYS)
    if len(text) < 2:
        assert mode == "none"
    if mode == "middle_only":
        middle = "".join(v for k, v in pieces if k == "text")
        assert middle in text
    else:
        assert restore_document(pieces) == text
    none_mode, none_pieces = fim_pieces(text, seed, doc_id, dict(ALWAYS, rate=0.0))
    assert none_mode == "none" and none_pieces == [("text", text)]
    assert restore_document(none_pieces) == text


def test_restore_document_keeps_special_spellings_inside_text():
    text = "x = '<fim_prefix>' + '<fim_middle>' + '<fim_suffix>' + '<|endoftext|>'\n" * 4
    modes = set()
    for i in range(100):
        mode, pieces = fim_pieces(text, 5, f"q{i}", ALWAYS)
        modes.add(mode)
        if mode != "middle_only":
            assert restore_document(pieces) == text
    assert {"psm", "spm"} <= modes


@pytest.mark.parametrize(
    "fim",
    [
        FIM,
        {"rate": 0.9, "psm": 0.1, "spm": 0.6, "middle_only": 0.3, "min_chars": 10},
        {"rate": 0.2, "psm": 1.0, "spm": 0.0, "middle_only": 0.0, "min_chars": 0},
    ],
    ids=["default", "spm-heavy", "psm-only"],
)
def test_mode_frequencies_match_configured_rates(fim):
    n = 10_000
    counts = {m: 0 for m in ("none", *MODES)}
    for i in range(n):
        mode, _ = fim_pieces(TEXT, 11, f"file-{i}.py", fim)
        counts[mode] += 1
    expected = {
        "none": 1 - fim["rate"],
        "psm": fim["rate"] * fim["psm"],
        "spm": fim["rate"] * fim["spm"],
        "middle_only": fim["rate"] * fim["middle_only"],
    }
    for mode, p in expected.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[mode] - n * p) <= 4 * sigma + 1e-9, (mode, counts, expected)


def test_rate_zero_never_transforms():
    for i in range(2000):
        assert fim_pieces(TEXT, 1, f"z{i}", dict(FIM, rate=0.0)) == ("none", [("text", TEXT)])


def test_short_documents_never_transform():
    fim = dict(ALWAYS, min_chars=100)
    short, long = "s" * 99, "s" * 100
    assert all(fim_pieces(short, 1, f"s{i}", fim)[0] == "none" for i in range(1000))
    assert all(fim_pieces(long, 1, f"s{i}", fim)[0] != "none" for i in range(1000))
    # Even with min_chars 0 a document needs two characters to be cut.
    assert all(fim_pieces(t, 1, f"s{i}", ALWAYS)[0] == "none" for i in range(200) for t in ("", "a"))
