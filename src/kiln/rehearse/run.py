"""A run's GPU-side work at its real shapes and world size, on this CPU, with no data and no GPU.

The train stage's own objects do the work: a Trainer (kiln.train.trainer) built from the run's
config, its model made and readied by kiln.train.parallel (DDP, or FSDP2 / HSDP on the mesh of
nnodes x nproc_per_node; DDP's replicas as one rank), its optimizer, its train_step (the second: the
first makes the optimizer's state), its validation, the smoke gate's eager validation
(kiln.gate.checks.validate_eagerly) and, with eval.in_loop on, its decode (Trainer.sample). Around them:
- torch's fake process group of the run's world size, as this process's rank 0 (torchtitan's
  COMM_MODE=fake_backend dry run): collectives return at once, shapes as the real ones;
- FakeTensorMode: tensors carry shape, dtype and device, no memory;
- the branches a GPU takes: bf16, the document mask through flex attention (kiln.model.documents.flex_on),
  train.micro_batch / activation_checkpointing auto as the card resolves them, the loss whole or in
  chunks as the card's memory plan decides (kiln.plan.memory.loss_rows). The fake tensors live on
  the CPU: FSDP2's CUDA streams and a CUDA build's random init cannot run in a CPU build of torch;
- a shard folder of random ids at the run's vocabulary and context, documents of about 2,000 tokens,
  as many rows as one step and one validation batch read.

After them, a checkpoint save and a resume load in the run's checkpoint format, and whether a sharded
checkpoint's plan covers every shard of every rank (kiln.rehearse.checkpoint).

Compiled code does not run here: torch.compile's inductor needs the GPU it compiles for. The step
runs eagerly at the compiled step's shapes; attention and the loss allocate as their fused kernels do
(SDPA's flash path, flex's fake kernel, the chunked loss), and what a compiled block would fuse away
(its elementwise intermediates) is counted as eager keeps it. A compiled run's train step is judged
by that count less the difference of kiln.plan.memory's eager and compiled estimates at the step
(compiling_saves), which the calibration checked against the H200's compiled peak.

Then the eval stage's batches, its model whole on one card in a count of its own (kiln.rehearse.eval_stage).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.attention.flex_attention
from torch._subclasses.fake_tensor import DataDependentOutputException, unset_fake_temporarily
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from kiln.config.batch import split_batch
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.data.shards import shard_split
from kiln.gate.checks import oom_advice, validate_eagerly
from kiln.generate.decode import generate
from kiln.io import write_json
from kiln.model.documents import flex_on
from kiln.plan import autofit
from kiln.plan.memory import FIT_FRACTION, GIB, Setting, estimate, loss_rows, setting_of
from kiln.plan.peaks import GPU, planned_gpu
from kiln.plan.rehearsal import UNBATCHED_ADVICE, Phase, Rehearsal, check
from kiln.rehearse.checkpoint import CheckpointPhases
from kiln.rehearse.live import LiveBytes, counting
from kiln.train.device import use_compile
from kiln.train.trainer import Trainer

DOCUMENT_TOKENS = 2000  # a synthetic document's length: several in each 8k row, as packed code files are
EOS_ID = 0
PER_ELEMENT_STATE = {"exp_avg", "exp_avg_sq", "momentum_buffer"}  # AdamW's and Muon's: a parameter's shape each


def synthetic_shards(out: Path, vocab: int, seq_len: int, train_rows: int, val_rows: int, seed: int) -> Path:
    """A shard folder as the shard stage writes it, of random ids below vocab, an EOS every
    ~DOCUMENT_TOKENS tokens."""
    rng = np.random.default_rng(seed)
    row_len = seq_len + 1
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    splits = {}
    for split, rows in (("train", train_rows), ("val", val_rows)):
        ids = rng.integers(1, vocab, size=rows * row_len, dtype=np.int64)
        ids[rng.random(ids.size) < 1 / DOCUMENT_TOKENS] = EOS_ID
        splits[split] = shard_split(ids.astype(dtype), out, split, row_len, rows, vocab)
    write_json(
        out / "manifest.json",
        {
            "seq_len": seq_len,
            "row_len": row_len,
            "dtype": np.dtype(dtype).name,
            "vocab_size": vocab,
            "padded_vocab_size": vocab,
            "splits": splits,
            "documents": {"eos_id": EOS_ID, "bos_id": None},
        },
    )
    return out


@contextlib.contextmanager
def fake_world(world: int, per_node: int):
    """This process as rank 0 of `world` ranks, per_node a node, in torch's fake process group."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def gpu_flex():
    """The document mask through flex attention on the fake CPU tensors, backward included: flex
    refuses a backward on the CPU (torch.nn.attention.flex_attention._validate_device: its CPU kernel
    has none), a guard lifted here, where only the fake kernels run, which have one (the GPU's)."""
    module = torch.nn.attention.flex_attention
    guard, debug = module._validate_device, module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    module._validate_device = lambda query, key, value: None
    # With dynamo off, flex's eager path calls its op directly (its fullgraph compile would find nothing)
    module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        with flex_on("cpu"):
            yield
    finally:
        module._validate_device, module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = guard, debug


def as_on_gpu(run: RunConfig, vocab: int, gpu: GPU) -> RunConfig:
    """The run's config with the choices its GPU would make resolved (bf16, auto sizes), on this CPU
    (train.device cpu), eager (see the module docstring), a step of at most two micro-batches a rank
    on the ranks it is rehearsed as (rehearsed_world)."""
    train = run.train
    precision = "bf16" if train.precision in ("auto", "bf16") else train.precision
    model = model_config(run.model.as_dict(), vocab, run.shard.seq_len)
    train, _ = autofit.resolve(
        train.replace(precision=precision), model, train.ranks, gpu.memory_gib, cuda=True, compiled=True
    )
    step_tokens = _rehearsed_batch_tokens(train, run.shard.seq_len)
    return run.replace(train=train.replace(device="cpu", compile=False, batch_tokens=step_tokens))


def rehearsed_world(train) -> tuple[int, int]:
    """(ranks, ranks a node) the rehearsal runs as. FSDP's: a rank holds its shard of the mesh. DDP's
    ranks are replicas, each running one rank's step with its gradients as views into the all-reduce
    buckets (kiln.train.parallel), no byte more: rehearsed as one (DDP's reducer is C++ that reads its
    tensors' data, which fake tensors do not have)."""
    return (train.ranks, train.nproc_per_node) if train.parallel == "fsdp" else (1, 1)


def _rehearsed_batch_tokens(train, seq_len: int) -> int | None:
    """train.batch_tokens as the rehearsed ranks see it: a rank's micro-batches as the run splits them,
    but at most two: the first allocates the gradients, the second adds to them, and every later one
    repeats the second's allocations (a 64-micro-batch step rehearsed whole took 71 s, with the same peak)."""
    if train.batch_tokens is None:  # one micro-batch a rank
        return None
    accum = split_batch(train.batch_tokens, train.micro_batch, seq_len, train.ranks).grad_accum
    return min(accum, 2) * rehearsed_world(train)[0] * train.micro_batch * seq_len


class HostBatches:
    """The run's own batches, read on the host as the train stage reads them (the loader hashes each
    row with numpy), outside the fake-tensor mode."""

    def __init__(self, batches):
        self.batches = batches

    def next(self) -> torch.Tensor:
        with unset_fake_temporarily():
            return self.batches.next()


def unsharded(trainer: Trainer) -> list[str]:
    """Parameters FSDP should have sharded and did not."""
    if not (trainer.train.parallel == "fsdp" and (trainer.dist.world > 1 or trainer.train.fsdp_one_rank)):
        return []
    return [
        f"{name}: not sharded ({type(p).__name__})"
        for name, p in trainer.model.named_parameters()
        if not (isinstance(p, DTensor) and any(isinstance(placement, Shard) for placement in p.placements))
    ]


def optimizer_state_problems(trainer: Trainer) -> list[str]:
    """Optimizer state, made by the first step, whose shape is not its parameter's (this rank's part)."""
    problems = []
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    for part in trainer.optimizer.parts:
        for p, state in part.state.items():
            local = p.to_local() if isinstance(p, DTensor) else p
            for key in PER_ELEMENT_STATE & state.keys():
                value = state[key]
                got = value.to_local() if isinstance(value, DTensor) else value
                if got.shape != local.shape:
                    problems.append(
                        f"{names.get(id(p), '?')}: optimizer {key} {tuple(got.shape)}, parameter {tuple(local.shape)}"
                    )
    return problems


def rehearse(run: RunConfig, vocab: int, gpu: GPU, eval_batches_on: Sequence[str]) -> Rehearsal:
    """Every phase's per-rank peak for `run` (its model's padded vocabulary `vocab`) on `gpu`; of the
    eval stage's batches, those named in `eval_batches_on` (the whole config's
    kiln.config.eval_switches.eval_batches_on, which the rule gets in its params:
    kiln.config.settings.derived)."""
    compiled = use_compile(run.train.compile, torch.device("cuda"))  # as the GPU decides
    run = as_on_gpu(run, vocab, gpu)
    train, seq_len = run.train, run.shard.seq_len
    world, per_node = rehearsed_world(train)
    layout = f"{train.ranks} rank{'s' if train.ranks > 1 else ''}, {train.parallel}" + (
        f" (HSDP {train.nnodes} x {per_node})" if train.parallel == "fsdp" and train.nnodes > 1 else ""
    )
    result = Rehearsal(run.run_name, gpu, layout, advice=oom_advice(train, seq_len))
    usable = int(FIT_FRACTION * gpu.memory_gib * GIB)
    # every rank's micro-batches of one step (the loader wants whole global batches), twice over
    rows_per_step = split_batch(train.batch_tokens, train.micro_batch, seq_len, world).global_rows * 2
    with tempfile.TemporaryDirectory(prefix="kiln-rehearse-") as tmp, fake_world(world, per_node), gpu_flex():
        # the ids' values move no byte: a fixed seed, so the run's seed is not the rehearsal's input
        shards = synthetic_shards(Path(tmp), vocab, seq_len, rows_per_step, world * train.micro_batch, seed=0)
        with counted(run, shards) as (trainer, live):
            result.phases.append(
                Phase("build: model, parallel, optimizer", live.peak, live.largest, usable, advice=UNBATCHED_ADVICE)
            )
            result.problems = unsharded(trainer)  # before a forward: FSDP2 leaves the root's gathered after one
            s = setting_of(train, world=world, grad_accum=trainer.batch_split.grad_accum)
            trainer.model.loss_rows = loss_rows(trainer.model_config, s, gpu.memory_gib)  # as the card decides
            checkpointing = CheckpointPhases(trainer)

            phases = (  # (name, work, whether it keeps activations for backward, what helps if over)
                ("train step: forward, backward, optimizer", lambda: steady_step(trainer, live), True, None),
                ("smoke gate: eager validation", lambda: validate_eagerly(trainer, 1), False, None),
                ("validation", lambda: trainer.validation_loss(1), False, None),
            ) + ((in_loop_decode(trainer),) if run.eval.in_loop.every else ())
            phases += checkpointing.phases
            for name, work, backward, advice in phases:
                live.reset_peak()
                work()
                phase = Phase(name, live.peak, live.largest, usable, advice=advice)
                if compiled and backward:  # what compiled blocks and loss keep for backward is less
                    phase.compiled = live.peak - compiling_saves(trainer, s)
                result.phases.append(phase)
            result.problems += optimizer_state_problems(trainer) + checkpointing.problems
        if eval_batches_on:  # the eval stage's batches, in a process of its own
            # imported here: the eval packages (HumanEval's among them), which the train side does not import
            from kiln.rehearse.eval_stage import eval_phases

            result.phases += eval_phases(run, trainer.model_config, usable, eval_batches_on)
    return result


@contextlib.contextmanager
def counted(run: RunConfig, shards: Path) -> Iterator[tuple[Trainer, LiveBytes]]:
    """The train stage's Trainer for `run` built on fake tensors, its batches read from `shards` on
    the host, with LiveBytes counting from its build on (kiln.rehearse.live.counting: dynamo off)."""
    with counting() as live:
        trainer = Trainer(run, shards, max_steps=2)
        trainer.train_on(HostBatches(trainer.batches))
        yield trainer, live


def in_loop_decode(trainer: Trainer) -> tuple[str, Callable[[], None], bool, str]:
    """eval.in_loop's decode as a phase: the train stage's own sampling (Trainer.sample: every rank,
    eager, the model as it trains) of a decode batch of the longest prompts the decode takes, a row
    of the context less the one new token (kiln.generate.decode crops prompts so): their prefill and
    a key/value cache of the whole context, the most any HumanEval prompt can cost. The decode ends
    where it reads the new ids back to the host, which a fake tensor cannot answer: by then every
    byte it holds has been allocated."""
    from kiln.eval.sizes import DECODE_BATCH  # HumanEval's package: imported only with the in-loop eval on

    context = trainer.model_config.seq_len
    longest = [[EOS_ID + 1] * (context - 1)] * DECODE_BATCH

    def decode(model, agree=None) -> list[dict]:
        with contextlib.suppress(DataDependentOutputException):  # reading the ids back
            generate(model, longest, 1, stop_ids=frozenset({EOS_ID}), batch_size=DECODE_BATCH, agree=agree)
        return []

    name = f"in-loop decode: {DECODE_BATCH} prompts of {context - 1:,} tokens"
    advice = (
        "The in-loop eval's decode at the whole context: turn it off (eval.in_loop.every: 0) or a shorter shard.seq_len"
    )
    return name, lambda: trainer.sample(decode), False, advice


def compiling_saves(trainer: Trainer, s: Setting) -> int:
    """Bytes a rank's step keeps for backward eagerly and not compiled (inductor fuses the blocks'
    elementwise intermediates and the loss's): kiln.plan.memory's eager estimate less its compiled one
    at this step, the part of the step that estimate measured on real compiled steps (docs/benchmarks.md,
    "Seed 000's memory"; the rehearsal's calibration takes the eager count and this difference to
    within 4% of the H200's compiled peak)."""
    at = replace(s, loss_rows=trainer.model.loss_rows)  # None: in chunks, as the model runs it
    eager = estimate(trainer.model_config, replace(at, compiled=False)).total
    return eager - estimate(trainer.model_config, replace(at, compiled=True)).total


def steady_step(trainer: Trainer, live: LiveBytes) -> None:
    """A train step as every step after the first runs it, its peak in `live`: the first step makes the
    optimizer's state (AdamW's moments, Muon's momentum: 8 or 4 bytes a parameter, fp32), which is
    then live through each later step's backward, where the peak falls."""
    trainer.train_step()
    live.reset_peak()
    trainer.train_step()


def current_or_rehearsed(path: Path | None, run: RunConfig, vocab: int, settings: str) -> Rehearsal:
    """The smoke stage's rehearsal of `run` (its model's padded vocabulary `vocab`) whose rehearse
    settings (kiln.config.settings.tracked, the eval batches among what they derive) are `settings`: the
    rehearse rule's at `path` when it rehearsed these (it writes only a rehearsal that passed), else the
    train side's phases rehearsed here and checked (kiln.plan.rehearsal.check raises naming what does
    not fit). Not the eval stage's batches: those are the rule's, on the login node; the smoke stage
    runs where the train stage does, which imports no eval package (tests/unit/test_train_imports.py)."""
    if path is not None and path.is_file() and (found := Rehearsal.load(path)).settings == settings:
        return found
    rehearsal = rehearse(run, vocab, planned_gpu(run.plan.gpu), eval_batches_on=())
    check(rehearsal)
    rehearsal.settings = settings
    return rehearsal
