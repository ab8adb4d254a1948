"""Readying the model for the run's ranks: activation checkpointing, torch.compile (per block), then
DDP or FSDP2 (torchtitan's order); gradient-sync control for accumulation; full or sharded state dicts for checkpoints.

Activation checkpointing (train.activation_checkpointing) is applied here, to the blocks, not asked
of the model: a checkpointed block's forward runs under torch.utils.checkpoint (non-reentrant), so
its forward keeps only its inputs (the residual stream, (B, T, C) fp32) and backward reruns it to get
the rest. `full` does that to every block, `selective` to every other one (torchtitan's layer-level
selective AC at frequency 2: its 2nd, 4th, ... block), `none` to none. The module tree and parameter
names are untouched (no wrapper module), so checkpoints and state dicts read the same in every mode;
RNG state is replayed on recompute, so dropout draws the same masks (tests/unit/model/test_model.py).

- ddp (default): every rank holds the whole model; gradients are all-reduced (averaged) in buckets
  overlapping the backward pass. Fastest while the model, its gradients and AdamW's two moments
  (16 bytes per parameter in fp32) fit on one device. Buffers are not broadcast before each forward
  (NO_BUFFER_SYNC): the only ones are derived tables every rank builds alike.
- fsdp: FSDP2 `fully_shard` per block and at the root: parameters, gradients and optimizer state
  are sharded across ranks and gathered block by block, for models that do not fit DDP. With bf16
  the gathered parameters are bf16 and gradients are reduced in fp32. On several nodes it is HSDP
  (`device_mesh`): sharded across the ranks of a node, replicated across nodes.
- One rank trains the plain module under either (nothing to replicate or shard), unless
  train.fsdp_one_rank (`shard_one_rank`): then fsdp shards it over a 1-rank mesh anyway, with the
  mixed-precision policy of several ranks, in the group of one that kiln.train.distributed makes for
  it. Nothing is split, but one GPU then runs seed 000's path as 8 do: FSDP2's hooks around the
  compiled blocks, DTensor parameters, DCP's collective sharded save and load (bench/gpu_check's
  fsdp-one-rank row). A switch beside fsdp, not a third strategy: the step is fsdp's. Off by default:
  it buys one rank no memory and costs it the hooks, so a world-1 fsdp config (a workstation's smoke
  probe) keeps the plain module. Tagged RUN, as train.parallel is: in fp32 the weights came out the
  plain rank's bit for bit on the CPU, in bf16 they differ as FSDP's from DDP's (bf16 parameters
  against autocast's casts) (tests/unit/train/test_fsdp_one_rank.py, tests/dag/test_tags.py), so a
  switch reruns no training.

Checkpoint state comes in two forms (kiln.train.checkpoint writes either; any run reads both), both
through torch.distributed.checkpoint's helpers, which key optimizer state by parameter name:
`full_model_state`/`full_optimizer_state` gather whole tensors onto rank 0's CPU (the `full`
format: one file, rank 0 holding the whole state at a save), `sharded_state` is each rank's own part
(the `sharded` format: every rank writes its shards, and a load reshards them onto this run's
layout). Either way a checkpoint reads the same whichever strategy and rank count wrote it and
whichever reads it: one written by 2 FSDP ranks resumes on 1, and the reverse (tests/process/test_distributed.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from kiln.config.models import blockwise_attention
from kiln.errors import ConfigError
from kiln.model.loss import chunk_loss_sum
from kiln.plan.memory import checkpointed_blocks
from kiln.train.distributed import Dist

STRATEGIES = ("ddp", "fsdp")
GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU
SCATTER = StateDictOptions(full_state_dict=True)  # every rank passes the whole state; each keeps its part

# DDP broadcasts rank 0's buffers before every forward by default. Kiln's only buffers are llama's
# RoPE cos/sin tables, derived from the config on every rank alike and never trained (GPT has none),
# so that is NCCL traffic for nothing each step. torch 2.13 renamed the switch forward_sync_buffers
# (which still syncs once at construction) and deprecated broadcast_buffers; older torch has only the latter.
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


def parallelize(
    model: nn.Module,
    d: Dist,
    *,
    strategy: str,
    compile_model: bool,
    activation_checkpointing: str,
    bf16: bool,
    shard_one_rank: bool = False,
) -> nn.Module:
    """The module the training step calls. `model` itself stays the one to read parameters and
    state from (fully_shard changes it in place; DDP wraps it). shard_one_rank: train.fsdp_one_rank."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    apply_activation_checkpointing(model, activation_checkpointing)
    if compile_model:
        compile_blocks(model)
    if d.world == 1 and not (strategy == "fsdp" and shard_one_rank):  # nothing to replicate or shard across
        return model
    if strategy == "fsdp":
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy()
        )
        mesh = device_mesh(d.device.type, d.world, d.nnodes)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)  # gathered for its forward, freed after
        fully_shard(model, mesh=mesh, mp_policy=policy)  # embedding, final norm, head
        return model
    if compile_model:
        # dynamo's DDPOptimizer would split each compiled block's graph at DDP's bucket boundaries, so
        # that a bucket's all-reduce can start inside it. The blocks are compiled one by one already:
        # their gradients reach DDP block by block and its all-reduce overlaps the backward anyway,
        # while a split block loses the fusion across the cut (torchtitan turns it off likewise).
        torch._dynamo.config.optimize_ddp = False
    # Gradients as views into DDP's all-reduce buckets: without it the buckets are a second copy of
    # every gradient (4 bytes a parameter: 4.2 GB for llama3.2-1b) (kiln.plan.memory counts them once).
    return DistributedDataParallel(
        model,
        device_ids=[d.local_rank] if d.device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **NO_BUFFER_SYNC,
    )


def device_mesh(device_type: str, world: int, nnodes: int) -> DeviceMesh:
    """FSDP's mesh. One node: 1-D ("shard",), every rank holding a shard. Several: HSDP, 2-D
    ("replicate", "shard") of shape (nnodes, ranks per node), ranks numbered node by node as torchrun
    does, so a row is a node: each block's all-gather and reduce-scatter stay on the node's fast links,
    and only one all-reduce of the sharded gradients per step crosses nodes, at the price of each node
    holding a whole copy of the sharded state."""
    # The mesh is host metadata of real ranks: made outside a fake-tensor mode (kiln.rehearse), where
    # reading its rank tensor back would be data-dependent.
    with unset_fake_temporarily():
        if nnodes > 1:
            return init_device_mesh(device_type, (nnodes, world // nnodes), mesh_dim_names=("replicate", "shard"))
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Run the chosen blocks' forward under torch.utils.checkpoint when training (grad on, train
    mode); evaluation and KV-cached decoding run them plainly."""
    for i in checkpointed_blocks(mode, len(model.blocks)):
        block = model.blocks[i]
        forward = block.forward  # the class's, bound; replaced on this instance only

        @functools.wraps(forward)
        def recomputed(*args, _block=block, _forward=forward, **kwargs):
            if _block.training and torch.is_grad_enabled():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return _forward(*args, **kwargs)

        block.forward = recomputed


def compile_blocks(model: nn.Module, backend: str | Callable = "inductor") -> None:
    """torch.compile each block in place (parameter names keep no "_orig_mod." prefix), on one rank
    as on several: torchtitan's choice, and what seed 000 measured. The blocks share their class and
    shapes, so dynamo traces one graph and reuses it for every block (their weights are the graph's
    inputs): compile time does not grow with depth (a 16-layer llama on the CPU, inductor cold:
    about 1/3.5 of a whole-model compile's, docs/benchmarks.md, "Compiled as train compiles"). Across ranks the backward hands
    out gradients block by block, so the all-reduce / reduce-scatter overlaps it. The chunked loss's
    per-chunk function is compiled too (kiln.model.loss: its own graph, static shapes: the full chunk
    and at most one shorter last one). What stays eager: the embedding and the final norm.
    bench/gpu_check calls this too, with the aot_eager backend in its CPU dry run."""
    device = next(model.parameters()).device
    if backend == "inductor" and device.type == "cpu":
        require_cpp_compiler()
    # inductor on a CPU: attention written out for it to fuse (kiln.model.sdpa.blockwise_causal)
    blockwise = backend == "inductor" and blockwise_attention(model.config, cuda=device.type == "cuda", compiled=True)
    for block in model.blocks:
        block.attn.blockwise = blockwise
        block.compile(backend=backend, fullgraph=True)  # a graph break in a block is an error, not a slow path
    model.chunk_loss = torch.compile(chunk_loss_sum, backend=backend, dynamic=False)


def require_cpp_compiler() -> None:
    """Inductor writes C++ for a CPU's kernels and builds them with the host's compiler: without one the
    first step would fail deep inside torch, after the data and model are up. Fail first, by the key."""
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        raise ConfigError(
            "train.compile: torch.compile on a CPU needs a C++ compiler (inductor builds its kernels with "
            "g++ or clang++; torch._inductor.config.cpp.cxx names the ones searched), and none was found: "
            "install one (apt-get install g++) or set train.compile: false"
        ) from None


def grad_sync(wrapped: nn.Module, sync: bool):
    """Context for one micro-batch's forward and backward: on all but the last micro-batch of a
    step gradients only accumulate locally (DDP no_sync; FSDP2's requires_gradient_sync)."""
    if isinstance(wrapped, FSDPModule):
        wrapped.set_requires_gradient_sync(sync)
    elif isinstance(wrapped, DistributedDataParallel) and not sync:
        return wrapped.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global gradient norm (a device tensor: no host sync), clipping to max_norm if > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):  # FSDP: the per-shard norms are combined here
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


def full_model_state(model: nn.Module) -> dict:
    """Model state, whole and on CPU, on rank 0 (empty elsewhere). Collective under FSDP: every rank
    must call it."""
    return get_model_state_dict(model, options=GATHER)


def _parts(optimizer) -> torch.optim.Optimizer | list[torch.optim.Optimizer]:
    """A torch optimizer, or kiln.train.optim.Optimizers' parts: the helpers below take a list and
    key every part's state by parameter name in one dict (one optimizer's dict for a single one)."""
    return getattr(optimizer, "parts", optimizer)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Optimizer state keyed by parameter name, whole and on CPU, on rank 0; collective under FSDP."""
    return get_optimizer_state_dict(model, _parts(optimizer), options=GATHER)


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model", "optimizer"}: this rank's part, keyed by parameter name, without a gather (FSDP: its
    shards, DTensors that say where they sit in the whole; DDP and one rank: the whole tensors), for
    torch.distributed.checkpoint to write or to fill in place."""
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, _parts(optimizer))}


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, read: Callable[[dict], None]) -> None:
    """Load a sharded checkpoint: `read` fills this rank's part (sharded_state's layout, whatever
    layout wrote it) in place. Collective."""
    state = sharded_state(model, optimizer)  # the optimizer's state is created here if it has none yet
    read(state)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, _parts(optimizer), state["optimizer"])


def load_full_model_state(model: nn.Module, model_state: dict) -> None:
    """Whole weights (every rank passes all of them) into the model, each rank keeping its part."""
    set_model_state_dict(model, model_state, options=SCATTER)


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict
) -> None:
    set_model_state_dict(model, model_state, options=SCATTER)
    set_optimizer_state_dict(model, _parts(optimizer), optimizer_state, options=SCATTER)
