"""Near-duplicate documents: MinHash signatures of word shingles, banded into an LSH index (rensa, a
maintained Rust implementation: bench/near_dup.py measures it against datasketch's own pipeline).

A document is a near duplicate when one of its bands (`rows` consecutive MinHash values) equals the
same band of a document kept before it, of any source: BigCode's rule for The Stack and StarCoder,
which keeps one document of each cluster, here the first in download order, so the outcome is fixed
by the sources' order and the seed. Two documents of Jaccard similarity s share a band with
probability 1 - (1 - s**rows)**bands: 1/2 near (1/bands)**(1/rows), the `threshold` recorded in
the manifest.

Shingles are `shingle` consecutive words, a word being a run of [A-Za-z0-9_] (BigCode's NON_ALPHA
split, without the empty strings it leaves). A document of fewer words than that is never a near
duplicate (exact duplicates are caught before this, by sha256).

Defaults (download.near_dup, kiln.config.data_sections): BigCode's near-deduplication of
The Stack, used for StarCoder: 5-word shingles, Jaccard 0.7 over 256 permutations, which
datasketch's optimal_param turns into 25 bands of 10 rows (250 of the 256 values are ever compared,
so Kiln computes those 250). https://github.com/bigcode-project/bigcode-dataset/blob/main/near_deduplication/minhash_deduplication.py
FineWeb's, for prose: 5-grams, 14 bands of 8 (112 hashes), about 0.75:
https://huggingface.co/spaces/HuggingFaceFW/blogpost-fineweb-v1 ("MinHash deduplication").
"""

from __future__ import annotations

import re

from rensa import RMinHash, RMinHashLSH

from kiln.config.data_sections import NearDupSection

WORD = re.compile(r"[A-Za-z0-9_]+")


def shingles(text: str, size: int) -> list[str]:
    """The document's `size`-word shingles, in order (repeats kept: MinHash sees a set either way)."""
    words = WORD.findall(text)
    return [" ".join(words[i : i + size]) for i in range(len(words) - size + 1)]


def threshold(cfg: NearDupSection) -> float:
    """The Jaccard similarity that the bands catch with probability 1/2."""
    return (1 / cfg.bands) ** (1 / cfg.rows)


def signature(text: str, cfg: NearDupSection) -> RMinHash | None:
    """The document's MinHash, or None when it has fewer words than a shingle."""
    grams = shingles(text, cfg.shingle)
    if not grams:
        return None
    minhash = RMinHash(cfg.bands * cfg.rows, cfg.seed)
    minhash.update(grams)
    return minhash


def signature_bytes(minhash: RMinHash | None) -> bytes | None:
    """A MinHash as rensa serialises it (its digest and parameters, about 1.3 KB at 250 values)."""
    return None if minhash is None else minhash.__getstate__()


def signature_of_bytes(state: bytes | None, cfg: NearDupSection) -> RMinHash | None:
    """The MinHash `signature_bytes` wrote, for the same settings."""
    if state is None:
        return None
    minhash = RMinHash(cfg.bands * cfg.rows, cfg.seed)
    minhash.__setstate__(state)
    return minhash


class NearDupIndex:
    """The documents kept so far, as LSH bands. `admit` answers for a new document and, when it is new,
    adds it under the next key; `forget` takes keys back (a part that was never written)."""

    NAMED = 100_000  # kept documents whose ids are remembered, to name a duplicate's match

    def __init__(self, cfg: NearDupSection):
        self.cfg, self.num_perm = cfg, cfg.bands * cfg.rows
        self.lsh = RMinHashLSH(threshold(cfg), self.num_perm, cfg.bands)
        self.next_key = 0
        self.ids: dict[int, str] = {}

    def admit(self, text: str, doc_id: str) -> tuple[str | None, int | None]:
        """(the id of a kept document `text` nearly duplicates, or "" when that one is not named;
        None when it is new) and the key it was added under (None when not added)."""
        return self.admit_signature(signature(text, self.cfg), doc_id)

    def admit_signature(self, minhash: RMinHash | None, doc_id: str) -> tuple[str | None, int | None]:
        """`admit` for a document whose MinHash was computed elsewhere (a download_part job's)."""
        if minhash is None:
            return None, None
        matches = self.lsh.query(minhash)
        if matches:
            return self.ids.get(min(matches), ""), None
        key, self.next_key = self.next_key, self.next_key + 1
        self.lsh.insert(key, minhash)
        if key < self.NAMED:
            self.ids[key] = doc_id
        return None, key

    def forget(self, keys: list[int]) -> None:
        for key in keys:
            self.lsh.remove(key)
            self.ids.pop(key, None)
