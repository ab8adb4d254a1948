"""Token ids at tiktoken speed for a byte-level BPE, and the bridge between tiktoken and `tokenizers`.

tiktoken can carry a BPE trained by Hugging Face `tokenizers`: a byte-level vocabulary spells tokens
with GPT-2's byte-to-unicode table, so mapping each token back to its bytes gives tiktoken's
`mergeable_ranks` (rank = id, which follows merge order in a trained vocabulary), with the same split
pattern and the special tokens beside. Whether the ids then match is an empirical question: the
pretokenize stage checks them on a sample before it trusts tiktoken, and the tests check the whole
default corpus. The other direction turns a tiktoken encoding into a tokenizer.json, merges recovered
from the ranks, so a run can start from an encoding such as GPT-2's.

`Encoder` is what the pretokenize workers call: special tokens are never parsed from text (Kiln puts
their ids in itself), and a text longer than `max_chars` is encoded a slice at a time, each slice cut
just before a space that follows a non-space character. With a GPT-2/cl100k-style split pattern no
pre-token crosses such a point, so the ids equal those of the whole text while memory stays bounded.
"""

from __future__ import annotations

import json
import logging
from typing import Iterator

import numpy as np
import tiktoken
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from kiln.errors import KilnError

log = logging.getLogger("kiln.encoders")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MAX_CHARS = 1 << 20  # longer texts are encoded in slices of at most this many characters


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte as a printable character, so byte-level tokens are plain strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _split_pattern(pre_tokenizer: dict | None) -> str:
    """The regex a byte-level pre-tokenizer splits with, or a KilnError saying why there is none."""
    kind = (pre_tokenizer or {}).get("type")
    if kind == "ByteLevel" and pre_tokenizer.get("use_regex", True) and not pre_tokenizer.get("add_prefix_space"):
        return GPT2_PATTERN
    if kind == "Sequence":
        steps = pre_tokenizer["pretokenizers"]
        if (
            len(steps) == 2
            and steps[0]["type"] == "Split"
            and "Regex" in steps[0]["pattern"]
            and steps[0]["behavior"] == "Isolated"
            and not steps[0].get("invert")
            and steps[1]["type"] == "ByteLevel"
            and not steps[1].get("use_regex", True)
            and not steps[1].get("add_prefix_space")
        ):
            return steps[0]["pattern"]["Regex"]
    raise KilnError(f"pre-tokenizer {json.dumps(pre_tokenizer)} is not a byte-level split tiktoken can reproduce")


def tiktoken_encoding(tokenizer: Tokenizer, name: str = "kiln") -> tiktoken.Encoding:
    """tiktoken carrying a byte-level BPE tokenizer; KilnError naming the reason when it cannot."""
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    if model.get("type") != "BPE" or spec.get("normalizer"):
        raise KilnError("tiktoken needs a BPE model without a normalizer")
    if (
        model.get("dropout")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or model.get("byte_fallback")
    ):
        raise KilnError("tiktoken cannot reproduce BPE dropout, subword prefixes/suffixes or byte fallback")
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    if not all(t["special"] for t in spec.get("added_tokens", [])):
        raise KilnError("tiktoken cannot reproduce non-special added tokens")
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for token, token_id in model["vocab"].items():
        if token in added:
            continue
        if any(char not in to_byte for char in token):
            raise KilnError(f"vocabulary token {token!r} is not byte-level")
        ranks[bytes(to_byte[char] for char in token)] = token_id
    if len(ranks) != len(model["vocab"]) - len(set(added) & set(model["vocab"])):
        raise KilnError("two vocabulary tokens spell the same bytes")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise KilnError("the vocabulary lacks some of the 256 single bytes")
    merged = [
        ranks[bytes(to_byte[c] for c in "".join(pair.split(" ") if isinstance(pair, str) else pair))]
        for pair in model["merges"]
    ]
    if merged != sorted(merged):
        raise KilnError("token ids do not follow merge order, so they cannot serve as tiktoken ranks")
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)


def _merge_of(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes] | None:
    """The pair whose merge makes `token`: BPE on its bytes using only lower ranks, stopped at two."""
    parts = [bytes([b]) for b in token]
    limit = ranks[token]
    while len(parts) > 2:
        best = min(((ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1)), default=(limit, -1))
        if best[0] >= limit:
            return None
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def tokenizer_from_tiktoken(encoding: tiktoken.Encoding, extra_special: tuple[str, ...] = ()) -> Tokenizer:
    """A tokenizers BPE giving the same ids as `encoding`, with `extra_special` tokens appended after
    its own. Merges are recovered from the ranks; like tiktoken, a pre-token that is a whole vocabulary
    entry maps to it directly (ignore_merges). Special tokens sit in the vocabulary only to keep their
    ids (tokenizers renumbers added tokens it does not find there); no merge leads to them and their
    spellings are split by the pattern, so no text turns into one."""
    ranks = encoding._mergeable_ranks  # tiktoken exposes no public accessor for its ranks
    to_char = bytes_to_unicode()

    def spell(data: bytes) -> str:
        return "".join(to_char[b] for b in data)

    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            pair = _merge_of(ranks, token)
            if pair is None:
                raise KilnError(f"tiktoken encoding {encoding.name!r}: token {token!r} is not the merge of two tokens")
            merges.append((spell(pair[0]), spell(pair[1])))
    special = dict(encoding._special_tokens)
    next_id = max([*ranks.values(), *special.values()]) + 1
    for token in extra_special:
        if token not in special:
            special[token] = next_id
            next_id += 1
    vocab = {spell(t): r for t, r in ranks.items()} | special
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    if encoding._pat_str == GPT2_PATTERN:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(encoding._pat_str), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.encode_special_tokens = True
    return tokenizer


def safe_slices(text, start: int, end: int, max_chars: int = MAX_CHARS) -> Iterator[tuple[int, int]]:
    """[start, end) of a text (str or Utf8Text) as consecutive slices of at most max_chars, each cut
    just before a space that follows a non-space (no pre-token crosses such a point), searched for in
    the second half of the slice; a hard cut, logged, only where that half holds no such space."""
    while end - start > max_chars:
        floor = start + max_chars // 2
        window = text[floor : start + max_chars + 1]  # characters floor .. start + max_chars
        at = window.rfind(" ")
        while at > 0 and window[at - 1].isspace():
            at = window.rfind(" ", 0, at)
        if at > 0:
            cut = floor + at
        else:
            cut = start + max_chars
            log.warning(
                "no safe cut in %d characters at offset %d: cut there; ids may differ from a "
                "whole-text encoding at that point",
                max_chars,
                start,
            )
        yield start, cut
        start = cut
    yield start, end


class Encoder:
    """Ids of texts in `dtype` arrays, by tiktoken or by `tokenizers`, special spellings kept as text."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        backend: str,
        dtype=np.uint32,
        max_chars: int = MAX_CHARS,
        encoding: tiktoken.Encoding | None = None,
    ):
        self.tokenizer, self.backend, self.dtype, self.max_chars = tokenizer, backend, np.dtype(dtype), max_chars
        self.tiktoken = (encoding or tiktoken_encoding(tokenizer)) if backend == "tiktoken" else None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text, whole (the caller keeps texts below max_chars, or uses encode_long)."""
        if self.tiktoken is not None:
            return [
                self.tiktoken.encode_to_numpy(t, disallowed_special=()).astype(self.dtype, copy=False) for t in texts
            ]
        return [
            np.asarray(e.ids, dtype=self.dtype)
            for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ]

    def encode_long(self, text: str, start: int, end: int) -> Iterator[np.ndarray]:
        """Ids of text[start:end], one slice of at most max_chars characters at a time."""
        for a, b in safe_slices(text, start, end, self.max_chars):
            yield from self.encode([text[a:b]])
