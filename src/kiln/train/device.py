"""Where a run's model lives (train.device), and per-device speed settings: TF32 matmuls, bf16
autocast over fp32 weights, compile by default on CUDA, pinned non-blocking host-to-device copies; on
CPU, an allocator that keeps freed memory.

bf16 autocast keeps the weights, gradients and optimizer state in fp32 (the "master" copy) and runs
matmuls in bf16; unlike fp16 it needs no loss scaling. SDPA then dispatches to the flash kernel on
CUDA (bf16, causal, head dim <= 256); on CPU it runs the fused CPU kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import warnings
from dataclasses import replace

import torch

from kiln.config.models import ModelConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.plan import autofit, memory
from kiln.plan.memory import GIB

log = logging.getLogger("kiln.train")
DEVICES = ("auto", "cuda", "cpu")  # train.device


def select_device(setting: str = "auto", local_rank: int = 0, ranks: int = 1) -> torch.device:
    """train.device as a torch.device, the one choice smoke, train and eval share: "cuda" is this
    rank's GPU (an error when CUDA sees none, rather than a silent run on the CPU), "cpu" the CPU even
    beside a GPU, "auto" the GPU when CUDA sees one. An auto run of several ranks whose torch was
    built for CUDA but sees no GPU is an error too (gpu_missing): a node whose driver is too old for
    the wheel would otherwise train a multi-GPU run on its CPUs."""
    if setting not in DEVICES:
        raise ValueError(f"train.device: {setting!r} is not one of {', '.join(DEVICES)}")
    if setting == "auto" and not torch.cuda.is_available() and ranks > 1 and torch.version.cuda is not None:
        raise KilnError(
            f"train.device is auto and the run has {ranks} ranks, but this torch, built for CUDA "
            f"{torch.version.cuda}, sees no GPU ({gpu_missing()}): it would train on the CPU. Fix the "
            "node's driver or CUDA_VISIBLE_DEVICES, or set train.device: cpu to train the ranks on the CPU"
        )
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise KilnError(
            "train.device is cuda, but CUDA sees no GPU here (a CPU build of torch, no driver, or "
            "CUDA_VISIBLE_DEVICES empty); set train.device to auto or cpu, or run on a GPU node"
        )
    return torch.device("cuda", local_rank)


def gpu_missing() -> str:
    """Why CUDA sees no GPU, as torch says it when asked (a driver too old for the wheel, none at all),
    else the usual causes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.is_available()
    said = [str(w.message).splitlines()[0] for w in caught]
    return said[0] if said else "no NVIDIA driver, one too old for this torch, or CUDA_VISIBLE_DEVICES empty"


def configure(device: torch.device) -> None:
    """On CUDA, let fp32 matmuls outside autocast use TF32 tensor cores (10-bit mantissa, ~8x fp32
    speed); on CPU, keep freed memory in the heap (tune_cpu_allocator)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        tune_cpu_allocator()


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def tune_cpu_allocator() -> bool:
    """Make glibc malloc keep freed memory for reuse instead of giving it back to the kernel.

    By default every allocation above the mmap threshold (at most 32 MiB: the logits of one
    micro-batch are larger) is its own mmap, unmapped again when freed, so a training step on CPU
    pays page faults and zeroing for its big tensors afresh every step. With mmap off and the heap
    never trimmed, the step reuses the same pages: ~1.5x tokens/s for the default config on 2 cores
    (docs/benchmarks.md, "On CPU: the allocator"). The process keeps its peak memory, which it reaches every step anyway.
    Returns False where the C library is not glibc (macOS, musl): nothing is changed there."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1


def use_bf16(precision: str, device: torch.device) -> bool:
    """bf16 for train.precision on this device: the step's autocast, Muon's Newton-Schulz
    (kiln.train.optim), FSDP2's parameter dtype, the in-loop decode (Trainer.sample) and, on a GPU, the
    eval stage's autocast all follow this one answer. "auto" reaches here as bf16 (the smoke stage
    resolves it on a CPU, where either may be faster, and train runs its pick; on a GPU it is bf16)."""
    if precision not in ("bf16", "auto"):
        return False
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        log.warning("bf16 not supported on %s: training in fp32", torch.cuda.get_device_name(device))
        return False
    return True


def cpu_bf16_emulated() -> bool:
    """Whether this CPU certainly lacks bf16 matmul instructions: an x86 CPU with neither AVX-512 BF16
    nor AMX, where oneDNN converts bf16 to fp32 around every matmul (a bf16 matmul ~34x slower than an
    fp32 one on a 2-core AVX2 machine, docs/benchmarks.md). False where the flags are there, or on
    another architecture (Arm's BF16 extension, which torch does not report here): whether bf16 is
    faster there, for this model, is for the smoke stage to time."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    flags = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return not any(flag is None or flag() for flag in flags)  # a torch without the probes: not certain


def autocast(device: torch.device, bf16: bool):
    """A context factory: bf16 autocast on this device, or nothing."""
    if not bf16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def eval_autocast(device: torch.device, precision: str):
    """The eval stage's autocast factory: train's bf16 on a GPU (train.precision), what the model
    trained under, at about twice TF32's matmul rate; none on the CPU, where eval has always run in
    fp32, so CPU figures stay exact and comparable with every CPU run before."""
    return autocast(device, device.type == "cuda" and use_bf16(precision, device))


def use_compile(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false or "auto" (on for CUDA, where it pays back its compile time within
    minutes; off on CPU, where a short run would spend much of its time compiling)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def memory_gib(device: torch.device, ranks_here: int) -> float:
    """The memory one rank may plan for: its GPU's, or on a CPU its share of the host's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GIB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB / ranks_here


def fit_auto(train: TrainSection, model: ModelConfig, world: int, device: torch.device) -> TrainSection:
    """train with micro_batch and activation_checkpointing concrete: auto's pick on this device
    (kiln.plan.autofit, logged), or as given."""
    picked, why = autofit.resolve(
        train,
        model,
        world,
        memory_gib(device, train.nproc_per_node),
        cuda=device.type == "cuda",
        bf16=use_bf16(train.precision, device),
        compiled=use_compile(train.compile, device),
    )
    if why is not None and os.environ.get("RANK", "0") == "0":
        log.info("train.micro_batch / activation_checkpointing %s", why)
    return picked


def step_setting(
    train: TrainSection, model: ModelConfig, world: int, device: torch.device, grad_accum: int = 1
) -> memory.Setting:
    """kiln.plan.memory's Setting of `train` (its micro-batch concrete) as this device runs it: its
    precision, compile, and the loss whole where the memory plan has room for all a micro-batch's
    logits on a GPU (kiln.plan.memory.loss_rows)."""
    setting = memory.setting_of(
        train,
        cuda=device.type == "cuda",
        world=world,
        bf16=use_bf16(train.precision, device),
        compiled=use_compile(train.compile, device),
        grad_accum=grad_accum,
    )
    return replace(setting, loss_rows=memory.loss_rows(model, setting, memory_gib(device, train.nproc_per_node)))


def fit_loss(train: TrainSection, model: ModelConfig, world: int, grad_accum: int, device: torch.device) -> int | None:
    """Rows per chunk of the training loss on this device (step_setting), logged on a GPU: the whole
    micro-batch, or None for the default chunks."""
    rows = step_setting(train, model, world, device, grad_accum).loss_rows
    if device.type == "cuda" and os.environ.get("RANK", "0") == "0":
        log.info(
            "the loss: %s",
            f"whole, {rows:,} rows a micro-batch (the memory plan has room for their logits)"
            if rows
            else "in chunks (the memory plan has no room for a micro-batch's whole logits)",
        )
    return rows


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on `device`. On CUDA the copy is asynchronous from pinned (page-locked) memory, so
    the host goes on queueing work; torch's caching host allocator makes repeated pinning cheap."""
    if device.type != "cuda":
        return batch
    return batch.pin_memory().to(device, non_blocking=True)
