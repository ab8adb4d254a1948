"""The GPU check's one-rank FSDP2 check: seed 000's setting (train.parallel fsdp, compiled blocks,
sharded checkpoints) on the one GPU every machine has, through train.fsdp_one_rank: the model
fully_shard'ed over a 1-rank mesh in an NCCL group of one, DCP writing and reading the checkpoint
collectively. No CPU test reaches NCCL, inductor's kernels between FSDP2's hooks, or DCP over an NCCL
group (tests/unit/train/test_fsdp_one_rank.py runs the same on gloo with aot_eager); the two-rank
check runs FSDP2 only where there are 2 GPUs, and eager.

The two-rank check's 4 x 512 llama at seq 256 on learnable words, bf16, through kiln.train.trainer.run
as the train stage runs it, three times: the plain rank, eager (the reference, no compile to pay);
the mode, compiled, checkpointing half-way; the mode again, resumed from that checkpoint (the second
compile hits inductor's cache). Judged in two rows, each yielded as its part ends: the mode's
losses within 2% of the plain rank's (bf16 parameters gathered by FSDP2 against autocast's casts,
compiled against eager); the resumed run trains only the second half, its losses within 0.5% of the
uninterrupted run's there. With
--cpu-dry-run: gloo, tiny shapes, compile_blocks with the aot_eager backend.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from pathlib import Path
from typing import Iterator
from unittest import mock

import torch

from gpu_check.ranks import LOSS_MATCH, SHAPES
from gpu_check.shared import Ctx, word_shards
from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.train import parallel
from kiln.train.callbacks import default_callbacks
from kiln.train.trainer import run

RESUME_MATCH = 0.005  # the resumed run's losses against the uninterrupted run's, relative
STEPS = {False: 12, True: 4}  # {dry: optimizer steps}; the checkpoint is at half


def sections(dry: bool, one_rank: bool) -> dict:
    """Validated train sections for one rank under fsdp, bf16; with the mode on, compiled."""
    model, seq, micro, _, _ = SHAPES[dry]
    steps = STEPS[dry]
    train = {
        "parallel": "fsdp",  # sharded checkpoints (auto), the mode on or off
        "fsdp_one_rank": one_rank,
        "compile": one_rank,
        "micro_batch": micro,
        "batch_tokens": micro * seq,
        "max_steps": steps,
        "warmup_steps": 2,
        "lr": 3e-3,
        "precision": "bf16",
        "log_every": 1,
        "eval_every": steps,
        "checkpoint_every": steps // 2,
        "device": "cpu" if dry else "cuda",
    }
    return kiln_config.stage_sections("train", seed=1337, shard={"seq_len": seq}, model=model, train=train)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _worst(ours: list[float], theirs: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(ours, theirs, strict=True))


def check_fsdp_one_rank(ctx: Ctx) -> Iterator[tuple[str, str]]:
    """Rows: FSDP2 on one rank against the plain rank, then its DCP resume (checks.CHECKS), each
    yielded as it is known."""
    _, seq, _, _, _ = SHAPES[ctx.dry]
    steps, half = STEPS[ctx.dry], STEPS[ctx.dry] // 2
    shards = word_shards(ctx.folder("shards"), seq, rows=64 if ctx.dry else 256)
    plain, whole, resumed = ctx.work / "plain", ctx.work / "fsdp", ctx.work / "fsdp-resumed"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU, gloo"
    with contextlib.ExitStack() as stack:
        if ctx.dry:  # inductor's C++ build takes ~20 s on 2 cores; dynamo and AOT autograd still trace
            aot_eager = functools.partial(parallel.compile_blocks, backend="aot_eager")
            stack.enter_context(mock.patch.object(parallel, "compile_blocks", aot_eager))
        ctx.note("the plain rank, eager")
        run(RunConfig.of(sections(ctx.dry, one_rank=False)), shards, plain, callbacks=default_callbacks())
        ctx.note("FSDP2 on one rank, compiled, a sharded checkpoint half-way")
        config = RunConfig.of(sections(ctx.dry, one_rank=True))
        run(config, shards, whole, callbacks=default_callbacks())
        ours, theirs = _losses(whole), _losses(plain)
        vs_plain = _worst(ours, theirs)
        yield ctx.verdict(
            vs_plain <= LOSS_MATCH,
            f"{steps} steps compiled on {device}, loss {ours[0]:.3f} -> {ours[-1]:.3f}, within {vs_plain:.2%} of "
            "the plain rank's",
        )
        mid = whole / "checkpoints" / f"step-{half:07d}"
        shutil.copytree(mid, resumed / "checkpoints" / mid.name)  # the run stopped there; its rerun finds it
        (resumed / "checkpoints" / "LATEST").write_text(mid.name + "\n")
        ctx.note("FSDP2 on one rank, resumed from its DCP shards")
        run(config, shards, resumed, callbacks=default_callbacks())
    again = _losses(resumed)
    sharded = (mid / "shards" / ".metadata").exists()
    vs_whole = _worst(again, ours[half:]) if len(again) == steps - half else float("inf")
    yield ctx.verdict(
        sharded and vs_whole <= RESUME_MATCH,
        f"step {half}'s {'DCP shards' if sharded else 'checkpoint (NOT sharded)'} resumed: "
        f"{len(again)} steps within {vs_whole:.3%} of the run's own",
    )
