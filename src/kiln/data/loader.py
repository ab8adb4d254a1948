"""Batches for training and evaluation, read straight from memory-mapped shards.

Training order is a pure function of (seed, epoch): each epoch is one permutation of all rows, and
rank r of W takes every W-th row of it, so ranks read disjoint data and the order does not depend on
anything but the seed. The loader's position is two integers (epoch, batch), saved in checkpoints
and restored on resume, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kiln.data.shards import open_shard
from kiln.errors import KilnError
from kiln.io import read_json


class ShardRows:
    """The rows of one split, across its shards, addressable by a global row index."""

    def __init__(self, shard_dir: str | Path, split: str):
        shard_dir = Path(shard_dir)
        self.manifest = read_json(shard_dir / "manifest.json")
        entries = self.manifest["splits"][split]["shards"]
        self.shards = [open_shard(shard_dir / e["file"]) for e in entries]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.row_len = int(self.manifest["row_len"])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, indices: np.ndarray) -> torch.Tensor:
        """Rows at the given global indices as an int64 tensor (len(indices), row_len)."""
        which = np.searchsorted(self.starts, indices, side="right") - 1
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
