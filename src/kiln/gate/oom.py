"""An out-of-memory error that some ranks hit and others do not, ended the same way on every rank.

The smoke stage turns an OOM into a failed preflight check with advice (kiln.gate.checks). On one
rank that is simple. On several, the ranks that did not run out of memory are by then inside a
collective that the failed rank will never join (DDP's gradient all-reduce, the next validation's
mean); they would wait there for train.collective_timeout_s, or for ever, and then end with an error
that says nothing of memory. Leaving the process group does not free them: the model's DDP reducer
keeps the group's connections open until the process exits (measured with gloo). So:

1. the failed rank writes what happened to `<folder>/.oom-rank<R>.json` (the stage's output folder,
   which every rank sees: a local disk on one node, across nodes the shared filesystem the run's
   results live on), then ends the stage with the error, its process exiting at once
   (kiln.errors.RanksOutOfMemory, a GroupBroken);
2. its exit closes its connections: another rank's pending collective fails (gloo at once; NCCL at
   the collective timeout), and torchrun sends the survivors SIGTERM;
3. a surviving rank, on either, finds the file (`agree`, or the SIGTERM handler `watch` installs)
   and ends with the same failed check and the same error. Without a file, an error is raised as
   it was, and SIGTERM does what it did.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kiln.errors import RanksOutOfMemory
from kiln.io import atomic_file

log = logging.getLogger("kiln.train")
OOM_MESSAGES = ("out of memory", "can't allocate memory")
POLL_S = 0.1
SEEN_WAIT_S = 5.0  # how long a rank whose collective failed looks for a failed rank's file


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA OOM, or the CPU allocator refusing a request."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES)
    )


@dataclass(frozen=True)
class RankOOM:
    """Which rank ran out of memory, where, and the error's first line: the same on every rank."""

    rank: int
    where: str
    error: str

    def describe(self, world: int) -> str:
        on = f" on rank {self.rank} of {world}" if world > 1 else ""
        return f"out of memory{on} in {self.where}"


class OutOfMemoryElsewhere(RanksOutOfMemory):
    """Raised in a surviving rank by the SIGTERM torchrun sends once the failed rank has exited."""

    def __init__(self, failure: RankOOM):
        super().__init__(f"smoke: rank {failure.rank} ran out of memory in {failure.where} ({failure.error})")
        self.failure = failure


def _file(folder: Path, rank: int) -> Path:
    return Path(folder) / f".oom-rank{rank}.json"


def clear(folder: Path, rank: int) -> None:
    """Remove this rank's file of an earlier attempt (before the stage's first collective)."""
    _file(folder, rank).unlink(missing_ok=True)


def find(folder: Path, world: int) -> RankOOM | None:
    """The lowest rank's published OOM, if any rank published one."""
    for rank in range(world):
        try:
            return RankOOM(**json.loads(_file(folder, rank).read_text(encoding="utf-8")))
        except FileNotFoundError:  # written whole or not at all (atomic_file renames)
            continue
    return None


def watch(folder: Path, world: int) -> None:
    """Install the SIGTERM handler of a rank that may survive another's OOM (step 3 above)."""
    if world == 1:
        return

    def on_sigterm(signum, frame):
        failure = find(folder, world)
        if failure is None:  # not ours to explain: end as SIGTERM would
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
            return
        raise OutOfMemoryElsewhere(failure)

    signal.signal(signal.SIGTERM, on_sigterm)


def agree(exc: BaseException, where: str, folder: Path, rank: int, world: int) -> RankOOM:
    """The OOM every rank reports for `exc`, raised on this rank while doing `where`: this rank's own
    (published for the others), or another rank's that broke this one's collective. `exc` is raised
    again when it is neither. From here on SIGTERM is ignored: the stage is ending with this."""
    if isinstance(exc, OutOfMemoryElsewhere):
        failure = exc.failure
    elif is_out_of_memory(exc):
        text = str(exc).strip()
        failure = RankOOM(rank, where, text.splitlines()[0][:200] if text else type(exc).__name__)
        if world > 1:
            with atomic_file(_file(folder, rank)) as tmp:
                tmp.write_text(json.dumps(asdict(failure)), encoding="utf-8")
    else:
        deadline = time.monotonic() + (SEEN_WAIT_S if world > 1 else 0)
        while (failure := find(folder, world) if world > 1 else None) is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if failure is None:
            raise exc
    if world > 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.error("rank %d: %s; the stage ends with it", rank, failure.describe(world))
    return failure
