"""Fill-in-the-middle: rearrange a document so the model learns to write a span from its context.

Character level (bigcode Megatron, StarCoder2): two sorted random cut points split the text into
prefix P, middle M and suffix S, and each part is tokenized on its own. Formats, as in seed 000:
  PSM          <fim_prefix> P <fim_suffix> S <fim_middle> M
  SPM          <fim_suffix> S <fim_prefix> P <fim_middle> M
  middle-only  <fim_middle> M
The caller appends <|endoftext|>. The random draws come from a generator seeded by (seed, document
id) alone, so the same document gets the same transform whatever the worker count, order or resume
point: the flaw in Megatron's loader, whose RNG lived in the dataset object, does not arise.
"""

from __future__ import annotations

import random

from kiln.io import stable_hash

PREFIX, MIDDLE, SUFFIX = "<fim_prefix>", "<fim_middle>", "<fim_suffix>"
MODES = ("psm", "spm", "middle_only")

# A piece is ("special", token) or ("text", string); text pieces are tokenized separately.
Piece = tuple[str, str]


def fim_rng(seed: int, doc_id: str) -> random.Random:
    return random.Random(stable_hash(seed, "fim", doc_id))


def choose_mode(rng: random.Random, fim: dict, n_chars: int) -> str:
    """'none' or one of MODES, drawn with the configured rate and shares."""
    if n_chars < max(fim["min_chars"], 2) or rng.random() >= fim["rate"]:
        return "none"
    draw = rng.random()
    if draw < fim["psm"]:
        return "psm"
    if draw < fim["psm"] + fim["spm"]:
        return "spm"
    return "middle_only"


def fim_pieces(text: str, seed: int, doc_id: str, fim: dict) -> tuple[str, list[Piece]]:
    """The document's mode and its pieces in training order (EOS not included)."""
    rng = fim_rng(seed, doc_id)
    mode = choose_mode(rng, fim, len(text))
    if mode == "none":
        return mode, [("text", text)]
    lo, hi = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    prefix, middle, suffix = text[:lo], text[lo:hi], text[hi:]
    if mode == "psm":
        order = [PREFIX, prefix, SUFFIX, suffix, MIDDLE, middle]
    elif mode == "spm":
        order = [SUFFIX, suffix, PREFIX, prefix, MIDDLE, middle]
    else:
        order = [MIDDLE, middle]
    pieces = [("special", p) if i % 2 == 0 else ("text", p) for i, p in enumerate(order)]
    return mode, [p for p in pieces if p[0] == "special" or p[1]]


def restore_document(pieces: list[Piece]) -> str:
    """Inverse of a PSM/SPM/none transform: the original text (middle-only keeps just the middle)."""
    parts: dict[str, str] = {}
    current = None
    for kind, value in pieces:
        if kind == "special":
            current = value
            parts.setdefault(current, "")
        else:
            parts[current] = parts.get(current, "") + value
    if not parts or list(parts) == [None]:
        return parts.get(None, "")
    return parts.get(PREFIX, "") + parts.get(MIDDLE, "") + parts.get(SUFFIX, "")
