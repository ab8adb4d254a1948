"""Fill-in-the-middle: deterministic per (seed, document), lossless, at the configured rates, with the
StarCoder2 and seed-000 mixes both expressible."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.config.data_sections import Fim
from kiln.data.fim import MIDDLE, MODES, PREFIX, SUFFIX, fim_pieces, restore_document

FIM = Fim(rate=0.5, psm=0.5, spm=0.25, middle_only=0.25, min_chars=100)
ALWAYS = Fim(rate=1.0, psm=0.5, spm=0.25, middle_only=0.25, min_chars=0)
TEXT = "def add(a, b):\n    return a + b\n" * 10


class Span(str):
    """A document's characters among the pieces: told apart from a sentinel by its type, as fim_pieces
    tells them (a span is a range, a sentinel a string), since a document may spell "<fim_middle>"."""


def fim(text: str, seed: int, doc_id: str, cfg: Fim) -> tuple[str, list]:
    """fim_pieces with each span replaced by its characters (a Span)."""
    mode, pieces = fim_pieces(len(text), seed, doc_id, cfg)
    return mode, [p if isinstance(p, str) else Span(text[p[0] : p[1]]) for p in pieces]


def test_fim_pieces_is_deterministic_in_seed_and_doc_id():
    for i in range(50):
        assert fim_pieces(len(TEXT), 3, f"doc{i}", FIM) == fim_pieces(len(TEXT), 3, f"doc{i}", FIM)


def test_fim_pieces_changes_with_seed_and_doc_id():
    by_seed = {seed: [fim_pieces(len(TEXT), seed, f"doc{i}", ALWAYS) for i in range(20)] for seed in (1, 2)}
    assert by_seed[1] != by_seed[2]
    by_id = [fim_pieces(len(TEXT), 1, f"doc{i}", ALWAYS) for i in range(20)]
    assert len({repr(p) for p in by_id}) > 15


def test_fim_pieces_layout_by_mode():
    seen = set()
    for i in range(200):
        mode, pieces = fim(TEXT, 0, f"d{i}", ALWAYS)
        seen.add(mode)
        specials = [p for p in pieces if not isinstance(p, Span)]
        texts = [p for p in pieces if isinstance(p, Span)]
        assert all(texts)  # no empty text pieces
        if mode == "psm":
            assert specials == [PREFIX, SUFFIX, MIDDLE]
        elif mode == "spm":
            assert specials == [SUFFIX, PREFIX, MIDDLE]
        else:
            assert mode == "middle_only" and specials == [MIDDLE] and "".join(texts) in TEXT
        if mode != "middle_only":
            assert sorted("".join(texts)) == sorted(TEXT)
    assert seen == set(MODES)


def unfim(pieces: list) -> str:
    """Remove the sentinels and put the parts back in document order, by the sentinel before each."""
    parts, label = {}, None
    for piece in pieces:
        if isinstance(piece, Span):
            parts[label] = piece
        else:
            label = piece
    return parts[None] if None in parts else parts.get(PREFIX, "") + parts.get(MIDDLE, "") + parts.get(SUFFIX, "")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    seed=st.integers(min_value=0, max_value=2**32),
    doc_id=st.text(max_size=20),
    shares=st.sampled_from([(0.5, 0.5, 0.0), (0.5, 0.25, 0.25), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)]),
)
def test_removing_sentinels_and_reordering_gives_back_the_document(text, seed, doc_id, shares):
    cfg = ALWAYS.replace(psm=shares[0], spm=shares[1], middle_only=shares[2])
    mode, pieces = fim(text, seed, doc_id, cfg)
    if len(text) < 2:
        assert mode == "none"
    if mode == "middle_only":
        assert unfim(pieces) in text
    else:
        assert unfim(pieces) == text
        assert restore_document(text, fim_pieces(len(text), seed, doc_id, cfg)[1]) == text
    none_mode, none_pieces = fim(text, seed, doc_id, cfg.replace(rate=0.0))
    assert none_mode == "none" and none_pieces == ([text] if text else [])


def test_restore_document_keeps_special_spellings_inside_text():
    text = "x = '<fim_prefix>' + '<fim_middle>' + '<fim_suffix>' + '<|endoftext|>'\n" * 4
    modes = set()
    for i in range(100):
        mode, pieces = fim_pieces(len(text), 5, f"q{i}", ALWAYS)
        modes.add(mode)
        if mode != "middle_only":
            assert restore_document(text, pieces) == text
    assert {"psm", "spm"} <= modes


@pytest.mark.parametrize(
    "fim",
    [
        FIM,
        Fim(rate=0.9, psm=0.1, spm=0.6, middle_only=0.3, min_chars=10),
        Fim(rate=0.2, psm=1.0, spm=0.0, middle_only=0.0, min_chars=0),
        Fim(rate=0.5, psm=0.5, spm=0.5, middle_only=0.0, min_chars=0),
    ],
    ids=["seed-000", "spm-heavy", "psm-only", "starcoder2"],
)
def test_mode_frequencies_match_configured_rates(fim):
    n = 10_000
    counts = {m: 0 for m in ("none", *MODES)}
    for i in range(n):
        mode, _ = fim_pieces(len(TEXT), 11, f"file-{i}.py", fim)
        counts[mode] += 1
    expected = {
        "none": 1 - fim.rate,
        "psm": fim.rate * fim.psm,
        "spm": fim.rate * fim.spm,
        "middle_only": fim.rate * fim.middle_only,
    }
    for mode, p in expected.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[mode] - n * p) <= 4 * sigma + 1e-9, (mode, counts, expected)


def test_rate_zero_never_transforms():
    for i in range(2000):
        assert fim_pieces(len(TEXT), 1, f"z{i}", FIM.replace(rate=0.0)) == ("none", [(0, len(TEXT))])


def test_short_documents_never_transform():
    fim = ALWAYS.replace(min_chars=100)
    assert all(fim_pieces(99, 1, f"s{i}", fim)[0] == "none" for i in range(1000))
    assert all(fim_pieces(100, 1, f"s{i}", fim)[0] != "none" for i in range(1000))
    # Even with min_chars 0 a document needs two characters to be cut.
    assert all(fim_pieces(n, 1, f"s{i}", ALWAYS)[0] == "none" for i in range(200) for n in (0, 1))
