"""Process-group setup from torchrun's environment: gloo on CPU, nccl on CUDA, nothing when alone; the
device from train.device (kiln.train.device.select_device).

A collective waits for every rank at most train.first_step_timeout_s (default 1800 s) until a
Trainer's first optimizer step is done, then at most train.collective_timeout_s (default 600 s)
(set_collective_timeout, as torchtitan sets its train timeout after the first step); then it fails
on the ranks that got there (gloo raises; NCCL's watchdog aborts the process), so a rank stuck or
dead ends the job within that time instead of torch's defaults of 30 min (gloo) and 10 min (NCCL).
The first bound covers the waits only the start has: the slowest rank's torch.compile (minutes for a
large model), the first step's shard checks (kiln.data.loader.ShardChecks, ~0.5 s per GB), rank 0
hashing the checkpoint a resume reads while the others wait for its verdict
(kiln.train.checkpoint.resume_state, ~1 s per GB). The second must exceed the longest wait of a
running job: rank 0 writing a checkpoint while the others wait at the next collective.

Every collective Kiln calls goes through the helpers here (tests/unit/train/test_collectives.py fails on any
other torch.distributed collective in src/ or workflow/): NCCL, the default group on GPUs, takes only
CUDA tensors, and gloo, which the CPU tests run, takes host tensors too, so a host tensor handed to a
collective passes every test and crashes the first multi-GPU job (smoke's checkpoint timing did).
A tensor goes to where the group's backend takes it (collective_device) and its result comes back to
the caller's device. The object collectives (all_gather_object, broadcast_object_list) pickle into a
tensor on torch.cuda.current_device() under NCCL: init_distributed sets it to this rank's GPU first.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kiln.errors import CollectiveTimeout, KilnError
from kiln.train.device import select_device

DEFAULT_TIMEOUT_S = 600  # the schema's default for train.collective_timeout_s
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    device: torch.device
    nnodes: int = 1  # torchrun's nodes: WORLD_SIZE / LOCAL_WORLD_SIZE (FSDP shards within one, kiln.train.parallel)
    grouped: bool = False  # in a process group of Kiln's: several ranks, or train.fsdp_one_rank's group of one

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(
    device_setting: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S, group_of_one: bool = False
) -> Dist:
    """This process's rank, device (train.device: auto, cuda or cpu) and node count, joining the
    process group when there are several ranks, its collectives failing after timeout_s
    (train.collective_timeout_s). Alone, a group of this one rank when group_of_one
    (train.fsdp_one_rank: FSDP2's mesh and DCP's collectives need one), its store in this process."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node < 1 or world % per_node:
        raise KilnError(
            f"train: WORLD_SIZE {world} is not a whole number of nodes of LOCAL_WORLD_SIZE {per_node} "
            "ranks (torchrun sets both: every node must run train.nproc_per_node ranks)"
        )
    device = select_device(device_setting, local_rank, ranks=world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if (world > 1 or group_of_one) and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            device_id=device if device.type == "cuda" else None,
            timeout=timedelta(seconds=timeout_s),
            **({} if world > 1 else {"store": dist.HashStore(), "rank": 0, "world_size": 1}),
        )
    return Dist(rank, local_rank, world, device, world // per_node, grouped=world > 1 or group_of_one)


def collective_device(backend: str, device: torch.device) -> torch.device:
    """Where a tensor on `device` must be for a collective of a group whose backend is `backend`
    (dist.get_backend: "nccl", "gloo", or "cpu:gloo,cuda:nccl" pairs): where it is, if the backend
    takes that device; else a CUDA tensor's host or a host tensor's GPU (the current one, which
    init_distributed set to this rank's)."""
    takes = set()
    for part in str(backend).lower().split(","):
        kind, _, name = part.strip().rpartition(":")
        takes |= {kind} if kind else set(dist.Backend.backend_capability.get(name, ["cpu"]))
    if device.type in takes:
        return device
    return torch.device("cuda") if "cuda" in takes else torch.device("cpu")


def _all_reduce(value: torch.Tensor, op, group=None) -> torch.Tensor:
    """A reduced copy of `value` (never in place), on value's device whatever the backend takes."""
    where = collective_device(dist.get_backend(group), value.device)
    work = value.to(where, copy=True)
    dist.all_reduce(work, op=op, group=group)
    return work.to(value.device)


def mean_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        value = _all_reduce(value, dist.ReduceOp.SUM)
        value /= world
    return value


def sum_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        value = _all_reduce(value, dist.ReduceOp.SUM)
    return value


def gather_objects(obj, world: int) -> list:
    """Every rank's `obj` (picklable), by rank; [obj] alone."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, world: int, src: int = 0):
    """Rank src's `obj` (picklable) on every rank; what other ranks pass is ignored."""
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def same_on_every_rank(value: torch.Tensor, world: int) -> torch.Tensor:
    """Rank 0's `value` on every rank (a tensor on the rank's device, as NCCL needs; gloo's on the
    host), e.g. the tokens a sampler decodes under FSDP (kiln.generate.decode's agree)."""
    if world > 1:
        value = value.contiguous()
        dist.broadcast(value, src=0)
    return value


def _where_the_backend_takes(tensors: list[torch.Tensor], group) -> None:
    """In-place collectives cannot move a tensor: each must already be where the group's backend takes
    it (e.g. Muon's updates, on the parameters' device: CUDA under NCCL, the host under gloo)."""
    backend = dist.get_backend(group)
    for t in tensors:
        if collective_device(backend, t.device) != t.device:
            raise KilnError(f"a {t.device} tensor in a collective of a {backend} group (it takes {backend}'s devices)")


def broadcast_async(tensor: torch.Tensor, src: int, group=None) -> dist.Work:
    """Rank src's `tensor` into `tensor` on every rank of `group` (src: a global rank), queued: wait()
    on the returned work (on CUDA the current stream waits, not the host)."""
    _where_the_backend_takes([tensor], group)
    return dist.broadcast(tensor, src=src, group=group, async_op=True)


def all_to_all_async(
    output: torch.Tensor, input: torch.Tensor, output_splits: list[int], input_splits: list[int], group=None
) -> dist.Work:
    """input's i-th block (input_splits[i] elements) to rank i of `group`, rank i's block for this rank
    into output's i-th (output_splits[i]), queued: wait() on the returned work. Blocks may differ in
    size and be empty (gloo and NCCL alike)."""
    _where_the_backend_takes([output, input], group)
    return dist.all_to_all_single(output, input, output_splits, input_splits, group=group, async_op=True)


def set_collective_timeout(timeout_s: float) -> None:
    """From now on a collective of the default group, if any, fails after timeout_s. torch has no
    public call for it; torchtitan uses this one (distributed_c10d._set_pg_timeout) after its first
    step too."""
    if dist.is_initialized():
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


@contextlib.contextmanager
def collective_deadline(timeout_s: float, first_step_s: float):
    """Turns the error of a collective that timed out into a KilnError naming the keys (other errors
    pass through)."""
    try:
        yield
    except RuntimeError as exc:  # gloo's timeout, and torch's DistBackendError, are RuntimeErrors
        if not _TIMEOUT.search(str(exc)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CollectiveTimeout(
            f"train: a collective waited more than train.collective_timeout_s = {timeout_s:g} s "
            f"(train.first_step_timeout_s = {first_step_s:g} s until the first step is done) for another rank, "
            f"which is stuck or dead (its log lines say which); raise the key if a checkpoint save, or before "
            f"the first step a compilation, takes longer than that. ({first})"
        ) from exc


def shutdown(synced: bool = False) -> None:
    """Leave the process group, if any (several ranks, or train.fsdp_one_rank's group of one); synced: every rank got here the same way (a run that finished or
    stopped itself), not through an error only some ranks raised.

    gloo's worker threads let go of a finished collective's tensors under the GIL, and the group's
    destructor, which runs at interpreter exit holding the GIL (from DDP's reducer), waits for those
    threads: a rank that exited within a few ms of its last collective hung there for good (seen
    after the final checkpoint's RNG gather; pytorch/pytorch#56297). When synced, a barrier and a
    short sleep, both without the GIL, let the threads finish first."""
    if dist.is_initialized():
        if synced:
            dist.barrier()
            time.sleep(0.05)
        dist.destroy_process_group()


def max_across_ranks(value: torch.Tensor, world: int) -> torch.Tensor:
    """The elementwise max over ranks, on the device (no host sync): e.g. "did any rank see this"."""
    if world > 1:
        value = _all_reduce(value, dist.ReduceOp.MAX)
    return value
