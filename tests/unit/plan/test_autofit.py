"""train.micro_batch / activation_checkpointing: auto (kiln.plan.autofit): the pick is a divisor of a
rank's rows (the global batch kept), fits the memory given, and is the fastest the speed model
predicts; the smoke stage picks on its device, the plan carries the pick, and train runs it."""

from __future__ import annotations

import pytest
from synthetic import smoke_sections, train_sections

from kiln import config as kiln_config
from kiln.config.files import ROOT
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.gate.checks import run_checks
from kiln.plan import autofit
from kiln.plan.memory import estimate, fits, setting_of
from kiln.plan.steps import TrainPlan
from kiln.plan.verdict import Measurements
from kiln.train.trainer import Trainer

H100_GIB = 80.0


def _ladder_arm(**train) -> tuple[TrainSection, object]:
    """Seed 002's 774M ladder arm (GPT-2 774M, seq 1024, a 0.5M-token batch on one GPU)."""
    cfg = kiln_config.resolve(
        [ROOT / "config" / "experiments" / "fineweb-edu-gpt2-124m.yaml"],
        {"model": {"flavour": "gpt2-774m"}, "train": train},
    )
    model = model_config(cfg["model"], 50_304, cfg["shard"]["seq_len"])
    return TrainSection.of(cfg["train"]), model


def test_the_774m_arm_picks_a_larger_micro_batch_without_recompute_than_its_hand_setting():
    train, model = _ladder_arm(micro_batch="auto", activation_checkpointing="auto")
    picked, why = autofit.resolve(train, model, 1, H100_GIB, cuda=True)
    rows = train.batch_tokens // model.seq_len
    assert rows % picked.micro_batch == 0 and picked.activation_checkpointing in ("none", "selective", "full")
    s = setting_of(picked, world=1, grad_accum=rows // picked.micro_batch)
    assert fits(estimate(model, s), H100_GIB)
    hand = autofit.relative_step_time(8 * model.seq_len, "selective")  # the ladder's micro-batch 8, selective
    assert autofit.relative_step_time(picked.micro_batch * model.seq_len, picked.activation_checkpointing) < hand
    assert (picked.micro_batch, picked.activation_checkpointing) != (8, "selective")
    assert why.startswith(f"auto: micro-batch {picked.micro_batch} ") and "GiB of 80.0" in why
    # everything else as configured
    assert picked.replace(micro_batch="auto", activation_checkpointing="auto") == train


def test_less_memory_picks_smaller_micro_batches_or_recompute_and_none_fitting_names_the_keys():
    train, model = _ladder_arm(micro_batch="auto", activation_checkpointing="auto")
    roomy, _ = autofit.resolve(train, model, 1, H100_GIB, cuda=True)
    tight, _ = autofit.resolve(train, model, 1, 24.0, cuda=True)
    assert (tight.micro_batch, tight.activation_checkpointing) != (roomy.micro_batch, roomy.activation_checkpointing)
    rows = train.batch_tokens // model.seq_len
    assert fits(estimate(model, setting_of(tight, world=1, grad_accum=rows // tight.micro_batch)), 24.0)
    with pytest.raises(KilnError, match=r"train.micro_batch / train.activation_checkpointing: auto: no step"):
        autofit.resolve(train, model, 1, 4.0, cuda=True)


def test_only_the_auto_setting_is_picked():
    train, model = _ladder_arm(micro_batch=16, activation_checkpointing="auto")
    picked, _ = autofit.resolve(train, model, 1, H100_GIB, cuda=True)
    assert picked.micro_batch == 16
    train, model = _ladder_arm(micro_batch="auto", activation_checkpointing="full")
    picked, _ = autofit.resolve(train, model, 1, H100_GIB, cuda=True)
    assert picked.activation_checkpointing == "full" and isinstance(picked.micro_batch, int)
    fixed, _ = _ladder_arm()
    assert autofit.resolve(fixed, model, 1, H100_GIB, cuda=True) == (fixed, None)


def test_auto_needs_a_global_batch_in_whole_rows_per_rank():
    base = ROOT / "tests" / "configs" / "tiny.yaml"
    with pytest.raises(KilnError, match=r"train.micro_batch: auto needs train.batch_tokens"):
        kiln_config.resolve([base], {"train": {"micro_batch": "auto", "batch_tokens": None}})
    with pytest.raises(KilnError, match=r"train.batch_tokens: 1000 is not a multiple of 1 ranks x shard.seq_len"):
        kiln_config.resolve([base], {"train": {"micro_batch": "auto", "batch_tokens": 1000}})


@pytest.mark.slow
def test_the_smoke_stage_picks_on_its_device_and_train_runs_the_pick(shards, tmp_path):
    """On this CPU (the host's memory) the synthetic run's 64 rows per step fit as one micro-batch with
    no recompute; the probe ran that, the plan carries it, and a Trainer given the plan runs it."""
    auto = {"micro_batch": "auto", "activation_checkpointing": "auto", "batch_tokens": 1024}
    sections = smoke_sections(train=auto)
    report = run_checks(RunConfig.of(sections), shards, tmp_path / "smoke")
    assert all(c.passed for c in report["checks"]), [(c.name, c.detail) for c in report["checks"]]
    assert report["batch"]["micro_batch"] == 64 and report["batch"]["grad_accum"] == 1
    assert report["activation_checkpointing"] == "none"
    train = TrainSection.of(sections["train"])
    plan = TrainPlan.of(Measurements.from_dict({k: v for k, v in report.items() if k != "checks"}).plan(train, None))
    assert (plan.micro_batch, plan.activation_checkpointing) == (64, "none")
    config = RunConfig.of(train_sections(**auto))
    ran = Trainer(config.replace(train=plan.applied(config.train)), shards, max_steps=1)
    assert ran.batch_split.micro_batch == 64 and ran.train.activation_checkpointing == "none"
    unplanned = Trainer(RunConfig.of(train_sections(**auto)), shards, max_steps=1)  # no smoke: the Trainer picks, alike
    assert (unplanned.batch_split.micro_batch, unplanned.train.activation_checkpointing) == (64, "none")
