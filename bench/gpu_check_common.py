"""What bench/gpu_check.py's checks share: the check's context (dry run or GPU, scratch folder), the
train-stage sections they build trainers from, and Kiln's throughput over timed train steps."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from train_throughput import train_sections  # bench/ is the script's sys.path[0]

from kiln.model.registry import FLAVOURS
from kiln.train.memory import GIB
from kiln.train.metrics import Throughput, flops_per_token, flops_per_token_torchtitan, memory_mb, peak_flops
from kiln.train.trainer import Trainer

NO_CUDA = "skipped: no CUDA"
TINY_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32}  # dry-run shapes


@dataclass(frozen=True)
class Ctx:
    dry: bool  # CPU dry run: CUDA hidden, tiny shapes
    work: Path  # this check's scratch folder

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


def sections(ctx: Ctx, flavour: str | None, seq_len: int, micro_batch: int,
             compile_model: bool | str = "auto") -> dict:
    """train_throughput's validated train-stage sections (bf16); in a dry run a tiny model of the
    flavour's family."""
    args = argparse.Namespace(flavour=flavour, seq_len=seq_len, micro_batch=micro_batch, precision="bf16",
                              compile=compile_model, seed=1337)
    out = train_sections(args)
    if ctx.dry:
        out["model"] = {"family": FLAVOURS[flavour].family if flavour else "gpt2", **TINY_MODEL}
    return out


def size(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB else f"{n_bytes / 2**20:.1f} MiB"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def timed_steps(trainer: Trainer, warmup: int, steps: int) -> tuple[dict, float]:
    """Kiln's Throughput (tokens/s, TFLOP/s, MFU per device) over `steps` train steps after `warmup`
    untimed ones, read as the train stage reads it: one host sync at the end of the window."""
    for _ in range(warmup):
        trainer.train_step()[0].item()
    meter = Throughput(flops_per_token(trainer.model), peak_flops(trainer.d.device), trainer.d.world,
                       flops_per_token_torchtitan(trainer.model))
    for _ in range(steps):
        loss = trainer.train_step()[0]
    loss.item()
    return meter.window(steps * trainer.plan.tokens_per_step, last=True), memory_mb(trainer.d.device)
