"""Process-group setup from torchrun's environment: gloo on CPU, nccl on CUDA, nothing when alone; the
device from train.device (kiln.train.device.select_device)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kiln.train.device import select_device


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_setting: str = "auto") -> Dist:
    """This process's rank and device (train.device: auto, cuda or cpu), joining the process group
    when there are several ranks."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = select_device(device_setting, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    return Dist(rank, local_rank, world, device)


def mean_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= world
    return value


def sum_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def shutdown(world: int) -> None:
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def max_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    """The elementwise max over ranks, on the device (no host sync): e.g. "did any rank see this"."""
    if world > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value
