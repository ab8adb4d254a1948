"""Fill-in-the-middle: rearrange a document so the model learns to write a span from its context.

Character level (bigcode Megatron, StarCoder2): two sorted random cut points split the text into
prefix P, middle M and suffix S, and each part is tokenized on its own. Formats, as in seed 000:
  PSM          <fim_prefix> P <fim_suffix> S <fim_middle> M
  SPM          <fim_suffix> S <fim_prefix> P <fim_middle> M
  middle-only  <fim_middle> M
`rate` is the share of documents transformed; `psm`, `spm` and `middle_only` split that share
(StarCoder2: 0.5/0.5/0; seed 000: 0.5/0.25/0.25). The caller appends <|endoftext|>. The random draws
come from a generator seeded by (seed, document id) alone, so the same document gets the same
transform whatever the worker count, order or resume point: the flaw in Megatron's loader, whose RNG
lived in the dataset object, does not arise. Parts are spans (start, end) of the text, not copies.
"""

from __future__ import annotations

import random

from kiln.config.data_sections import Fim
from kiln.io import stable_hash

PREFIX, MIDDLE, SUFFIX = "<fim_prefix>", "<fim_middle>", "<fim_suffix>"
MODES = ("psm", "spm", "middle_only")

# A piece is a sentinel's spelling (str) or the characters [start, end) of the document.
Piece = str | tuple[int, int]


def fim_rng(seed: int, doc_id: str) -> random.Random:
    return random.Random(stable_hash(seed, "fim", doc_id))


def choose_mode(rng: random.Random, fim: Fim, n_chars: int) -> str:
    """'none' or one of MODES, drawn with the configured rate and shares."""
    if n_chars < max(fim.min_chars, 2) or rng.random() >= fim.rate:
        return "none"
    draw = rng.random()
    if draw < fim.psm:
        return "psm"
    if draw < fim.psm + fim.spm:
        return "spm"
    return "middle_only"


def fim_pieces(n_chars: int, seed: int, doc_id: str, fim: Fim) -> tuple[str, list[Piece]]:
    """The mode drawn for a document of n_chars characters, and its pieces in training order
    (sentinels and non-empty spans; EOS not included)."""
    rng = fim_rng(seed, doc_id)
    mode = choose_mode(rng, fim, n_chars)
    if mode == "none":
        return mode, [(0, n_chars)] if n_chars else []
    lo, hi = sorted(rng.randrange(n_chars + 1) for _ in range(2))
    prefix, middle, suffix = (0, lo), (lo, hi), (hi, n_chars)
    if mode == "psm":
        order = [PREFIX, prefix, SUFFIX, suffix, MIDDLE, middle]
    elif mode == "spm":
        order = [SUFFIX, suffix, PREFIX, prefix, MIDDLE, middle]
    else:
        order = [MIDDLE, middle]
    return mode, [p for p in order if isinstance(p, str) or p[1] > p[0]]


def restore_document(text: str, pieces: list[Piece]) -> str:
    """Inverse of a PSM/SPM/none transform: each span is labelled by the sentinel before it; drop the
    sentinels and join prefix, middle and suffix (middle-only gives back just the middle)."""
    parts: dict[str | None, str] = {}
    label = None
    for piece in pieces:
        if isinstance(piece, str):
            label = piece
        else:
            parts[label] = text[piece[0] : piece[1]]
    if None in parts:
        return parts[None]
    return parts.get(PREFIX, "") + parts.get(MIDDLE, "") + parts.get(SUFFIX, "")
