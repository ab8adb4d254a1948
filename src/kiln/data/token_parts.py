"""One raw part's tokens as a pretokenize_part job leaves them for the gather (the pretokenize job):
the one owner of what is inside that folder (kiln.layout.Layout.part names it).

    train.bin    every sample of the part laid out for training (FIM), ids one after another
    samples.npy  int64, one row per sample: its first row in the raw part, then COUNT_COLUMNS
    val.bin      the first validation round's candidates of the part, encoded plain
    part.json    what made it (kiln.data.token_plan.Plan.stamp) and the candidates (val_candidates' dicts)

A part holds every sample on the train side, the validation candidates too: which of them the
validation split takes is decided across all parts, by the gather. The gather compares part.json's
stamp with its own plan, so a part made from another raw part, encoder or validation round is an
error, never spliced into train.bin.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.data.tokenize_parts import COUNT_COLUMNS
from kiln.errors import KilnError
from kiln.io import read_json, write_json

TRAIN, SAMPLES, VAL, STAMP = "train.bin", "samples.npy", "val.bin", "part.json"


def sample_offsets(counts: np.ndarray) -> np.ndarray:
    """Where each sample's ids start in a file that holds them one after another (counts: COUNT_COLUMNS
    rows, tokens first)."""
    return np.concatenate([[0], np.cumsum(counts[:, 0])[:-1]]).astype(np.int64)


@dataclass(frozen=True)
class EncodedPart:
    """A part folder read back: the file of its train-side ids, each sample's first raw row and
    counts (COUNT_COLUMNS), and the validation candidates of the round its stamp names."""

    folder: Path
    rows: np.ndarray
    counts: np.ndarray
    candidates: list[dict]

    @property
    def train_file(self) -> Path:
        return self.folder / TRAIN

    @property
    def offsets(self) -> np.ndarray:
        """Each sample's first token in train.bin."""
        return sample_offsets(self.counts)


def write(folder: Path, rows: np.ndarray, counts: np.ndarray, candidates: list[dict], stamp: dict) -> None:
    """samples.npy and part.json, in a folder whose train.bin (and val.bin, when there are
    candidates) the encoding has written; the candidates' `file` is stored relative to the folder."""
    samples = np.column_stack([np.asarray(rows, dtype=np.int64), counts]).astype(np.int64)
    np.save(folder / SAMPLES, samples.reshape(len(rows), 1 + len(COUNT_COLUMNS)))
    stored = [{**c, "file": VAL} for c in candidates]
    write_json(folder / STAMP, {"stamp": stamp, "candidates": stored})


def read(folder: Path, stamp: dict) -> EncodedPart:
    """The part in `folder`, checked against the stamp the gather's own plan gives it."""
    folder = Path(folder)
    if not (folder / STAMP).is_file():
        raise KilnError(f"pretokenize: {folder} has no {STAMP}: not a finished pretokenize_part output")
    saved = read_json(folder / STAMP)
    if saved["stamp"] != stamp:
        differ = sorted(k for k in {*stamp, *saved["stamp"]} if saved["stamp"].get(k) != stamp.get(k))
        raise KilnError(
            f"pretokenize: {folder} was encoded under another plan ({', '.join(differ)} differ: "
            f"{ {k: saved['stamp'].get(k) for k in differ} } there, { {k: stamp.get(k) for k in differ} } now); "
            "delete the folder and rerun"
        )
    samples = np.load(folder / SAMPLES)
    candidates = [{**c, "file": str(folder / c["file"])} for c in saved["candidates"]]
    return EncodedPart(folder, samples[:, 0], samples[:, 1:], candidates)
