"""The pretokenize stage's work on one raw part, run in worker processes, and the pool that runs it.

Two jobs, both pure functions of (part, settings), so the output never depends on the worker count,
both streaming ids to a file so that memory stays bounded whatever the size of a document:
- `val_candidates`: the samples of a part whose split hash falls in [lo, hi), encoded plain;
- `train_part`: every sample of a part but the held-out ones, laid out with FIM, its ids streamed to
  a file; returns each sample's first row and one row of counts per sample, so the caller can cut
  at a token budget (or, for a part encoded whole, take the held-out ones out later).
Each worker builds its encoder once (`init_worker`). `WorkerPool.imap` keeps a bounded number of
parts in flight and yields results in task order, so memory does not grow with the corpus.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.config.data_sections import Fim
from kiln.data.encoders import Encoder
from kiln.data.packing import BOS, group_samples, metadata_bytes, sample_pieces
from kiln.data.sources import read_part, read_rows
from kiln.data.tokenizer import bos_id, load_tokenizer, role_ids
from kiln.data.utf8text import utf8_size
from kiln.io import stable_hash

# Columns of train_part's per-sample counts.
COUNT_COLUMNS = ("tokens", "docs", "bytes", "none", "psm", "spm", "middle_only")
_BATCH_SAMPLES = 256  # samples whose short spans are encoded in one call
_FLUSH_TOKENS = 1 << 20

_worker: dict = {}


@dataclass(frozen=True)
class Settings:
    tokenizer_path: str
    backend: str
    dtype: str
    seed: int
    fim: Fim
    repo_context: bool
    max_chars: int
    bos: bool = False  # every sample starts with the tokenizer's BOS (kiln.data.tokenizer.bos_token)


def _exit_with_parent(parent_pid: int) -> None:
    """A pool worker whose parent was SIGKILLed (no chance to shut the pool down) would wait for tasks
    forever: it exits as soon as it is reparented."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="kiln-parent-watch", daemon=True).start()


def init_worker(settings: Settings) -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
        _exit_with_parent(parent.pid)
    tokenizer = load_tokenizer(settings.tokenizer_path)
    _worker["settings"] = settings
    _worker["encoder"] = Encoder(tokenizer, settings.backend, settings.dtype, settings.max_chars)
    # Pieces name roles by Kiln's spellings; an hf tokenizer may spell them its own way (token_roles).
    roles = role_ids(tokenizer, settings.tokenizer_path)
    _worker["ids"] = {t: np.array([i], dtype=settings.dtype) for t, i in roles.items()}  # the roles it holds
    if settings.bos:
        _worker["ids"][BOS] = np.array([bos_id(tokenizer)], dtype=settings.dtype)


def split_hash(sample_id: str) -> int:
    """A sample's place in the train/val order: a hash of its id alone (stable across seeds)."""
    return stable_hash("split", sample_id)


class _Sink:
    """Collects id arrays and writes them to a file every ~1M tokens (bounded memory)."""

    def __init__(self, file):
        self.file, self.chunks, self.buffered = file, [], 0

    def add(self, ids: np.ndarray) -> None:
        self.chunks.append(ids)
        self.buffered += len(ids)
        if self.buffered >= _FLUSH_TOKENS:
            self.flush()

    def flush(self) -> None:
        if self.chunks:
            np.concatenate(self.chunks).tofile(self.file)
        self.chunks, self.buffered = [], 0


def _encode_samples(samples: list[list], sink: _Sink) -> list[int]:
    """Append the ids of each sample's pieces to sink; return each sample's token count."""
    encoder, special = _worker["encoder"], _worker["ids"]
    counts = []
    for start in range(0, len(samples), _BATCH_SAMPLES):
        batch = samples[start : start + _BATCH_SAMPLES]
        short = [
            p[0][p[1] : p[2]]
            for pieces in batch
            for p in pieces
            if not isinstance(p, str) and p[2] - p[1] <= encoder.max_chars
        ]
        encoded = iter(encoder.encode(short))
        for pieces in batch:
            n = 0
            for piece in pieces:
                if isinstance(piece, str):
                    chunks = [special[piece]]
                elif piece[2] - piece[1] <= encoder.max_chars:
                    chunks = [next(encoded)]
                else:
                    chunks = encoder.encode_long(*piece)
                for ids in chunks:
                    sink.add(ids)
                    n += len(ids)
            counts.append(n)
    return counts


def _read_ids_and_repos(path: Path) -> tuple[list[str], list[str | None]]:
    table = pq.read_table(path, columns=["id", "metadata"])
    return table.column("id").to_pylist(), [m.get("repo") for m in table.column("metadata").to_pylist()]


def val_candidates(task: tuple[int, str, int, int, str]) -> list[dict]:
    """Samples of part `path` whose split hash h has lo <= h < hi, encoded plain, their ids written
    one after another to out_path; for each: hash, first row, document ids, bytes, tokens and offset."""
    index, path, lo, hi, out_path = task
    settings = _worker["settings"]
    ids, repos = _read_ids_and_repos(Path(path))
    groups = [g for g in group_samples(repos, settings.repo_context) if lo <= split_hash(ids[g[0]]) < hi]
    if not groups:
        return []
    docs = read_rows(Path(path), {i for group in groups for i in group}, settings.max_chars)
    samples = [[docs[i] for i in group] for group in groups]
    with open(out_path, "wb") as f:
        sink = _Sink(f)
        tokens = _encode_samples(
            [sample_pieces(m, settings.repo_context, None, settings.seed, Counter(), settings.bos) for m in samples],
            sink,
        )
        sink.flush()
    offsets = np.cumsum([0, *tokens[:-1]]).tolist()
    return [
        {
            "hash": split_hash(ids[group[0]]),
            "part": index,
            "row": group[0],
            "doc_ids": [d.id for d in members],
            "bytes": sum(utf8_size(d.text) for d in members) + metadata_bytes(members, settings.repo_context),
            "tokens": n,
            "file": out_path,
            "offset": offset,
        }
        for group, members, n, offset in zip(groups, samples, tokens, offsets)
    ]


def train_part(task: tuple[int, str, frozenset[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """Write the FIM-laid-out ids of every sample of part `path` except those starting at a row in
    `skip` to out_path; return their first rows and their counts, one row per sample (COUNT_COLUMNS)."""
    _, path, skip, out_path = task
    settings = _worker["settings"]
    docs = read_part(Path(path), settings.max_chars)
    groups = [g for g in group_samples([d.repo for d in docs], settings.repo_context) if g[0] not in skip]
    counts = np.zeros((len(groups), len(COUNT_COLUMNS)), dtype=np.int64)
    samples = []
    for row, group in enumerate(groups):
        members = [docs[i] for i in group]
        modes: Counter = Counter()
        samples.append(sample_pieces(members, settings.repo_context, settings.fim, settings.seed, modes, settings.bos))
        counts[row, 1] = len(members)
        counts[row, 2] = sum(utf8_size(d.text) for d in members) + metadata_bytes(members, settings.repo_context)
        counts[row, 3:] = [modes[m] for m in COUNT_COLUMNS[3:]]
    with open(out_path, "wb") as f:
        sink = _Sink(f)
        counts[:, 0] = _encode_samples(samples, sink)
        sink.flush()
    del docs, samples
    pa.default_memory_pool().release_unused()  # hand a long document's Arrow memory back now
    return np.array([g[0] for g in groups], dtype=np.int64), counts


class WorkerPool:
    """`workers` processes with an initialised encoder each (in-process when workers is 1)."""

    def __init__(self, workers: int, settings: Settings):
        self.workers = workers
        if workers == 1:
            init_worker(settings)
            self.executor = None
        else:
            self.executor = ProcessPoolExecutor(workers, initializer=init_worker, initargs=(settings,))

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)

    def imap(self, fn: Callable, tasks: Iterable) -> Iterator:
        """fn over tasks, results in task order, at most 2 x workers tasks in flight; `tasks` may be
        a generator that looks at what was consumed so far."""
        if self.executor is None:
            yield from map(fn, tasks)
            return
        pending: deque = deque()
        for task in tasks:
            pending.append(self.executor.submit(fn, task))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
