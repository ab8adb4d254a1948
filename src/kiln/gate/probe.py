"""The smoke stage's probe: the full run's training step timed as train will run it.

Split from kiln.gate.checks (the gate's checks), which runs it for the throughput, the step time
and the stage's start-up that the plan is made from, and to time train.precision auto's two
candidates; bench/gpu_check runs it for the same figures on a GPU. What it guards against: a
neighbour's burst of load on a shared machine moving the plan (the median span counts, not the
mean), and the timing itself slowing the steps (the host waits on the device at span ends only).
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import torch

from kiln.plan.verdict import Probe
from kiln.train.distributed import mean_across_ranks
from kiln.train.metrics import (
    Throughput,
    flops_per_token,
    flops_per_token_torchtitan,
    memory_mb,
    peak_flops,
    reserved_mb,
)
from kiln.train.trainer import Trainer

log = logging.getLogger("kiln.smoke")
PROBE_SPANS = 4  # the probe's timed steps are timed in this many spans; the median span's rate counts


def sync(dev: torch.device) -> None:
    """Wait for the device (a no-op on the CPU): a span's time ends when its steps have run."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def graphs_compiled() -> int:
    """The graphs dynamo has compiled in this process (a recompile is one more)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def probe(
    trainer: Trainer, steps: int, warmup: int, trace_dir: Path | None = None, profile_step: int | None = None
) -> tuple[list[float], list[float], Probe]:
    """Run `steps` optimizer steps; return per-step losses and gradient norms (mean over ranks) and
    the throughput of the steps after `warmup`. The timed steps are cut into up to PROBE_SPANS spans
    and the figure is the median span's: a neighbour's burst of load on a shared machine slows one
    span, not the plan a budget is turned into steps with. The host waits on the device only at
    span ends (a handful of syncs), as the full run waits at log steps. With profile_step, that step
    (1-based) is traced (trace.json for Perfetto / chrome://tracing; on CUDA also
    memory_snapshot.pickle for pytorch.org/memory_viz) and its span left out of the timing."""
    d = trainer.dist
    losses, norms = [], []
    span = max(1, (steps - warmup) // PROBE_SPANS)
    spans: list[tuple[float, int]] = []  # (seconds, steps) of each whole span without the traced step
    started = time.perf_counter()
    t0 = span_start = wait_start = 0.0
    traced_here = False
    graphs_before = graphs_compiled()  # dynamo's graphs so far, updated when the timed steps start
    for i in range(1, steps + 1):
        if i == warmup + 1:
            sync(d.device)
            t0 = span_start = time.perf_counter()
            wait_start, traced_here = trainer.data_wait_s, False
            graphs_before = graphs_compiled()
        trainer.faults.before_step(i, trainer.stop)  # KILN_FAULT, when the smoke stage set it (kiln.train.faults)
        if i == profile_step:
            loss, norm = _traced_step(trainer, trace_dir if d.is_main else None)
            traced_here = True
        else:
            loss, norm, _ = trainer.train_step()
        losses.append(loss.detach())
        norms.append(norm.detach())
        if i > warmup and ((i - warmup) % span == 0 or i == steps):
            sync(d.device)
            now = time.perf_counter()
            if not traced_here:
                spans.append((now - span_start, (i - warmup - 1) % span + 1))
            span_start, traced_here = now, False
        if d.is_main and (i % 10 == 0 or i == steps):
            log.info("probe step %d/%d", i, steps)
    sync(d.device)
    loss_list = mean_across_ranks(torch.stack(losses), d.world).tolist()
    norm_list = torch.stack(norms).float().tolist()
    step_s = statistics.median(sec / n for sec, n in spans) if spans else 0.0
    tokens_per_s = trainer.batch_split.tokens_per_step / step_s if step_s else 0.0
    rates = Throughput(
        flops_per_token(trainer.model), peak_flops(d.device), d.world, flops_per_token_torchtitan(trainer.model)
    ).rates(tokens_per_s)
    timed_s = time.perf_counter() - t0 if steps > warmup else 0.0
    return (
        loss_list,
        norm_list,
        Probe(
            tokens_per_s=tokens_per_s,
            step_time_s=step_s,
            data_wait_fraction=(trainer.data_wait_s - wait_start) / timed_s if timed_s else 0.0,
            peak_memory_mb=memory_mb(d.device),
            peak_reserved_mb=reserved_mb(d.device),
            mfu=rates["mfu"],
            tflops=rates["tflops"],
            measured_steps=sum(n for _, n in spans),
            mfu_torchtitan=rates["mfu_torchtitan"],
            warmup_s=(t0 if steps > warmup else time.perf_counter()) - started,
            graphs_in_timed_steps=graphs_compiled() - graphs_before,
        ),
    )


def _traced_step(trainer: Trainer, trace_dir: Path | None):
    if trace_dir is None:
        loss, norm, _ = trainer.train_step()
        return loss, norm
    cuda = trainer.dist.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        loss, norm, _ = trainer.train_step()
        sync(trainer.dist.device)
    trace_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_dir / "trace.json"))
    if cuda:
        torch.cuda.memory._dump_snapshot(str(trace_dir / "memory_snapshot.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    log.info("traced one step -> %s", trace_dir / "trace.json")
    return loss, norm
