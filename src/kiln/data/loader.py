"""Batches for training and evaluation, read straight from memory-mapped shards.

Training order is a pure function of (seed, epoch): each epoch is one permutation of all rows, and
rank r of W takes every W-th row of it, so ranks read disjoint data and the order does not depend on
anything but the seed. The loader's position is two integers (epoch, batch), saved in checkpoints
and restored on resume, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from kiln.data.shards import open_shard, verify_shard
from kiln.errors import KilnError
from kiln.io import read_json


class ShardChecks:
    """Every shard verified once (kiln.data.shards.verify_shard: ids below the vocabulary, sha256
    against the manifest) before any of its rows is served. Background threads go through the
    shards in order while the model is built and the first steps run; a shard needed before they
    reach it is verified by the thread that needs it, and one they are on is waited for. A failure
    found in any shard is raised by the next `require`, so a bad shard stops the run as soon as it
    is found, not only when its rows come up."""

    def __init__(self, paths: list[Path], entries: list[dict], vocab_size: int | None, threads: int = 1):
        self._jobs = list(zip(paths, entries))
        self._vocab = vocab_size
        self._lock = threading.Lock()
        self._claimed = [False] * len(paths)
        self._done = [threading.Event() for _ in paths]
        self._errors: dict[int, BaseException] = {}
        self.ok = np.zeros(len(paths), dtype=bool)
        self.complete = not paths  # every shard passed: take() skips the checks
        self._next = 0
        self._threads = [threading.Thread(target=self._background, name="kiln-shard-verify", daemon=True)
                         for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def _claim(self, i: int) -> bool:
        with self._lock:
            mine, self._claimed[i] = not self._claimed[i], True
            return mine

    def _verify(self, i: int) -> None:
        try:
            verify_shard(*self._jobs[i], self._vocab)
        except BaseException as exc:  # re-raised in the thread that needs the rows
            self._errors[i] = exc
        else:
            with self._lock:
                self.ok[i] = True
                self.complete = bool(self.ok.all())
        finally:
            self._done[i].set()

    def _background(self) -> None:
        while not self._errors:
            with self._lock:
                while self._next < len(self._jobs) and self._claimed[self._next]:
                    self._next += 1
                if self._next == len(self._jobs):
                    return
                i, self._claimed[i] = self._next, True
            self._verify(i)

    def wait(self) -> None:
        """Block until the background threads stop: every shard checked, or a failure found."""
        for thread in self._threads:
            thread.join()

    def require(self, shards) -> None:
        """Return once every shard in `shards` has passed; raise the first failure found so far.
        The needed shards no background thread has started on are verified here, first; then the
        ones a background thread is on are waited for."""
        pending = [i for i in shards if not self.ok[i]]
        for i in pending:
            if self._errors:
                break
            if self._claim(i):
                self._verify(i)
        for i in pending:
            if self._errors:
                break
            self._done[i].wait()
        if self._errors:
            raise self._errors[min(self._errors)]


class ShardRows:
    """The rows of one split, across its shards, addressable by a global row index. With `verify`
    (the default) no row is served from a shard before that shard has passed ShardChecks."""

    def __init__(self, shard_dir: str | Path, split: str, *, verify: bool = True, verify_threads: int = 1):
        shard_dir = Path(shard_dir)
        self.manifest = read_json(shard_dir / "manifest.json")
        entries = self.manifest["splits"][split]["shards"]
        self.shards = [open_shard(shard_dir / e["file"]) for e in entries]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.row_len = int(self.manifest["row_len"])
        self.checks = ShardChecks([shard_dir / e["file"] for e in entries], entries,
                                  self.manifest.get("vocab_size"), verify_threads) if verify else None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, indices: np.ndarray) -> torch.Tensor:
        """Rows at the given global indices as an int64 tensor (len(indices), row_len)."""
        which = np.searchsorted(self.starts, indices, side="right") - 1
        if self.checks is not None and not self.checks.complete:
            self.checks.require(np.unique(which))
        out = np.empty((len(indices), self.row_len), dtype=np.int64)
        for i, (shard, row) in enumerate(zip(which, indices - self.starts[which])):
            out[i] = self.shards[shard][row]
        return torch.from_numpy(out)


class TrainBatches:
    """An endless, resumable stream of (micro_batch, row_len) batches for one rank."""

    def __init__(self, rows: ShardRows, micro_batch: int, seed: int, rank: int = 0, world: int = 1):
        self.rows, self.micro_batch, self.seed = rows, micro_batch, seed
        self.rank, self.world = rank, world
        self.per_epoch = len(rows) // world // micro_batch
        if self.per_epoch == 0:
            raise KilnError(
                f"train: {len(rows)} training rows cannot fill one micro-batch of {micro_batch} on each "
                f"of {world} ranks; lower train.micro_batch or shard.seq_len, or add data"
            )
        self.epoch, self.batch = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
        return perm[self.rank :: self.world][: self.per_epoch * self.micro_batch]

    def next(self) -> torch.Tensor:
        if self.batch == self.per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        start = self.batch * self.micro_batch
        self.batch += 1
        return self.rows.take(self._order[start : start + self.micro_batch])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "seed": self.seed, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["world"]) != (self.seed, self.world):
            raise KilnError(
                f"train: checkpoint data order was made with seed {state['seed']} on {state['world']} "
                f"ranks; this run has seed {self.seed} on {self.world} ranks"
            )
        self.epoch, self.batch = state["epoch"], state["batch"]
        self._order = self._epoch_order(self.epoch)


def eval_batches(rows: ShardRows, micro_batch: int, max_batches: int, rank: int = 0, world: int = 1):
    """At most max_batches batches of this rank's share of a split, in stored order. When they
    cannot hold the whole share, the rows are spread evenly over it rather than taken from its
    start: the val split is stored source by source, so its first rows would stand for the first
    source only."""
    mine = np.arange(rank, len(rows), world)
    wanted = max_batches * micro_batch
    if wanted < len(mine):
        mine = mine[np.arange(wanted) * len(mine) // wanted]
    for b in range(-(-len(mine) // micro_batch)):
        yield rows.take(mine[b * micro_batch : (b + 1) * micro_batch])
