"""Batches for training and evaluation, read straight from memory-mapped shards.

Training order is a function of the global sample index alone, never of the rank layout: each
epoch is one permutation of all rows (seeded by seed and epoch), cut into global batches of G rows
(train.batch_tokens / seq_len), one per optimizer step; each rank's micro-batches are consecutive
slices of its step's global batch. The loader's position, saved in checkpoints, is the index of the
next global sample (steps done x G), so a run resumed on another number of ranks with the same
global batch (more gradient accumulation on fewer ranks, say) sees exactly the rows per step that
an uninterrupted one would have seen.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kiln.data.shards import open_shard, verify_shard
from kiln.errors import KilnError
from kiln.io import atomic_file, process_alive, read_json

# Shards this process has seen pass, keyed by what changes when the file does: a second loader over the
# same folder (the smoke stage builds two trainers) does not read them again.
_PASSED: set[tuple] = set()


def forget_checked() -> None:
    """The next loader checks every shard again (a benchmark measures the checks this way)."""
    _PASSED.clear()


def _identity(path: Path, entry: dict, vocab_size: int | None) -> tuple:
    st = os.stat(path)
    return str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, entry["sha256"], entry["rows"], vocab_size


STAMP_POLL_S = 0.05
STAMP_WAIT_S = 600.0  # past it, a rank checks a shard itself rather than wait for the rank that owns it


@dataclass(frozen=True)
class NodeShare:
    """The ranks of one node share the shard checks: local rank r checks the shards i with
    i % local_world == r and leaves a stamp (passed, or the failure's message) in a node-local folder
    of this job; the others wait for the stamp instead of reading and hashing the shard again. One
    read of every shard per node, split over its ranks, where each rank read all of them."""

    local_rank: int
    local_world: int
    folder: Path

    PREFIX = "kiln-shard-checks-"

    @classmethod
    def from_env(cls) -> "NodeShare | None":
        """torchrun's: LOCAL_RANK and LOCAL_WORLD_SIZE; None for a lone process. The stamps' folder is
        this launch's on this node: the run id and the node's torchrun agent, every local rank's parent.
        No rank can tell when the node's others are done with it, so a job leaves its folder behind;
        local rank 0 of the next job on the node removes those of agents no longer alive."""
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if local_world < 2:
            return None
        local_rank, root = int(os.environ.get("LOCAL_RANK", "0")), Path(tempfile.gettempdir())
        if local_rank == 0:
            cls._remove_dead_agents_folders(root)
        job = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}-{os.getppid()}"
        return cls(local_rank, local_world, root / f"{cls.PREFIX}{job}")

    @classmethod
    def _remove_dead_agents_folders(cls, root: Path) -> None:
        for folder in root.glob(f"{cls.PREFIX}*"):
            agent = folder.name.rpartition("-")[2]
            if agent.isdigit() and not process_alive(int(agent)):
                shutil.rmtree(folder, ignore_errors=True)  # another user's stays: theirs to remove

    def owns(self, i: int) -> bool:
        return i % self.local_world == self.local_rank

    def stamp(self, key: tuple) -> Path:
        return self.folder / hashlib.sha256(repr(key).encode()).hexdigest()[:32]


class ShardChecks:
    """Every shard verified once (kiln.data.shards.verify_shard: ids below the vocabulary, sha256
    against the manifest) before any of its rows is served. Background threads go through the
    shards in order while the model is built and the first steps run; a shard needed before they
    reach it is verified by the thread that needs it, and one they are on is waited for. A failure
    found in any shard is raised by the next `require`, so a bad shard stops the run as soon as it
    is found, not only when its rows come up. A shard that passed earlier in this process, unchanged
    since, is not read again; one another rank of this node checked in this job (NodeShare) is not
    read here at all."""

    def __init__(
        self,
        paths: list[Path],
        entries: list[dict],
        vocab_size: int | None,
        threads: int = 1,
        node: NodeShare | None = None,
    ):
        self._jobs = list(zip(paths, entries))
        self._node = node
        self._vocab = vocab_size
        self._lock = threading.Lock()
        self._keys = [_identity(path, entry, vocab_size) for path, entry in self._jobs]
        self.ok = np.array([key in _PASSED for key in self._keys], dtype=bool)
        self._claimed = self.ok.tolist()
        self._done = [threading.Event() for _ in paths]
        for i in np.flatnonzero(self.ok):
            self._done[i].set()
        self._errors: dict[int, BaseException] = {}
        self.complete = bool(self.ok.all())  # every shard passed: take() skips the checks
        # The background threads' order: with a NodeShare this rank's own shards first (each rank of
        # the node reads its share at once), then the others' stamps.
        everyone = range(len(self._jobs))
        self._order = sorted(everyone, key=lambda i: not node.owns(i)) if node is not None else list(everyone)
        self._next = 0
        self._threads = [
            threading.Thread(target=self._background, name="kiln-shard-verify", daemon=True) for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _claim(self, i: int) -> bool:
        with self._lock:
            mine, self._claimed[i] = not self._claimed[i], True
            return mine

    def _verify(self, i: int) -> None:
        try:
            if self._node is None or not self._from_stamp(i):
                self._check_and_stamp(i)
        except BaseException as exc:  # re-raised in the thread that needs the rows
            self._errors[i] = exc
        else:
            with self._lock:
                self.ok[i] = True
                self.complete = bool(self.ok.all())
                _PASSED.add(self._keys[i])
        finally:
            self._done[i].set()

    def _check_and_stamp(self, i: int) -> None:
        """verify_shard, and with a NodeShare the stamp the node's other ranks wait for."""
        try:
            verify_shard(*self._jobs[i], self._vocab)
        except KilnError as exc:
            self._stamp(i, f"failed\n{exc}")
            raise
        self._stamp(i, "passed")

    def _stamp(self, i: int, text: str) -> None:
        if self._node is not None and self._node.owns(i):
            with atomic_file(self._node.stamp(self._keys[i])) as tmp:
                tmp.write_text(text, encoding="utf-8")

    def _from_stamp(self, i: int) -> bool:
        """Whether another rank of this node checked shard i: True once its stamp says passed, a
        KilnError with its message once it says failed; False for a shard of this rank's own, or when
        no stamp came within STAMP_WAIT_S (this rank then checks it itself)."""
        if self._node.owns(i):
            return False
        stamp, deadline = self._node.stamp(self._keys[i]), time.monotonic() + STAMP_WAIT_S
        while not stamp.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(STAMP_POLL_S)
        verdict, _, message = stamp.read_text(encoding="utf-8").partition("\n")
        if verdict != "passed":
            raise KilnError(message)
        return True

    def _background(self) -> None:
        while not self._errors:
            with self._lock:
                while self._next < len(self._order) and self._claimed[self._order[self._next]]:
                    self._next += 1
                if self._next == len(self._order):
                    return
                i = self._order[self._next]
                self._claimed[i] = True
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
        self.checks = (
            ShardChecks(
                [shard_dir / e["file"] for e in entries],
                entries,
                self.manifest.get("vocab_size"),
                verify_threads,
                NodeShare.from_env(),
            )
            if verify
            else None
        )

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


# Odd 64-bit multipliers of the row hash (batch_hash in metrics.jsonl): fixed, so that hashes compare
# across processes, runs and machines.
_ROW_MULT = np.random.default_rng(0x6B696C6E).integers(1, 2**63, size=1 << 16, dtype=np.uint64) | np.uint64(1)


def row_hash_sum(batch: torch.Tensor) -> int:
    """The sum of a 40-bit hash of each row of an int64 (rows, row_len) batch: order-free, so a step's
    sum is the same whichever rank and micro-batch served each row, and sums add across ranks in an
    int64 without overflow (2^23 rows per step before it could)."""
    rows = batch.numpy().astype(np.uint64)
    mult = np.resize(_ROW_MULT, rows.shape[1])
    with np.errstate(over="ignore"):  # wrapping arithmetic is the point
        mixed = (rows * mult).sum(axis=1, dtype=np.uint64)
        mixed ^= mixed >> np.uint64(29)
        mixed *= np.uint64(0xBF58476D1CE4E5B9)
    return int((mixed >> np.uint64(24)).sum(dtype=np.uint64) & np.uint64(2**63 - 1)) if len(rows) else 0


class TrainBatches:
    """An endless, resumable stream of (micro_batch, row_len) batches for one rank of `world`, each
    optimizer step taking grad_accum of them.

    Step k of an epoch uses rows order[k*G : (k+1)*G] of the epoch's permutation, G = world x
    grad_accum x micro_batch; rank r's micro-batch m of the step is the slice starting at
    (r x grad_accum + m) x micro_batch. Concatenated rank by rank, micro-batch by micro-batch, a
    step's batches are its global batch, so 2 ranks x 4 rows, 1 rank x 2 x 4 rows and 1 rank x 8
    rows read the same rows per step. The len(rows) mod G rows past the epoch's last whole global
    batch sit that epoch out (another permutation next epoch)."""

    def __init__(
        self, rows: ShardRows, micro_batch: int, seed: int, rank: int = 0, world: int = 1, grad_accum: int = 1
    ):
        self.rows, self.micro_batch, self.seed = rows, micro_batch, seed
        self.rank, self.world, self.grad_accum = rank, world, grad_accum
        self.global_rows = world * grad_accum * micro_batch
        self.steps_per_epoch = len(rows) // self.global_rows
        if self.steps_per_epoch == 0:
            raise KilnError(
                f"train: {len(rows)} training rows cannot fill one global batch of {self.global_rows} rows "
                f"({world} ranks x {grad_accum} micro-batches x train.micro_batch {micro_batch}); lower "
                "train.batch_tokens, train.micro_batch or shard.seq_len, or add data"
            )
        self.per_epoch = self.steps_per_epoch * grad_accum  # this rank's micro-batches per epoch
        self.sample = 0  # global index of the first row of the current step
        self.micro = 0  # this rank's micro-batches of the current step served so far
        self.step_sums: list[int] = []  # row_hash_sum of this rank's rows of each finished step
        self._step_sum = 0
        self._cached: tuple[int, np.ndarray] | None = None

    @property
    def epoch(self) -> int:
        return self.sample // (self.steps_per_epoch * self.global_rows)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.rows)))
        return self._cached[1]

    def step_indices(self) -> np.ndarray:
        """The global batch of the current step: row indices, in the order ranks and micro-batches
        take them."""
        offset = self.sample % (self.steps_per_epoch * self.global_rows)
        return self._epoch_order(self.epoch)[offset : offset + self.global_rows]

    def next(self) -> torch.Tensor:
        start = (self.rank * self.grad_accum + self.micro) * self.micro_batch
        batch = self.rows.take(self.step_indices()[start : start + self.micro_batch])
        self._step_sum += row_hash_sum(batch)
        self.micro += 1
        if self.micro == self.grad_accum:
            self.sample, self.micro = self.sample + self.global_rows, 0
            self.step_sums.append(self._step_sum)
            self._step_sum = 0
        return batch

    def drain_step_sums(self) -> list[int]:
        """The row-hash sums of the steps finished since the last call (this rank's rows only)."""
        sums, self.step_sums = self.step_sums, []
        return sums

    def state_dict(self) -> dict:
        if self.micro:
            raise RuntimeError(
                f"TrainBatches.state_dict in the middle of a step ({self.micro} of "
                f"{self.grad_accum} micro-batches served): save between steps"
            )
        return {"sample": self.sample, "global_rows": self.global_rows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if "sample" not in state:
            raise KilnError(
                "train: the checkpoint's data position is (epoch, batch) per rank, from a Kiln before the "
                "order followed the global sample index; it cannot be continued exactly: start the run over"
            )
        if (state["seed"], state["global_rows"]) != (self.seed, self.global_rows):
            raise KilnError(
                f"train: the checkpoint's data order was made with seed {state['seed']} and a global batch "
                f"of {state['global_rows']} rows; this run has seed {self.seed} and {self.global_rows} rows "
                f"({self.world} ranks x {self.grad_accum} x {self.micro_batch}); keep train.batch_tokens "
                "and the seed to resume"
            )
        self.sample, self.micro, self._step_sum, self.step_sums = state["sample"], 0, 0, []


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
