"""kiln.rehearse.checkpoint: the sharded checkpoint's plan made for every rank with DCP's own planner
and validated as dcp.save's coordinator validates it, on the tiny config's Trainer sharded by FSDP2 (4
ranks) or HSDP (2 nodes x 4) on fake tensors under the fake process group: its real DTensors, their
mesh and placements; a rank whose chunks go missing leaves a gap the check names."""

import contextlib
import dataclasses
from pathlib import Path

import pytest
from tiny import ROOT

from kiln import config as kiln_config
from kiln import forecast
from kiln.config.run_config import RunConfig
from kiln.rehearse.checkpoint import coverage_problems, rank_plans
from kiln.rehearse.run import counted, fake_world, steady_step, synthetic_shards
from kiln.train import parallel

TINY = ROOT / "tests" / "configs" / "tiny.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the fake group's timeout note, DCP's gap warnings


@contextlib.contextmanager
def sharded_state(tmp_path: Path, nnodes: int, per_node: int):
    """The tiny config's parallel.sharded_state after two steps under FSDP2 on nnodes x per_node ranks
    (rank 0 of the fake group): model and AdamW state, DTensors on the run's mesh."""
    train = {"parallel": "fsdp", "optimizer": "adamw", "nnodes": nnodes, "nproc_per_node": per_node}
    train |= {"micro_batch": 2, "batch_tokens": 2 * 64 * nnodes * per_node, "device": "cpu", "compile": False}
    cfg = kiln_config.resolve([TINY], {"train": train})
    run = RunConfig.of(cfg)
    with fake_world(nnodes * per_node, per_node):
        shards = synthetic_shards(tmp_path, forecast.model_of(cfg, run).vocab_size, 64, 4 * nnodes * per_node, 8, 0)
        with counted(run, shards) as (trainer, live):
            steady_step(trainer, live)
            yield parallel.sharded_state(trainer.model, trainer.optimizer)


def without(plan, fqn: str):
    """`plan` less its write of `fqn`: the rank's chunk of that tensor missing."""
    return dataclasses.replace(plan, items=[item for item in plan.items if item.index.fqn != fqn])


def test_every_ranks_chunks_tile_each_tensor_and_a_missing_ranks_chunk_is_named(tmp_path):
    with sharded_state(tmp_path, 1, 4) as state:
        plans = rank_plans(state, 4)
        # each rank writes its own quarter of the (512, 64) embedding, where its mesh coordinate puts it
        assert [p.items[0].index.offset[0] for p in plans] == [0, 128, 256, 384]
        assert coverage_problems(plans)[0] == []
        problems, metadata = coverage_problems(plans[:3] + [without(plans[3], "model.wte.weight")])
        assert metadata is None and len(problems) == 1
        assert "key:model.wte.weight invalid fill tensor-volume: 32768 chunks-volume: 24576" in problems[0]
        # a rank saving nothing (the state of a 4-rank mesh written by 3): every sharded tensor's gap
        (problem,) = coverage_problems(plans[:3])[0]
        assert "key:model.wte.weight invalid fill" in problem and "key:model.wpe.weight invalid fill" in problem


def test_hsdp_replicas_write_each_shard_once_and_a_shard_both_nodes_miss_is_a_gap(tmp_path):
    with sharded_state(tmp_path, 2, 4) as state:
        plans = rank_plans(state, 8)
        assert coverage_problems(plans)[0] == []
        # rank 7 (node 1) holds what rank 3 (node 0) holds: DCP writes it once, from either
        assert coverage_problems(plans[:7] + [without(plans[7], "model.wte.weight")])[0] == []
        both = (
            plans[:3] + [without(plans[3], "model.wte.weight")] + plans[4:7] + [without(plans[7], "model.wte.weight")]
        )
        assert "key:model.wte.weight invalid fill" in coverage_problems(both)[0][0]
