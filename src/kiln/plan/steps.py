"""The arithmetic of the plan of the full run: build_plan, which the smoke stage (measured speed) and
`kiln plan` (assumed speed) both call, so the two plans cannot drift apart (kiln.plan.tables renders
it). How a step splits over ranks and micro-batches is the config's (kiln.config.batch).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kiln.config.batch import BatchSplit
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal at ~20 tokens per parameter


def kept_checkpoints(max_steps: int, checkpoint_every: int, keep: int, milestone_every: int = 0) -> tuple[int, int]:
    """(newest, milestones): the checkpoints a finished run leaves under kiln.train.checkpoint's pruning.
    Train saves every checkpoint_every steps and at the last; pruning keeps the newest `keep` of them
    and, besides, every one at a multiple of milestone_every (train.keep_checkpoint_every).
    Counted, not listed: a budget of hours at a forecast speed can be millions of steps."""
    multiples = max_steps // checkpoint_every
    last_apart = max_steps % checkpoint_every != 0  # the last step, saved besides the multiples
    newest = [k * checkpoint_every for k in range(max(1, multiples - (keep - last_apart) + 1), multiples + 1)]
    newest = (newest + [max_steps] * last_apart)[-keep:]
    if not milestone_every:
        return len(newest), 0
    saved_milestones = max_steps // math.lcm(checkpoint_every, milestone_every)
    saved_milestones += last_apart and max_steps % milestone_every == 0
    return len(newest), saved_milestones - sum(1 for s in newest if s % milestone_every == 0)


def full_run_plan(
    *,
    batch: BatchSplit,
    max_steps: int,
    tokens_per_s: float,
    n_params: int,
    train_tokens: int,
    checkpoint_bytes: int,
    keep_checkpoints: int,
    model_bytes: int,
    price_per_gpu_hour: float | None = None,
    milestones: int = 0,
    data_bytes: dict[str, int | None] | None = None,
) -> dict:
    """What the full run will take, from the smoke stage's steady-state tokens/s (all ranks together).

    Total tokens are max_steps x the global batch; time is that over tokens/s; cost is the
    device-hours (time x ranks) at price_per_gpu_hour. Disk counts the checkpoints kept at the same
    time (the newest keep_checkpoints and the milestones), the final weights twice (model.safetensors
    and the Hugging Face export) and, when given, what the data stages leave (data_bytes by stage,
    kiln.forecast.data_disk; None for a part the config does not bound, left out of the sum)."""
    total_tokens = max_steps * batch.tokens_per_step
    eta_s = total_tokens / tokens_per_s if tokens_per_s > 0 else float("inf")
    device_hours = eta_s / 3600 * batch.world
    return {
        "ranks": batch.world,
        "micro_batch": batch.micro_batch,
        "seq_len": batch.seq_len,
        "grad_accum": batch.grad_accum,
        "tokens_per_step": batch.tokens_per_step,
        "max_steps": max_steps,
        "total_tokens": total_tokens,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_rank": tokens_per_s / batch.world,
        "eta_s": eta_s,
        "eta_h": eta_s / 3600,
        "device_hours": device_hours,
        "price_per_gpu_hour": price_per_gpu_hour,
        "cost": device_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None,
        "n_params": n_params,
        "tokens_per_param": total_tokens / n_params,
        "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * n_params,
        "train_tokens": train_tokens,
        "epochs": total_tokens / train_tokens if train_tokens else None,
        "checkpoint_bytes": checkpoint_bytes,
        "keep_checkpoints": keep_checkpoints,
        "milestone_checkpoints": milestones,
        "model_bytes": model_bytes,
        "data_bytes": data_bytes or {},
        "disk_bytes": (keep_checkpoints + milestones) * checkpoint_bytes
        + 2 * model_bytes
        + sum(v for v in (data_bytes or {}).values() if v),
    }


def budget_seconds(budget: dict, world: int, price_per_gpu_hour: float | None) -> float:
    """The train stage's wall time a budget ({minutes|hours|dollars: N}) buys on `world` devices."""
    if "minutes" in budget:
        return 60.0 * budget["minutes"]
    if "hours" in budget:
        return 3600.0 * budget["hours"]
    if not price_per_gpu_hour:
        raise KilnError("train.budget: dollars needs smoke.price_per_gpu_hour, the price of one device-hour, above 0")
    return 3600.0 * budget["dollars"] / (price_per_gpu_hour * world)


@dataclass(frozen=True)
class StageTimes:
    """What the train stage spends besides steps, as the smoke stage measured it on this machine.

    startup_s: from the launcher's start to the first step after compilation (imports, rendezvous,
    shard checks, model build, the warm-up steps); validation_s: one validation (train.eval_batches
    batches and the greedy samples); checkpoint_s: one checkpoint written; step_s: one optimizer step."""

    step_s: float
    startup_s: float
    validation_s: float
    checkpoint_s: float


def _stage_cost(times: StageTimes, eval_every: int, checkpoint_every: int) -> tuple[float, float]:
    """(fixed seconds, seconds per step) of a train stage: start-up, the last step's validation and
    checkpoint and the final model (about one more checkpoint's writing); each step, with its share
    of a validation every eval_every steps and a checkpoint every checkpoint_every."""
    fixed = times.startup_s + times.validation_s + 2 * times.checkpoint_s
    return fixed, times.step_s + times.validation_s / eval_every + times.checkpoint_s / checkpoint_every


def steps_within(
    budget_s: float, times: StageTimes, *, eval_every: int, checkpoint_every: int, cap: int | None = None
) -> int:
    """The most steps whose stage (_stage_cost) fits in budget_s; at most `cap`; 0 when even the
    fixed costs do not fit."""
    fixed, per_step = _stage_cost(times, eval_every, checkpoint_every)
    steps = max(0, math.floor((budget_s - fixed) / per_step)) if per_step > 0 else 0
    return min(steps, cap) if cap is not None else steps


def budget_text(budget: dict) -> str:
    """A train.budget as words: {"minutes": 7} -> "7 minutes"."""
    ((unit, amount),) = budget.items()
    return f"{amount:g} {unit}"


def budget_steps(train: TrainSection, times: StageTimes, world: int, price_per_gpu_hour: float | None) -> dict:
    """The steps train.budget buys at the measured times, and what the stage is then expected to
    take: {budget, budget_s, max_steps, stage_s}. A budget too small for the warmup is an error."""
    budget = train.budget.as_dict()
    budget_s = budget_seconds(budget, world, price_per_gpu_hour)
    every = {"eval_every": train.eval_every, "checkpoint_every": train.checkpoint_every}
    steps = steps_within(budget_s, times, **every, cap=train.max_steps)
    if steps <= train.warmup_steps:
        raise KilnError(
            f"train.budget: {budget} ({budget_s:,.0f} s of the train stage) buys {steps} steps at "
            f"{times.step_s:.3f} s/step after {times.startup_s:.0f} s of start-up, not more than "
            f"train.warmup_steps={train.warmup_steps}: raise the budget or lower warmup_steps"
        )
    fixed, per_step = _stage_cost(times, **every)
    return {"budget": budget, "budget_s": budget_s, "max_steps": steps, "stage_s": fixed + steps * per_step}


def build_plan(
    train: TrainSection,
    price_per_gpu_hour: float | None,
    *,
    batch: BatchSplit,
    times: StageTimes,
    tokens_per_s: float,
    n_params: int,
    train_tokens: int,
    checkpoint_bytes: int,
    model_bytes: int,
    data_bytes: dict[str, int | None] | None = None,
) -> dict:
    """The full run's plan, the one builder of both its callers: the smoke stage (smoke/plan.json, at
    the speed and stage times it measured) and `kiln plan` (kiln.forecast, at an assumed speed).

    A train.budget is turned into steps (budget_steps, its fields added); without one the run has
    train.max_steps. The disk counts the checkpoints pruning leaves (kept_checkpoints: the newest
    and the milestones). stage_times is recorded whether or not a budget used it, so every plan has
    one shape and a plan without a budget still says what the stage spends besides steps."""
    budget = budget_steps(train, times, batch.world, price_per_gpu_hour) if train.budget else {}
    max_steps = budget.get("max_steps", train.max_steps)
    newest, milestones = kept_checkpoints(
        max_steps, train.checkpoint_every, train.keep_checkpoints, train.keep_checkpoint_every
    )
    plan = full_run_plan(
        batch=batch,
        max_steps=max_steps,
        tokens_per_s=tokens_per_s,
        n_params=n_params,
        train_tokens=train_tokens,
        checkpoint_bytes=checkpoint_bytes,
        keep_checkpoints=newest,
        model_bytes=model_bytes,
        price_per_gpu_hour=price_per_gpu_hour,
        milestones=milestones,
        data_bytes=data_bytes,
    )
    return plan | budget | {"stage_times": asdict(times)}


@dataclass(frozen=True)
class BudgetPlan:
    """What a budgeted train stage starts from (smoke/plan.json): the budget in seconds of the stage
    (budget_seconds: minutes, hours and dollars alike) and the stage times the smoke stage measured;
    kiln.train.budget re-plans the steps from these and from the run's own measurements.

    final_s: what follows the loop, model.safetensors and the Hugging Face export, two writes of the
    weights at the measured checkpoint speed (checkpoint_s for checkpoint_bytes)."""

    budget_s: float
    times: StageTimes
    final_s: float

    @classmethod
    def of(cls, plan: dict) -> BudgetPlan | None:
        """The budget part of a plan.json; None for a run planned in steps (no train.budget)."""
        if not plan.get("budget"):
            return None
        times = StageTimes(**plan["stage_times"])
        share = 2 * plan["model_bytes"] / plan["checkpoint_bytes"] if plan.get("checkpoint_bytes") else 1.0
        return cls(float(plan["budget_s"]), times, times.checkpoint_s * share)


@dataclass(frozen=True)
class TrainPlan:
    """What train follows, planned from the smoke stage's measurements (Measurements.plan): the
    steps and the precision, and for a budgeted run what the budget re-plans from."""

    max_steps: int
    precision: str
    micro_batch: int  # what the probe ran and timed (train.micro_batch, or auto's pick)
    activation_checkpointing: str  # likewise
    budget: BudgetPlan | None = None

    @classmethod
    def of(cls, data: dict, where: str = "the plan") -> TrainPlan | None:
        """The train part of a full plan (build_plan's dict, or a plan.json's); None when the probe
        did not run (a gate turned off over a failure)."""
        if "unavailable" in data:
            return None
        keys = ("max_steps", "precision", "micro_batch", "activation_checkpointing")
        missing = [key for key in keys if key not in data]
        if missing:
            raise KilnError(f"{where}: no {' or '.join(missing)}: written by an older kiln; rerun the smoke stage")
        return cls(
            int(data["max_steps"]),
            str(data["precision"]),
            int(data["micro_batch"]),
            str(data["activation_checkpointing"]),
            BudgetPlan.of(data),
        )

    def applied(self, train: TrainSection) -> TrainSection:
        """The train section `train` running this plan: the probe's precision, and its micro-batch and
        activation checkpointing where `train` says auto. A concrete value is the config's: those two
        only place the step (untracked), so a change to them reruns no smoke stage, and the plan on disk
        may hold the value before it."""
        picks = {"micro_batch": self.micro_batch, "activation_checkpointing": self.activation_checkpointing}
        return train.replace(
            precision=self.precision, **{k: v for k, v in picks.items() if getattr(train, k) == "auto"}
        )
