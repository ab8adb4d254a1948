"""One plan builder (kiln.plan.steps.build_plan) for its two callers: `kiln plan` (kiln.forecast.predict,
at an assumed speed) and the smoke stage (Measurements.plan, at the measured one) give the same fields
for the same speed, stage times and sizes, with or without a budget, milestones counted alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln import config as kiln_config
from kiln.config.batch import BatchSplit
from kiln.config.smoke_section import SmokeSection
from kiln.config.train_sections import TrainSection
from kiln.forecast import predict
from kiln.plan.steps import StageTimes, kept_checkpoints
from kiln.plan.verdict import Measurements, Probe

ROOT = Path(__file__).resolve().parents[3]
ONLY_FORECAST = {"memory", "predicted_from", "eval"}  # what it assumed, the memory estimate, the eval priced
ONLY_SMOKE = {"precision", "precision_tokens_per_s", "precision_why", "activation_checkpointing"}  # what the probe ran


def config(train: dict) -> dict:
    raw = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["train"] |= train
    raw["smoke"] |= {"price_per_gpu_hour": 2.5}
    return kiln_config.validate(raw)


def measured_as(plan: dict) -> Measurements:
    """The smoke stage's measurements that equal what `kiln plan` assumed for `plan`."""
    return Measurements(
        probe=Probe(
            tokens_per_s=plan["tokens_per_s"],
            step_time_s=plan["stage_times"]["step_s"],
            data_wait_fraction=0.0,
            peak_memory_mb=1.0,
            mfu=0.4,
            tflops=1.0,
            measured_steps=10,
        ),
        losses=(),
        grad_norms=(),
        val_loss_init=6.0,
        val_loss_after=5.0,
        n_params=plan["n_params"],
        checkpoint_bytes=plan["checkpoint_bytes"],
        model_bytes=plan["model_bytes"],
        train_tokens=plan["train_tokens"],
        batch=BatchSplit(plan["ranks"], plan["micro_batch"], plan["seq_len"], plan["grad_accum"]),
        device="cpu",
        world=plan["ranks"],
        times=StageTimes(**plan["stage_times"]),
        precision="fp32",
    )


@pytest.mark.parametrize(
    "train",
    [
        {"max_steps": 1000, "keep_checkpoint_every": 200},
        {"max_steps": None, "budget": {"hours": 2}, "keep_checkpoint_every": 200},
    ],
    ids=["max_steps", "budget"],
)
def test_kiln_plan_and_the_smoke_stage_build_the_same_plan(train):
    cfg = config(train)
    forecast = predict(cfg)
    smoke = measured_as(forecast).plan(TrainSection.of(cfg["train"]), SmokeSection.of(cfg["smoke"]).price_per_gpu_hour)
    assert set(forecast) - ONLY_FORECAST == set(smoke) - ONLY_SMOKE
    assert forecast["milestone_checkpoints"] > 0 and "stage_times" in forecast  # both recorded, budget or not
    data = forecast["data_bytes"]  # the data stages: `kiln plan` counts them, the smoke stage cannot see them
    for key in set(forecast) - ONLY_FORECAST - {"data_bytes", "disk_bytes"}:
        assert smoke[key] == forecast[key], key
    assert smoke["data_bytes"] == {} and smoke["disk_bytes"] == forecast["disk_bytes"] - sum(
        v for v in data.values() if v
    )
    assert ("budget" in smoke) == bool(train.get("budget"))


@settings(max_examples=300, deadline=None)
@given(
    max_steps=st.integers(1, 400),
    every=st.integers(1, 50),
    keep=st.integers(1, 6),
    milestone_factor=st.integers(0, 5),
)
def test_kept_checkpoints_counts_what_pruning_keeps(max_steps, every, keep, milestone_factor):
    """The count kiln plan and the smoke plan use, against the list of saves it stands for (every
    checkpoint_every steps and the last; the newest `keep`, and milestones besides): counted, so a
    budget of millions of steps costs nothing."""
    milestone_every = every * milestone_factor
    saves = sorted(set(range(every, max_steps + 1, every)) | {max_steps})
    newest = set(saves[-keep:])
    milestones = sum(1 for s in saves if milestone_every and s % milestone_every == 0 and s not in newest)
    assert kept_checkpoints(max_steps, every, keep, milestone_every) == (len(newest), milestones)
