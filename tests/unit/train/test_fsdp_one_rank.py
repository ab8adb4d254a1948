"""train.fsdp_one_rank: one rank under train.parallel fsdp runs FSDP2 for real, fully_shard over a
1-rank mesh in a gloo group of one made in this process, and DCP's sharded checkpoints written and read
collectively, as on several ranks. Its losses are the plain rank's (fp32, to float rounding), eager and
with compiled blocks (the aot_eager backend: dynamo and AOTAutograd around FSDP2's hooks, without
inductor's C++ build on this CPU); a run resumed from its mid-run checkpoint continues as the
uninterrupted one did. The group is left at the run's end (kiln.train.trainer.run), as a torchrun rank
leaves its own. On one GPU under NCCL: bench/gpu_check's fsdp-one-rank row."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from synthetic import train_sections, write_shards
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from kiln.config.run_config import RunConfig
from kiln.model.build import load_model
from kiln.train import parallel
from kiln.train.callbacks import default_callbacks
from kiln.train.distributed import shutdown
from kiln.train.trainer import Trainer, run

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 8
COMMON = dict(
    parallel="fsdp",  # sharded checkpoints (auto) with the mode off as well: only the module differs
    micro_batch=4,
    batch_tokens=8 * 16,  # two micro-batches a step: FSDP2's gradient sync held back for the first
    max_steps=STEPS,
    log_every=1,
    eval_every=4,
    checkpoint_every=STEPS // 2,
    keep_checkpoints=2,
)


def _config(**train) -> RunConfig:
    return RunConfig.of(train_sections(**COMMON | train))


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train(config: RunConfig, shards: Path, out: Path) -> list[float]:
    run(config, shards, out, callbacks=default_callbacks())
    assert not dist.is_initialized()  # the run left its group of one
    return _losses(out)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("fsdp-one-rank") / "shards")


@pytest.fixture(scope="module")
def plain(shards, tmp_path_factory) -> list[float]:
    """The reference: one rank, the plain module."""
    return _train(_config(), shards, tmp_path_factory.mktemp("plain") / "run")


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setattr(parallel, "compile_blocks", functools.partial(parallel.compile_blocks, backend="aot_eager"))
    torch._dynamo.reset()


def test_the_mode_shards_over_a_group_of_one(shards):
    trainer = Trainer(_config(fsdp_one_rank=True), shards)
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert isinstance(trainer.wrapped, FSDPModule) and trainer.wrapped is trainer.model
        assert all(isinstance(block, FSDPModule) for block in trainer.model.blocks)
        assert all(isinstance(p, DTensor) for p in trainer.model.parameters())
    finally:
        shutdown()


def test_the_plain_rank_stays_plain_without_a_group(shards):
    trainer = Trainer(_config(), shards)
    assert not dist.is_initialized() and not isinstance(trainer.wrapped, FSDPModule)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_fsdp_on_one_rank_trains_and_resumes_as_the_plain_rank(shards, plain, tmp_path, request, compiled):
    if compiled:
        request.getfixturevalue("aot_eager")
    config = _config(fsdp_one_rank=True, compile=compiled)
    whole = tmp_path / "whole"
    losses = _train(config, shards, whole)
    assert losses == pytest.approx(plain, abs=1e-5, rel=0)
    mid = whole / "checkpoints" / f"step-{STEPS // 2:07d}"
    assert sorted(p.name for p in (mid / "shards").iterdir()) == [".metadata", "__0_0.distcp"]  # DCP's, rank 0's

    # The run stops after its mid-run checkpoint; a rerun finds it and continues.
    resumed = tmp_path / "resumed"
    shutil.copytree(mid, resumed / "checkpoints" / mid.name)
    (resumed / "checkpoints" / "LATEST").write_text(mid.name + "\n")
    if compiled:
        torch._dynamo.reset()  # a fresh process would compile anew
    assert _train(config, shards, resumed) == pytest.approx(losses[STEPS // 2 :], abs=1e-6, rel=0)
    ours, theirs = load_model(resumed).state_dict(), load_model(whole).state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-6, msg=key)
