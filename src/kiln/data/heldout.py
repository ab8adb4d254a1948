"""Decontamination against the run's own held-out split: a train sample that shares a run of
`pretokenize.heldout_ngram` words with a held-out document is left out of train.bin, so the
validation loss is not measured on text the model trained on.

Words are kiln.data.near_dup's (runs of [A-Za-z0-9_]), so formatting cannot hide a copy. The default
is 50 words. bench/heldout_overlap.py (last in the tree at 24e9373; docs/benchmarks.md) measured the shorter lengths on the stdlib: GPT-3's 13 would
drop 6% of the train documents (licence headers), and 13 tokens 64% (code's idioms), where 50 words
find the 4 documents that hold a copied docstring (docs/benchmarks.md, "The held-out split's n-gram
overlap"). Exact and near duplicates are already gone at download. An n-gram counts only when at most
`pretokenize.heldout_guard` train samples hold it (`removals`): text that many share is boilerplate, a
licence header of 90 words in thousands of files, and would otherwise take every one of them with a
held-out file that carries it.

The held-out split is chosen in pretokenize (kiln.data.pretokenize), after the tokenizer, so this
runs there: between choosing the split and cutting the train side, in worker processes.
`heldout_grams` hashes the held-out documents' n-grams (one task per part holding some), and
`overlapping_samples` scans one part's other samples against them (one task per part): a second
pass over the text, spread like the encoding. Each n-gram is a 64-bit hash of its words' CRC-32s
(kiln.data.ngram_hash); a collision can only remove a sample, at about (held-out n-grams x train
words) / 2^64.
"""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kiln.data.near_dup import WORD
from kiln.data.ngram_hash import ngram_hashes
from kiln.data.packing import group_samples
from kiln.data.sources import read_part, read_rows

EXAMPLES = 20  # removed samples meta.json names, with why


def _words(text: str) -> list[str]:
    return WORD.findall(text)


def _word_ngrams(words: list[str], n: int) -> np.ndarray:
    ids = np.fromiter((zlib.crc32(w.encode()) for w in words), dtype=np.uint64, count=len(words))
    return ngram_hashes(ids, n)


def _repos(path: Path) -> list[str | None]:
    return [m.get("repo") for m in pq.read_table(path, columns=["metadata"]).column("metadata").to_pylist()]


def heldout_grams(task: tuple[str, list[int], int, bool]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The n-gram hashes of the documents of part `path`'s samples that start at `rows` (held out),
    each with the index of its document in the returned document ids."""
    path, rows, n, repo_context = task
    starts = set(rows)
    groups = [g for g in group_samples(_repos(Path(path)), repo_context) if g[0] in starts]
    docs = read_rows(Path(path), {i for g in groups for i in g})
    grams, owners, ids = [np.empty(0, np.uint64)], [np.empty(0, np.int64)], []
    for row in sorted(docs):
        hashes = _word_ngrams(_words(docs[row].text), n)
        grams.append(hashes)
        owners.append(np.full(len(hashes), len(ids), dtype=np.int64))
        ids.append(docs[row].id)
    return np.concatenate(grams), np.concatenate(owners), ids


def save_index(path: Path, found: list[tuple[np.ndarray, np.ndarray, list[str]]]) -> int:
    """Write the held-out n-grams (heldout_grams' results), sorted and unique, each with the id of
    the first held-out document holding it; return how many there are."""
    grams, owners, ids = [np.empty(0, np.uint64)], [np.empty(0, np.int64)], []
    for hashes, local, doc_ids in found:
        grams.append(hashes)
        owners.append(local + len(ids))
        ids.extend(doc_ids)
    grams, owners = np.concatenate(grams), np.concatenate(owners)
    order = np.argsort(grams, kind="stable")
    unique, first = np.unique(grams[order], return_index=True)
    np.savez(path, grams=unique, owners=owners[order][first], ids=np.asarray(ids, dtype=str))
    return len(unique)


def overlapping_samples(task: tuple[int, str, frozenset[int], str, int, bool]) -> list[dict]:
    """The samples of part `path` not starting at a row in `skip` (the held-out ones) that hold a
    held-out n-gram of the index at `index_path`: {part, row, doc_ids, grams: {n-gram's place in the
    index: where the sample holds it first, in words}} each, in row order."""
    index, path, skip, index_path, n, repo_context = task
    with np.load(index_path) as saved:
        grams = saved["grams"]
    if not len(grams):
        return []
    docs = read_part(Path(path))
    found = []
    for group in group_samples([d.repo for d in docs], repo_context):
        if group[0] in skip:
            continue
        held: dict[int, str] = {}
        for i in group:
            words = _words(docs[i].text)
            hashes = _word_ngrams(words, n)
            at = np.searchsorted(grams, hashes).clip(max=len(grams) - 1)
            for first in np.flatnonzero(grams[at] == hashes).tolist():
                held.setdefault(int(at[first]), " ".join(words[first : first + 6]))
        if held:
            found.append({"part": index, "row": group[0], "doc_ids": [docs[j].id for j in group], "grams": held})
    return found


def removals(found: list[dict], index_path: Path, n: int, guard: int) -> list[dict]:
    """Of the samples `overlapping_samples` found (every part's, in order), those holding a held-out
    n-gram that at most `guard` train samples hold: {part, row, doc_ids, why}. An n-gram more train
    samples hold is boilerplate (a licence header), not a copy of the held-out document."""
    holders = Counter(gram for sample in found for gram in sample["grams"])
    with np.load(index_path) as saved:
        owners, ids = saved["owners"], saved["ids"]
    removed = []
    for sample in found:
        rare = [gram for gram in sample["grams"] if holders[gram] <= guard]
        if rare:
            gram = rare[0]
            why = (
                f"shares {sample['grams'][gram]} ... ({n} words, in {holders[gram]} train samples) with "
                f"held-out {ids[owners[gram]]}"
            )
            removed.append({"part": sample["part"], "row": sample["row"], "doc_ids": sample["doc_ids"], "why": why})
    return removed
