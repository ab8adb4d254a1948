"""A checkpoint save and a resume load as phases of the rehearsal (kiln.rehearse.run), and the check
that a sharded checkpoint's writes cover every element of every tensor on every rank.

Both phases run the train stage's own functions on the rehearsed Trainer after its steps, in the
run's train.checkpoint_format (kiln.config.rules.checkpoint_format, as kiln.train.callbacks'
Checkpoints picks it), as Trainer.save_checkpoint and Trainer.load_state_dict call them:

- sharded (FSDP's): the save takes parallel.sharded_state (this rank's DTensors, nothing gathered),
  then what dcp.save runs before a byte moves: DCP's DefaultSavePlanner plans the writes and resolves
  each of this rank's for the writer, where FileSystemWriter (and async_save's staging) copies it to
  host memory. There the phase stops: a fake tensor has no bytes to copy or write, and the copy
  allocates nothing on the device. The resume runs parallel.load_sharded_state with, in place of
  checkpoint.read_shards (dcp.load, which reads the files), DCP's load planning of this rank's reads
  against the save's metadata and each read's target resolved (a view of the state it fills in
  place); then set_model_state_dict and set_optimizer_state_dict, counted as they run.
- full (DDP's): parallel.full_model_state and full_optimizer_state, which gather the whole state onto
  rank 0's host (cpu_offload), then the resume's parallel.load_full_state of what was gathered;
  torch.save and the resume's read of state.pt are host work, not run. DDP is rehearsed as one rank
  (kiln.rehearse.run.rehearsed_world): its tensors are whole, and a fake tensor's copy to the CPU is
  the tensor itself, which costs nothing here as the host copy costs the device nothing there. Under
  FSDP with the full format (no shipped config sets it) each gathered whole tensor stays counted,
  where the run frees it on the device once copied: that phase's peak is an upper bound.

The resume runs on the rehearsed Trainer after its steps, its gradients freed as between steps. A
sharded resume starts, as a resuming job's does, with no optimizer state: load_sharded_state makes it
(torch's _init_optim_state: zero gradients and a step), so the state the steps made is dropped first,
and the state checked after the phases (kiln.rehearse.run.optimizer_state_problems) is the resumed
one. A full resume loads into the state the steps made: torch's Optimizer.load_state_dict copies the
host state onto the device beside the state it replaces, and here the host state is that device
state (a fake CPU tensor's copy to the CPU is itself), so the full format's resume is counted short
by up to one copy of the optimizer state.

The coverage check (sharded format only): DCP plans each rank's writes from its state's DTensors,
each rank's chunk derived from the tensor's global shape, mesh and placements at that rank's mesh
coordinate. The rehearsal is rank 0 alone, so every rank's plan is made here with DCP's own
DefaultSavePlanner, the meshes set to that rank's coordinate while it plans, and DCP's global
planning merges them: replicas' chunks (HSDP's nodes) deduplicated, then validated (each chunk in
bounds, no two overlapping, the chunks' elements adding up to the tensor's). A gap or an overlap is
a problem of the rehearsal, which then fails naming it.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, SavePlan, WriteItemType
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from kiln.config.rules import checkpoint_format
from kiln.plan.rehearsal import UNBATCHED_ADVICE
from kiln.train import parallel
from kiln.train.trainer import Trainer


@contextlib.contextmanager
def as_rank(state: dict, rank: int):
    """The meshes of `state`'s DTensors at `rank`'s coordinate (None: not in the mesh), which DCP's
    planner reads for the chunk a rank writes (DeviceMesh.get_coordinate), restored after."""
    meshes = {id(t.device_mesh): t.device_mesh for t in tree_leaves(state) if isinstance(t, DTensor)}
    saved = {key: mesh._coordinate_on_dim for key, mesh in meshes.items()}
    try:
        for mesh in meshes.values():
            mesh._coordinate_on_dim = DeviceMesh._compute_coordinates_from_mesh(mesh.mesh, rank)
        yield
    finally:
        for key, mesh in meshes.items():
            mesh._coordinate_on_dim = saved[key]


def rank_plans(state: dict, world: int) -> list[SavePlan]:
    """Each of the `world` ranks' DCP save plan of `state` (parallel.sharded_state's layout, every
    rank's alike but for its DTensors' local parts), as dcp.save's DefaultSavePlanner makes it on
    that rank. Outside the fake-tensor mode: the planner reads a chunk's offset back from a tensor."""
    plans = []
    with _disable_current_modes():
        for rank in range(world):
            with as_rank(state, rank):
                planner = DefaultSavePlanner()
                planner.set_up_planner(state, is_coordinator=rank == 0)
                plans.append(planner.create_local_plan())
    return plans


def coverage_problems(plans: list[SavePlan]) -> tuple[list[str], Metadata | None]:
    """(gaps and overlaps, the checkpoint's metadata) of every rank's save plan merged as dcp.save's
    coordinator merges them (DefaultSavePlanner.create_global_plan, which validates the merge); no
    metadata where it does not validate."""
    try:
        with _disable_current_modes():
            _, metadata = DefaultSavePlanner().create_global_plan(plans)
    except ValueError as exc:  # "Failed to validate global plan: key:... invalid fill ...; key:..."
        return [f"the sharded checkpoint's plan does not cover every shard: {exc}"], None
    return [], metadata


class CheckpointPhases:
    """A checkpoint save and a resume load of `trainer` as rehearsal phases ((name, work, whether it
    keeps activations for backward, advice), kiln.rehearse.run's form), and `problems`: what the
    save's coverage check found, once the save has run."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.sharded = checkpoint_format(trainer.train.checkpoint_format, trainer.train.parallel) == "sharded"
        self.problems: list[str] = []
        self._metadata: Metadata | None = None  # the sharded save's, which the resume plans its reads against
        self._full: tuple[dict, dict] | None = None  # the full save's (model, optimizer), which the resume loads

    @property
    def phases(self) -> tuple[tuple[str, Callable[[], None], bool, str], ...]:
        fmt = "sharded, DCP" if self.sharded else "full, gathered to rank 0's host"
        return (
            (f"checkpoint save ({fmt})", self.save, False, UNBATCHED_ADVICE),
            (f"resume load ({fmt})", self.load, False, UNBATCHED_ADVICE),
        )

    def save(self) -> None:
        model, optimizer = self.trainer.model, self.trainer.optimizer
        if not self.sharded:
            self._full = parallel.full_model_state(model), parallel.full_optimizer_state(model, optimizer)
            return
        state = parallel.sharded_state(model, optimizer)
        plans = rank_plans(state, self.trainer.dist.world)
        self.problems, self._metadata = coverage_problems(plans)
        writer = DefaultSavePlanner()  # this rank's, as dcp.save resolves each write for the file writer
        writer.set_up_planner(state, is_coordinator=True)
        for item in plans[self.trainer.dist.rank].items:
            if item.type != WriteItemType.BYTE_IO:  # bytes are pickled on the host
                writer.resolve_data(item)

    def load(self) -> None:
        model, optimizer = self.trainer.model, self.trainer.optimizer
        if not self.sharded:
            parallel.load_full_state(model, optimizer, *self._full)
            return
        for part in optimizer.parts:  # a resuming job's optimizer has none yet: load_sharded_state makes it
            part.state.clear()
        parallel.load_sharded_state(model, optimizer, self._planned_read)

    def _planned_read(self, state: dict) -> None:
        """checkpoint.read_shards' work up to the files: this rank's reads planned against the save's
        metadata (none where its plan did not validate: a problem already) and each read's target
        resolved, the view of `state` that the file's bytes would be copied into."""
        if self._metadata is None:
            return
        reader = DefaultLoadPlanner()
        with _disable_current_modes():  # as rank_plans: the planner reads offsets back
            reader.set_up_planner(state, self._metadata, is_coordinator=self.trainer.dist.rank == 0)
            plan = reader.create_local_plan()
        for item in plan.items:
            if item.type == LoadItemType.TENSOR:
                reader.resolve_tensor(item)
