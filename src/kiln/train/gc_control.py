"""Python's garbage collector kept off the hot path of a training loop, as torchtitan does.

CPython starts a generation-0 collection every 700 net allocations of container objects; a training
step allocates many (autograd nodes, dicts of metrics, the loader's rows), so collections land at
random points inside steps, and a full collection walks every object the process holds (a resumed
checkpoint's metadata, the tokenizer, the compiled graphs): tens of milliseconds each time, at
different steps on different ranks, which the next collective then waits for. So during fit:

- on entry, one full collection, and what survives it is frozen (gc.freeze: moved to a permanent
  generation that no later collection walks);
- automatic collection is off; every `every` steps the loop collects generation 1 (young objects:
  reference cycles made by recent steps, the only garbage a loop makes that reference counting
  leaves), at the same step on every rank;
- on exit, the collector is as it was.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("kiln.train")
EVERY_STEPS = 50  # torchtitan's default gc_freq


class GarbageCollection:
    def __init__(self, every: int = EVERY_STEPS):
        self.every = every
        self._was_enabled = gc.isenabled()

    def __enter__(self) -> "GarbageCollection":
        self._was_enabled = gc.isenabled()
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        gc.disable()
        log.debug("gc: full collection and freeze in %.3f s; automatic collection off", time.perf_counter() - started)
        return self

    def step(self, step: int) -> None:
        """Called after each optimizer step: a young-generation collection every `every` steps."""
        if step % self.every == 0:
            gc.collect(1)

    def __exit__(self, *exc) -> None:
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
