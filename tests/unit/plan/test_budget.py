"""Budgets into steps (kiln.plan.steps): what a budget buys at measured stage times, the errors of a
budget that cannot be honoured, and the plan file train reads back."""

from __future__ import annotations

import pytest
from synthetic import train_sections

from kiln import config as kiln_config
from kiln.config import ConfigError
from kiln.config.train_sections import Budget, TrainSection
from kiln.errors import KilnError
from kiln.plan.steps import StageTimes, TrainPlan, budget_seconds, budget_steps, steps_within

TIMES = StageTimes(step_s=0.5, startup_s=20.0, validation_s=3.0, checkpoint_s=1.0)
TRAIN = TrainSection.of(train_sections()["train"]).replace(
    budget=Budget.of({"minutes": 7}),
    max_steps=None,
    warmup_steps=50,
    eval_every=100,
    checkpoint_every=200,
)


def test_budget_seconds_for_each_unit():
    assert budget_seconds({"minutes": 7}, world=8, price_per_gpu_hour=None) == 420
    assert budget_seconds({"hours": 0.1}, world=1, price_per_gpu_hour=None) == pytest.approx(360)
    # $150 on 4 devices at $3.09 each per hour: 12.14 h of wall time
    assert budget_seconds({"dollars": 150}, world=4, price_per_gpu_hour=3.09) == pytest.approx(150 / 3.09 / 4 * 3600)
    with pytest.raises(KilnError, match="smoke.price_per_gpu_hour"):
        budget_seconds({"dollars": 150}, world=1, price_per_gpu_hour=None)


def test_steps_fill_the_budget_and_one_more_would_not_fit():
    plan = budget_steps(TRAIN, TIMES, world=1, price_per_gpu_hour=None)
    steps = plan["max_steps"]
    assert plan["budget_s"] == 420 and plan["stage_s"] <= 420
    per_step = 0.5 + 3.0 / 100 + 1.0 / 200
    assert 20 + 3 + 2 + steps * per_step <= 420 < 20 + 3 + 2 + (steps + 1) * per_step
    assert steps == 738


def test_max_steps_caps_a_budget_and_no_budget_buys_nothing_past_fixed_costs():
    assert budget_steps(TRAIN.replace(max_steps=300), TIMES, world=1, price_per_gpu_hour=None)["max_steps"] == 300
    assert steps_within(10.0, TIMES, eval_every=100, checkpoint_every=200) == 0


def test_a_budget_too_small_for_the_warmup_names_both_keys():
    with pytest.raises(KilnError, match=r"train.budget: \{'minutes': 0.5\}.*buys \d+ steps.*train.warmup_steps=50"):
        budget_steps(TRAIN.replace(budget=Budget.of({"minutes": 0.5})), TIMES, world=1, price_per_gpu_hour=None)


def test_train_plan_reads_steps_precision_micro_batch_and_checkpointing_and_refuses_an_old_plan():
    probe = {"max_steps": 738, "precision": "fp32", "micro_batch": 4, "activation_checkpointing": "selective"}
    plan = TrainPlan.of(probe | {"eta_s": 1.0})
    assert plan == TrainPlan(738, "fp32", 4, "selective")
    # what train runs: auto's picks made concrete, every other setting as configured
    auto = TRAIN.replace(precision="auto", micro_batch="auto", activation_checkpointing="auto", lr=0.1)
    assert plan.applied(auto) == auto.replace(precision="fp32", micro_batch=4, activation_checkpointing="selective")
    # a concrete micro-batch or checkpointing is the config's, not a plan made before it changed
    concrete = TRAIN.replace(precision="auto", micro_batch=8, activation_checkpointing="none")
    assert plan.applied(concrete) == concrete.replace(precision="fp32")
    assert TrainPlan.of({"unavailable": "the probe did not run"}) is None
    with pytest.raises(KilnError, match=r"report.json: no micro_batch or activation_checkpointing.*rerun the smoke"):
        TrainPlan.of({"max_steps": 738, "precision": "fp32"}, "report.json")


def minimal(train: dict, smoke: dict | None = None) -> dict:
    return {
        "run_name": "b",
        "download": {"sources": [{"name": "s", "kind": "stdlib"}]},
        "train": train,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64},
        "smoke": smoke or {},
    }


@pytest.mark.parametrize(
    "train, smoke, message",
    [
        ({}, None, r"train: set max_steps \(optimizer steps\) or budget"),
        ({"budget": {"dollars": 5}}, None, "train.budget: dollars needs smoke.price_per_gpu_hour"),
        ({"budget": {"minutes": 5, "hours": 1}}, None, "train.budget"),
        ({"budget": {"weeks": 1}}, None, "train.budget"),
        ({"budget": {"minutes": 0}}, None, "train.budget.minutes"),
    ],
)
def test_bad_budgets_are_config_errors_naming_the_key(train, smoke, message):
    with pytest.raises(ConfigError, match=message):
        kiln_config.validate(minimal(train, smoke))


def test_a_budget_alone_or_with_a_price_validates():
    assert kiln_config.validate(minimal({"budget": {"minutes": 7}}))["train"]["max_steps"] is None
    cfg = kiln_config.validate(minimal({"budget": {"dollars": 5}}, {"price_per_gpu_hour": 2.5}))
    assert cfg["train"]["budget"] == {"dollars": 5}
