"""train.precision auto: one decision, made by the smoke stage without paying for the slow candidate,
and obeyed by the whole step train then runs (issue 60).

A machine's bf16 is made slow or fast here by patching what the pick reads: the CPU's flags
(kiln.train.device.cpu_bf16_emulated) and the candidates' step time (Trainer.train_step, slowed).
"""

from __future__ import annotations

import time

import pytest
import torch
from synthetic import smoke_sections, train_sections

import kiln.gate.checks as checks
from kiln.config.run_config import RunConfig
from kiln.gate.checks import run_checks
from kiln.plan.steps import TrainPlan
from kiln.plan.tables import render_plan
from kiln.plan.verdict import Measurements
from kiln.train import device
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)
MUON = {"optimizer": "muon", "muon_lr": 0.02}


def _auto() -> RunConfig:
    return RunConfig.of(smoke_sections(train={"precision": "auto", **MUON}))


def _pick(config: RunConfig, shards):
    return checks.pick_precision(config, config.train.replace(schedule="constant"), shards, config.smoke)


@pytest.fixture
def steps_run(monkeypatch):
    """The steps each candidate ran, by precision; a step slowed by `slow[precision]` seconds."""
    ran = {"bf16": 0, "fp32": 0}
    slow = {"bf16": 0.0, "fp32": 0.0}
    real = Trainer.train_step

    def step(self):
        precision = "bf16" if self.bf16 else "fp32"
        ran[precision] += 1
        time.sleep(slow[precision])
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    return ran, slow


def test_a_cpu_without_bf16_instructions_runs_fp32_and_times_nothing(shards, monkeypatch, steps_run):
    ran, _ = steps_run
    monkeypatch.setattr(device, "cpu_bf16_emulated", lambda: True)
    precision, timed, why = _pick(_auto(), shards)
    assert (precision, timed, ran) == ("fp32", {}, {"bf16": 0, "fp32": 0})
    assert "neither AVX-512 BF16 nor AMX" in why


def test_a_slow_bf16_is_dropped_after_its_first_timed_step(shards, monkeypatch, steps_run):
    ran, slow = steps_run
    monkeypatch.setattr(device, "cpu_bf16_emulated", lambda: False)
    slow["bf16"] = 0.25  # far over CLEARLY_SLOWER x a tiny fp32 step
    config = _auto()
    precision, timed, why = _pick(config, shards)
    smoke = config.smoke
    assert precision == "fp32" and "bf16 dropped" in why and set(timed) == {"fp32", "bf16"}
    assert ran == {"fp32": smoke.warmup_steps + smoke.precision_steps, "bf16": smoke.warmup_steps + 1}


def test_a_fast_bf16_is_timed_whole_and_picked(shards, monkeypatch, steps_run):
    ran, slow = steps_run
    monkeypatch.setattr(device, "cpu_bf16_emulated", lambda: False)
    slow["fp32"] = 0.2  # bf16 wins here even where it is emulated: the tiny model's steps take milliseconds
    config = _auto()
    precision, timed, why = _pick(config, shards)
    steps = config.smoke.warmup_steps + config.smoke.precision_steps
    assert (precision, why, ran) == ("bf16", "the faster here", {"fp32": steps, "bf16": steps})
    assert timed["bf16"] > timed["fp32"]


def test_the_smoke_stages_pick_is_in_its_plan_and_train_runs_it(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(device, "cpu_bf16_emulated", lambda: True)
    report = run_checks(_auto(), shards, tmp_path)
    measured = Measurements.from_dict({k: v for k, v in report.items() if k != "checks"})
    plan = TrainPlan.of(measured.plan(_auto().train, None))
    assert plan.applied(_auto().train).precision == "fp32"
    assert "fp32 (auto: this CPU has neither AVX-512 BF16 nor AMX" in render_plan(measured.plan(_auto().train, None))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_part_of_the_step_follows_the_precision(shards, precision):
    # the step's autocast, Muon's Newton-Schulz and the in-loop decode (Trainer.sample): one answer
    trainer = Trainer(RunConfig.of(train_sections(precision=precision, **MUON)), shards)
    bf16 = precision == "bf16"
    assert trainer.bf16 is bf16
    with trainer.autocast():
        assert torch.is_autocast_enabled("cpu") is bf16
    muon = trainer.optimizer.parts[0]
    assert muon.dtype == (torch.bfloat16 if bf16 else torch.float32)
    decoded_under = []
    trainer.sample(lambda model, agree: decoded_under.append(torch.is_autocast_enabled("cpu")) or [])
    assert decoded_under == [bf16]
