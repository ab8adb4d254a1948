"""Peak bytes of tensors allocated while a function runs on the CPU: what torch.cuda.max_memory_allocated
gives on a GPU, measured from torch's CPU profiler (profile_memory=True records every allocation and
free of the CPU allocator, with its size, in order).

A process's peak resident set (ru_maxrss) is the other CPU figure; it adds the interpreter, torch's
libraries and whatever glibc keeps of freed memory, so it cannot tell a 10 MB saving from noise. The
profiler's figure is exact and repeatable: the same step gives the same bytes on every run, which is
why the tests compare memory through it (tests/unit/model/test_loss.py, tests/unit/plan/test_memory.py) and never time it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")


@dataclass(frozen=True)
class Allocated:
    peak: int  # the most bytes alive at once during the call, above what was alive before it
    end: int  # bytes still alive when it returned (allocated minus freed), above the same start


def allocated_during(fn: Callable[[], T]) -> tuple[T, Allocated]:
    """Run fn under the CPU profiler; return what it returned and its allocation peak and net."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):  # frees are negative sizes
        live += event.nbytes()
        peak = max(peak, live)
    return out, Allocated(peak=peak, end=live)


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a tied weight, or views, counted once; of a
    DTensor, this rank's local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, DTensor):
            t = t.to_local()
        if torch.is_tensor(t) and t.device.type == "cpu":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def steady_step_bytes(trainer) -> int:
    """Bytes at the peak of a kiln.train.trainer.Trainer's train step after its first, on this CPU: the
    weights, buffers and optimizer state alive before it (the first step makes the state) plus the
    profiler's peak during it (as bench/memory_estimate.py measures, buffers added; kiln.rehearse's
    calibration, bench/rehearse_calibration.py)."""
    trainer.train_step()
    model, state = trainer.model, trainer.optimizer.state.values()
    resident = tensor_bytes([*model.parameters(), *model.buffers(), *(t for s in state for t in s.values())])
    _, step = allocated_during(trainer.train_step)
    return resident + step.peak


@dataclass(frozen=True)
class Saved:
    """One storage autograd keeps for backward."""

    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def saved_for_backward(fn: Callable[[], T], exclude=()) -> tuple[T, list[Saved]]:
    """Run fn with autograd's saved-tensor hooks on; return what it returned and what its graph keeps
    for backward, one entry per distinct storage (a tensor several ops save, or views of one, counted
    once), leaving out the storages of `exclude` (parameters, shared tables: alive anyway). It sees
    through torch.compile: AOTAutograd's compiled function saves its tensors through the same hooks,
    so eager and compiled blocks are counted alike (docs/benchmarks.md, "Seed 000's memory"; tests/unit/plan/test_memory.py)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, Saved] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen.setdefault(storage.data_ptr(), Saved(storage.nbytes(), t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, list(seen.values())
