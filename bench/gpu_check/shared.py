"""What the GPU check's checks share: the check's context (dry run or GPU, scratch folder, the
end of its time budget, its progress notes), the train-stage sections they build trainers from, and
Kiln's throughput over timed train steps, as many as the budget leaves time for."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from train_throughput import train_sections  # bench/ is on sys.path (__main__)

from kiln.config.models import FLAVOURS
from kiln.data.shards import shard_split
from kiln.io import write_json
from kiln.plan.memory import GIB
from kiln.train.metrics import Throughput, flops_per_token, flops_per_token_torchtitan, memory_mb, peak_flops
from kiln.train.step_reader import HostCopy, StepRecord
from kiln.train.trainer import Trainer

NO_CUDA = "skipped: no CUDA"
TINY_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32}  # dry-run shapes


@dataclass(frozen=True)
class Ctx:
    dry: bool  # CPU dry run: CUDA hidden, tiny shapes
    work: Path  # this check's scratch folder
    deadline: float = math.inf  # time.monotonic() at which the check's budget runs out
    started: float = field(default_factory=time.monotonic)

    PROGRESS = "progress.tsv"  # in `work`: what the check was doing, for the row of a check over budget

    def left(self) -> float:
        """Seconds left of the check's budget."""
        return self.deadline - time.monotonic()

    def note(self, what: str) -> None:
        """Record what the check is doing now (and the figures it has so far): the row of a check
        stopped over budget quotes the last note instead of only "over budget"."""
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / self.PROGRESS, "a") as f:
            f.write(f"{time.monotonic() - self.started:.0f}\t{what}\n")

    def folder(self, name: str) -> Path:
        (self.work / name).mkdir(parents=True, exist_ok=True)
        return self.work / name

    @property
    def device(self) -> torch.device:
        return torch.device("cpu" if self.dry else "cuda")

    def verdict(self, ok: bool, figure: str) -> tuple[str, str]:
        """(result, figure): the GPU verdict, or in a dry run FAIL / skipped with the CPU part's figure."""
        if self.dry:
            return (NO_CUDA if ok else "FAIL"), f"CPU part: {figure}"
        return ("pass" if ok else "FAIL"), figure


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profiled(fn: Callable[[], object]) -> tuple[set[str], object]:
    """(the ops `fn` ran, what it returned); the CPU-side record names the CUDA ops it launched too."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
        sync()
    return {e.key for e in prof.key_averages()}, out


def sections(ctx: Ctx, flavour: str | None, seq_len: int, micro_batch: int, compile_model: bool | str = "auto") -> dict:
    """train_throughput's validated train-stage sections (bf16); in a dry run a tiny model of the
    flavour's family."""
    args = argparse.Namespace(
        flavour=flavour, seq_len=seq_len, micro_batch=micro_batch, precision="bf16", compile=compile_model, seed=1337
    )
    out = train_sections(args)
    if ctx.dry:
        out["model"] = {"family": FLAVOURS[flavour].family if flavour else "gpt2", **TINY_MODEL}
    return out


def word_shards(out: Path, seq: int, rows: int) -> Path:
    """Shards of EOS-separated words from a fixed lexicon (within a word the next id is certain), so a
    few steps train a model worth evaluating; synthetic_shards' manifest layout."""
    rng = np.random.default_rng(0)
    words = [rng.integers(1, 500, size=int(rng.integers(3, 8))) for _ in range(40)]
    # ~6 tokens a word (EOS included): rows * seq / 2 words fill both splits' rows * (seq + 1) tokens
    stream = np.concatenate([np.append(words[i], 0) for i in rng.integers(0, len(words), size=rows * seq // 2)])
    splits = {
        s: shard_split(
            stream[i * rows * (seq + 1) : (i + 1) * rows * (seq + 1)].astype(np.uint16), out, s, seq + 1, rows, 512
        )
        for i, s in enumerate(("train", "val"))
    }
    write_json(
        out / "manifest.json",
        {
            "seq_len": seq,
            "row_len": seq + 1,
            "dtype": "uint16",
            "vocab_size": 500,
            "padded_vocab_size": 512,
            "splits": splits,
        },
    )
    return out


def size(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB else f"{n_bytes / 2**20:.1f} MiB"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def timed_steps(
    trainer: Trainer, warmup: int, steps: int, ctx: Ctx | None = None, reserve_s: float = 5.0
) -> tuple[dict, float]:
    """Kiln's Throughput (tokens/s, TFLOP/s, MFU per device) over `steps` train steps after `warmup`
    untimed ones, read as the train stage reads it: one host sync at the end of the window. With
    `ctx`, the last warm-up step is timed and the window cut to what the budget leaves (less
    `reserve_s`, at least 2 steps): a slow compile costs timed steps, not the row's figures.
    rates["steps"] is the window's length."""
    for i in range(warmup):
        start = time.perf_counter()
        trainer.train_step()[0].item()
        if ctx is not None and i == warmup - 1:
            step_s = time.perf_counter() - start
            steps = max(2, min(steps, int((ctx.left() - reserve_s) / step_s)))
            ctx.note(f"warm ({step_s * 1000:.0f} ms a step); timing {steps} steps")
    meter = Throughput(
        flops_per_token(trainer.model),
        peak_flops(trainer.dist.device),
        trainer.dist.world,
        flops_per_token_torchtitan(trainer.model),
    )
    for _ in range(steps):
        loss = trainer.train_step()[0]
    loss.item()
    return meter.window(steps * trainer.batch_split.tokens_per_step, last=True) | {"steps": steps}, memory_mb(
        trainer.dist.device
    )


def stop_flag_reads(trainer: Trainer, steps: int) -> dict[str, float]:
    """tokens/s over `steps` train steps read as fit reads them between syncs (each step, the
    previous step's stop flag): through its host copy (StepRecord.host_flags, issue 29's S1), and
    through .item() on the device tensor, as before S1 (on CUDA that waits for the newest step too)."""
    reads = {"host copy": lambda r: r.host_flags.get()[1].item(), ".item()": lambda r: r.flags[1].item()}
    rates = {}
    for name, read in reads.items():
        sync()
        start, previous = time.perf_counter(), None
        for _ in range(steps):
            loss, grad_norm, _ = trainer.train_step()
            record = StepRecord(trainer.step, loss, grad_norm, trainer.flags)
            if previous is not None:
                read(previous)
            previous = record
        loss.item()
        rates[name] = steps * trainer.batch_split.tokens_per_step / (time.perf_counter() - start)
    return rates


def host_copy_runs_ahead(device: torch.device) -> bool:
    """Whether reading a HostCopy returns while work queued after the copy is still running (on CUDA;
    True on the CPU, where nothing is queued)."""
    flag = torch.ones(2, device=device)
    copy = HostCopy(flag)
    if device.type != "cuda":
        return copy.get()[1].item() == 1.0
    a = torch.randn(4096, 4096, device=device)
    for _ in range(50):  # ~7 TFLOP queued behind the copy: tens of milliseconds on an H200
        a = torch.tanh(a @ a)
    read = copy.get()[1].item() == 1.0
    still_busy = not torch.cuda.current_stream().query()
    sync()
    return read and still_busy
