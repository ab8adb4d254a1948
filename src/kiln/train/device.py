"""Per-device speed settings: TF32 matmuls, bf16 autocast over fp32 weights, compile by default on
CUDA, pinned non-blocking host-to-device copies.

bf16 autocast keeps the weights, gradients and optimizer state in fp32 (the "master" copy) and runs
matmuls in bf16; unlike fp16 it needs no loss scaling. SDPA then dispatches to the flash kernel on
CUDA (bf16, causal, head dim <= 256); on CPU it runs the fused CPU kernel.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger("kiln.train")


def configure(device: torch.device) -> None:
    """Let fp32 matmuls outside autocast use TF32 tensor cores (10-bit mantissa, ~8x fp32 speed)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision != "bf16":
        return False
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        log.warning("bf16 not supported on %s: training in fp32", torch.cuda.get_device_name(device))
        return False
    return True


def autocast(device: torch.device, bf16: bool):
    """A context factory: bf16 autocast on this device, or nothing."""
    if not bf16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def use_compile(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false or "auto" (on for CUDA, where it pays back its compile time within
    minutes; off on CPU, where a short run would spend much of its time compiling)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on `device`. On CUDA the copy is asynchronous from pinned (page-locked) memory, so
    the host goes on queueing work; torch's caching host allocator makes repeated pinning cheap."""
    if device.type != "cuda":
        return batch
    return batch.pin_memory().to(device, non_blocking=True)
