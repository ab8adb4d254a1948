"""The rehearsal's count of a train step's peak against the same step with real tensors on this CPU
(issue 59, item 2: within 10%): bench/rehearse_calibration.py's rows, tests/unit/rehearse/test_calibration.py.

A config runs as set on the CPU (train.device cpu, compile off, one micro-batch a rank a step), none
of a card's choices. Above one rank it runs as rank 0 of torch's fake process group, sharded by
FSDP2, with AdamW: the group's collectives return at once, with real tensors too, so the rank's memory
is real (Muon's sharded all-to-all needs the other ranks' rows, which a fake group has not got).
Rehearsed: the Trainer built and stepped on fake tensors, its second step's peak as LiveBytes counts
it. Measured: a real Trainer's second step (kiln.train.cpu_memory.steady_step_bytes).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kiln import config as kiln_config
from kiln import forecast
from kiln.config.run_config import RunConfig
from kiln.rehearse.run import counted, fake_world, steady_step, synthetic_shards
from kiln.train.cpu_memory import steady_step_bytes
from kiln.train.trainer import Trainer


def cpu_run(configfiles: list[str], micro: int, precision: str, ranks: int) -> tuple[RunConfig, int]:
    """The config of `configfiles` at micro-batch `micro`, `precision` and `ranks` (FSDP2 and AdamW
    above one), eager on the CPU, and its model's vocabulary."""
    seq_len = kiln_config.resolve(configfiles)["shard"]["seq_len"]
    train = {
        "micro_batch": micro,
        "batch_tokens": ranks * micro * seq_len,
        "precision": precision,
        "compile": False,
        "device": "cpu",
        "max_steps": 10,
        "warmup_steps": 1,
        "nproc_per_node": ranks,
    }
    if ranks > 1:
        train |= {"parallel": "fsdp", "optimizer": "adamw"}
    cfg = kiln_config.resolve(configfiles, {"train": train})
    run = RunConfig.of(cfg)
    return run, forecast.model_of(cfg, run).vocab_size


def step_peak(run: RunConfig, shards: Path) -> int:
    """Live bytes at the peak of the run's second train step on this rank, as the rehearsal counts
    them (LiveBytes on fake tensors), its batches read from `shards`."""
    with counted(run, shards) as (trainer, live):
        steady_step(trainer, live)
    return live.peak


def rehearsed_and_measured(run: RunConfig, vocab: int) -> tuple[int, int]:
    """The peak of `run`'s second train step on rank 0 (bytes), rehearsed and measured, on one folder
    of random ids (kiln.rehearse.run.synthetic_shards)."""
    ranks, micro = run.train.ranks, run.train.micro_batch
    with tempfile.TemporaryDirectory(prefix="kiln-calibration-") as tmp, fake_world(ranks, ranks):
        shards = synthetic_shards(Path(tmp), vocab, run.shard.seq_len, 4 * ranks * micro, ranks * micro, run.seed)
        return step_peak(run, shards), steady_step_bytes(Trainer(run, shards, max_steps=3))
