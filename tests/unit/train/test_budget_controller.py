"""The budget controller's arithmetic (kiln.train.budget) on synthetic timings: a simulated train stage
whose step time is a function of the simulated clock (a CPU hog is the step time doubling at some
second), driven through the controller exactly as the trainer's steps drive it. No real time is
measured, so nothing here depends on this machine's speed; what is asserted is where the simulated
stage ends against its budget, and that a replay of the recorded decisions gives the same schedule."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest

from kiln import config as kiln_config
from kiln.config.batch import BatchSplit
from kiln.config.train_sections import TrainSection
from kiln.plan.steps import BudgetPlan, StageTimes, TrainPlan, build_plan
from kiln.train.budget import AIM, BudgetController
from kiln.train.schedule import Replanned, lr_at

TOKENS = 4096
SCHEDULE = dict(lr=8e-3, min_lr=2e-4, warmup_steps=50, kind="wsd", decay_fraction=0.3, cooldown="1-sqrt")


@dataclass
class Stage:
    """One simulated train stage: start-up, steps, a validation every 100 and a checkpoint every 200
    steps (and both at the last), the export and the exit. Costs scale with the step time's slowdown;
    the first validation also compiles its graph (compile_s, once)."""

    budget_s: float = 420.0
    startup_s: float = 12.0
    step_s: float = 0.12  # the run's own speed
    probe_step_s: float = 0.14  # what the smoke probe measured (the run: 29.4k vs 34.2k tok/s)
    validation_s: float = 0.6
    checkpoint_s: float = 0.3
    final_s: float = 0.3
    compile_s: float = 0.0  # the first validation's extra seconds: its graph compiled (train.compile)
    exit_s: float = 2.0  # what bench/budget.py measured on the 2-core VM
    log_every: int = 10
    cap: int | None = None
    slowdown: callable = lambda t: 1.0  # noqa: E731  the step time's factor at simulated second t
    noise: float = 0.0  # each step's time x (1 + U(-noise, noise))
    stalls: dict = field(default_factory=dict)  # {second: seconds}: the process off the CPU (KILN_FAULT stall)
    decisions: list[dict] = field(default_factory=list)

    def plan(self) -> BudgetPlan:
        times = StageTimes(self.probe_step_s, self.startup_s, self.validation_s, self.checkpoint_s)
        return BudgetPlan(self.budget_s, times, self.final_s)

    def planned_steps(self) -> int:
        fixed = self.startup_s + self.validation_s + 2 * self.checkpoint_s
        per = self.probe_step_s + self.validation_s / 100 + self.checkpoint_s / 200
        return int((self.budget_s - fixed) / per)

    def run(
        self, budget: BudgetController | None = None, stop_at: int | None = None, start_step: int = 0, t0: float = 0.0
    ):
        """Run (or, with budget, continue) the stage; returns (the controller, end second, steps)."""
        rng = random.Random(0)
        self.t = t0 + self.startup_s
        if budget is None:
            schedule = Replanned(max_steps=self.planned_steps(), **SCHEDULE)
            budget = BudgetController(
                self.plan(),
                schedule,
                cap=self.cap,
                tokens_per_step=TOKENS,
                every=(100, 200),
                start=t0,
                clock=lambda: self.t,
            )
        step, pure = start_step, 0.0
        while step < budget.max_steps:
            if stop_at is not None and step == stop_at:
                return budget, self.t, step
            final = budget.max_steps
            dt = self.step_s * self.slowdown(self.t) * (1 + rng.uniform(-self.noise, self.noise))
            dt += sum(self.stalls.pop(at) for at in [at for at in self.stalls if at <= self.t])
            self.t += dt
            pure += dt
            step += 1
            log = step % self.log_every == 0 or step == final
            steps = (step - 1) % self.log_every + 1
            decision = budget.after_step(step, TOKENS * steps / pure if log else None, log=log, now=self.t)
            if decision is not None:
                self.decisions.append(decision)
            if log:
                pure = 0.0
                if step % 100 == 0 or step == final:
                    self.t += self.validation_s * self.slowdown(self.t) + self.compile_s
                    self.compile_s = 0.0
            if step % 200 == 0 or step == final:
                self.t += self.checkpoint_s * self.slowdown(self.t)
        # the exit, one thread's work, slows at most ~2x (the hogged quick bench: 2.2 -> 4.6 s)
        self.t += self.final_s * self.slowdown(self.t) + self.exit_s * min(2.0, self.slowdown(self.t))
        return budget, self.t, step


def hog_at(second: float, factor: float = 2.0):
    return lambda t: factor if t >= second else 1.0


def test_a_run_faster_than_its_probe_spends_its_budget_not_88_percent():
    stage = Stage()
    budget, end, steps = stage.run()
    assert 0.98 * stage.budget_s <= end <= stage.budget_s
    assert steps > stage.planned_steps() * 1.1  # the probe's plan would have stopped at ~0.88
    assert budget.summary()["planned_steps"] == stage.planned_steps() and budget.summary()["final_steps"] == steps


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])  # the hogged quick bench slowed the steps 6.7x
def test_a_hog_halfway_means_fewer_steps_and_still_ends_inside_the_budget(factor):
    steady = Stage(probe_step_s=0.12)
    _, _, steady_steps = steady.run()
    hogged = Stage(probe_step_s=0.12, slowdown=hog_at(210.0, factor))
    _, end, steps = hogged.run()
    assert 0.98 * hogged.budget_s <= end <= hogged.budget_s
    assert steps < (0.5 + 0.5 / factor) * steady_steps + 50
    assert any(d["why"] == "slower than planned" for d in hogged.decisions)


def test_a_machine_that_doubles_its_speed_halfway_trains_more_steps():
    steady = Stage(probe_step_s=0.12)
    _, _, steady_steps = steady.run()
    faster = Stage(probe_step_s=0.12, slowdown=lambda t: 0.5 if t >= 210.0 else 1.0)
    _, end, steps = faster.run()
    assert 0.98 * faster.budget_s <= end <= faster.budget_s
    assert steps > 1.2 * steady_steps


@pytest.mark.parametrize("second", [380.0, 400.0, 405.0, 408.0, 410.0, 411.0, 412.0, 413.0, 414.0])
def test_a_hog_in_the_cooldown_or_the_last_seconds_still_ends_inside_the_budget(second):
    stage = Stage(slowdown=hog_at(second))
    _, end, _ = stage.run()
    assert end <= stage.budget_s
    assert end >= 0.98 * stage.budget_s or second > 400  # a hog in the last seconds may leave a little unspent


def test_noisy_steps_still_end_between_98_and_100_percent():
    stage = Stage(noise=0.3)
    _, end, _ = stage.run()
    assert 0.98 * stage.budget_s <= end <= stage.budget_s


COMPILED = {  # the first validation compiling its graph (train.compile), 6 s once
    "issue 60's run: 1.5 s steps, a 1.5 s validation": dict(step_s=1.5, probe_step_s=1.5, validation_s=1.5),
    "the default's 0.12 s steps": dict(),
}


@pytest.mark.parametrize("case", COMPILED)
def test_the_first_validations_compile_is_not_kept_in_hand_for_the_end(case):
    """The largest overhead around a window was the end's validation and checkpoint; the first
    validation's compile made it 6 s too large for the rest of the run, kept in hand and predicted
    both: issue 60's run predicted 407 s at its last decision and ended at 401 of 420 (95.5%; here
    407.6 and 401.9, and 96.5% at the default's speed). The compile left out, a step of 1.5 s (0.4% of
    the budget) still ends at 98-100%, where the last decision predicted."""
    stage = Stage(compile_s=6.0, **COMPILED[case])
    _, end, _ = stage.run()
    assert 0.98 * stage.budget_s <= end <= stage.budget_s
    assert end == pytest.approx(stage.decisions[-1]["predicted_s"], abs=0.5)


@pytest.mark.parametrize("second", [390.0, 400.0, 403.0, 406.0, 410.0, 415.0])
def test_a_halving_in_the_last_slow_steps_ends_at_most_a_step_past_the_budget(second):
    """With 1.5 s steps what follows the last decision (a step and the end) is more than the budget's
    last 1 - AIM and sets the aim alone. The last decision cannot drop the step after it, so a halving
    that begins just after the decision before it slows two steps and the end against the one step
    kept in hand: up to a step past (421 s at 403 and 406 s here; module docstring)."""
    stage = Stage(step_s=1.5, probe_step_s=1.5, validation_s=1.5, slowdown=hog_at(second))
    _, end, _ = stage.run()
    assert end <= stage.budget_s + stage.step_s


def bursty_hog(second: float, seed: int, block_s: float = 3.0):
    """Spinning processes on every core from `second`: the 2-core VM's steps went from ~0.26 s to
    0.95-1.75 s, changing every few seconds (bench/budget.py's hogged arm), so that successive log
    windows differed by ~90% of their mean."""
    rng, factors = random.Random(seed), {}

    def slowdown(t: float) -> float:
        if t < second:
            return 1.0
        block = int((t - second) // block_s)
        if block not in factors:
            factors[block] = rng.uniform(3.5, 7.0)
        return factors[block]

    return slowdown


def test_a_bursty_hog_is_met_by_a_decision_every_step_in_the_final_windows():
    """A log window's noise under the hog is several seconds here: a margin for it leaves budget
    unspent (98.0% on average over these seeds without the final windows, 98.3% with them; the real
    hog's windows were noisier still: bench/budget.py). Deciding every step leaves one step's."""
    ends = []
    for seed in range(6):
        stage = Stage(step_s=0.26, probe_step_s=0.26, slowdown=bursty_hog(210.0, seed))
        budget, end, steps = stage.run()
        assert end <= stage.budget_s
        ends.append(end / stage.budget_s)
        fine = [d for d in stage.decisions if d["fine"]]
        # from the first, a decision at every step to the last but one, without a noise margin
        assert [d["step"] for d in fine] == list(range(fine[0]["step"], steps))
        assert all(d["margin_s"] == 0 for d in fine) and fine[0]["previous"] - fine[0]["step"] <= 2 * stage.log_every
    assert sum(ends) / len(ends) >= 0.982


def test_the_final_windows_count_the_validations_and_checkpoints_before_the_last_step():
    """Single steps' time leaves the validations and checkpoints out: the final windows' plan adds
    those due before its last step (the last step's own are the end's)."""
    stage = Stage(validation_s=5.0, checkpoint_s=3.0)
    budget = BudgetController(
        stage.plan(), Replanned(max_steps=2000, **SCHEDULE), cap=None, tokens_per_step=TOKENS, every=(100, 200)
    )
    seconds = budget._events(895, scale=2.0)  # steps slowed 2x: so are their validations
    assert [seconds(n) for n in (1, 5, 6, 105, 106)] == [0.0, 0.0, 10.0, 10.0, 2 * (5.0 + 5.0 + 3.0)]
    assert (
        BudgetController(stage.plan(), Replanned(max_steps=9, **SCHEDULE), cap=None, tokens_per_step=TOKENS)._events(
            0, 1.0
        )(500)
        == 0
    )


def test_the_final_windows_sync_the_device_before_timing_a_step():
    """On CUDA the host runs ahead of the device: a step's wall time is its own only after a sync
    (kiln.train.budget.BudgetController.of passes torch.cuda.synchronize). Log steps have synced already."""
    stage = Stage()
    synced = []
    schedule = Replanned(max_steps=stage.planned_steps(), **SCHEDULE)
    budget = BudgetController(
        stage.plan(), schedule, cap=None, tokens_per_step=TOKENS, start=0.0, clock=lambda: stage.t
    )
    budget.sync = lambda: synced.append(stage.t)
    budget, _, steps = stage.run(budget)
    fine_steps = [d["step"] for d in stage.decisions if d["fine"] and d["step"] % stage.log_every]
    assert fine_steps and len(synced) >= len(fine_steps)
    assert not [d for d in stage.decisions if not d["fine"] and d["step"] % stage.log_every]


def test_never_past_the_cap_train_max_steps():
    stage = Stage(cap=2000)
    budget, end, steps = stage.run()
    assert steps == 2000 and end < 0.98 * stage.budget_s  # the cap, not the budget, ended it
    assert max(d["max_steps"] for d in stage.decisions) <= 2000
    assert stage.decisions[-1]["why"] == "capped by train.max_steps"


def cooldown_share(budget: BudgetController, steps: int) -> float:
    """The share of the steps trained in wsd's cooldown, from the LR the schedule gave each step."""
    peak, warmup = budget.schedule.kw["lr"], budget.schedule.kw["warmup_steps"]
    first = next(k for k in range(warmup, steps) if budget.schedule(k) < peak)
    return 1 - first / steps


STALLED = {  # a 3-minute budget's stage, as issue 44 sizes them
    "one 30 s stall at 20%": dict(stalls={36.0: 30.0}),
    "three 5 s stalls": dict(stalls={45.0: 5.0, 90.0: 5.0, 135.0: 5.0}),
    "a stall of five windows' steps at 50%": dict(slowdown=lambda t: 20.0 if 90.0 <= t < 96.0 else 1.0),
}


@pytest.mark.parametrize("case", STALLED)
def test_a_stall_costs_steps_not_the_shape_of_the_schedule(case):
    """A process off the CPU for a while (KILN_FAULT stall) is one slow log window (or a few): the
    median the plan reads does not move, so neither the cooldown's start nor max_steps follows it
    down; the seconds it took are spent, and the steps they would have bought are not trained. The
    cooldown takes the same share of the steps as in a quiet run (within 5 points) and the budget is
    spent as fully. (The slower of the last window and the median, the rule before, put the cooldown
    at 79% of the steps for the 30 s stall and 52% for the three 5 s ones.)"""
    quiet = Stage(budget_s=180.0)
    quiet_budget, quiet_end, quiet_steps = quiet.run()
    stalled = Stage(budget_s=180.0, **STALLED[case])
    budget, end, steps = stalled.run()
    assert abs(cooldown_share(budget, steps) - cooldown_share(quiet_budget, quiet_steps)) <= 0.05
    assert 0.98 * stalled.budget_s <= end <= stalled.budget_s and 0.98 * quiet.budget_s <= quiet_end
    assert steps < quiet_steps  # the stall's seconds bought no steps
    begun = [d for d in stalled.decisions if "the cooldown beg" in d["why"]]
    assert len(begun) == 1 and begun[0]["cooldown_from"] <= begun[0]["step"]
    assert stalled.decisions[-1]["cooldown_from"] == budget.schedule.cooldown_from


def test_a_hog_that_stays_from_40_percent_is_believed_and_still_cools_down_its_share():
    """Processes spinning on every core from 40% of the budget on: after RECENT // 2 + 1 slow windows
    the median follows, the plan shrinks, and the cooldown begins at the shortened run's own 70%."""
    quiet = Stage(budget_s=180.0)
    quiet_budget, _, quiet_steps = quiet.run()
    hogged = Stage(budget_s=180.0, slowdown=hog_at(72.0))
    budget, end, steps = hogged.run()
    assert 0.98 * hogged.budget_s <= end <= hogged.budget_s
    assert steps < 0.85 * quiet_steps
    assert abs(cooldown_share(budget, steps) - cooldown_share(quiet_budget, quiet_steps)) <= 0.05
    summary = budget.summary()
    assert summary["steps_range"][0] <= steps < summary["steps_range"][1]
    assert summary["window_tokens_per_s"]["slowest"] < 0.6 * summary["window_tokens_per_s"]["median"]


def test_the_decisions_shape_a_schedule_without_a_jump():
    stage = Stage(slowdown=hog_at(300.0, 3.0))
    budget, _, steps = stage.run()
    lrs = [budget.schedule(k) for k in range(steps)]
    # the largest step-to-step change is the cooldown's own first 1-sqrt step, not a re-plan's
    plain = [lr_at(k, max_steps=steps, **SCHEDULE) for k in range(steps)]
    biggest = max(abs(a - b) for a, b in zip(plain[60:], plain[61:]))
    assert max(abs(a - b) for a, b in zip(lrs[60:], lrs[61:])) <= 1.5 * biggest
    assert lrs[-1] < 0.1 * SCHEDULE["lr"]  # cooled down by the end the budget gave it
    assert len(budget.changes) >= 2


def test_a_replay_of_the_checkpoint_and_the_log_follows_the_same_steps_and_schedule(tmp_path):
    """Killed at step 1,500 after a checkpoint at 1,200: the resumed controller gets the checkpoint's
    state and the log file (decisions after 1,200 in it too) and decides nothing it finds recorded."""
    log = tmp_path / "budget.jsonl"
    fingerprint = {"train": {"steps": 1}}
    first = Stage(slowdown=hog_at(100.0))
    schedule = Replanned(max_steps=first.planned_steps(), **SCHEDULE)
    budget = BudgetController(
        first.plan(), schedule, cap=None, tokens_per_step=TOKENS, start=0.0, clock=lambda: first.t
    )
    budget.attach(log, fingerprint, is_main=True)
    first.t = 0.0
    budget, _, _ = first.run(budget, stop_at=1200)
    saved = json.loads(json.dumps(budget.state_dict()))
    budget, _, _ = first.run(budget, stop_at=1500, start_step=1200, t0=first.t - first.startup_s)
    killed_log = log.read_text()
    assert killed_log.count("\n") > 1500 // 10 - 5  # every log step's decision recorded

    # the uninterrupted run that made these decisions, to the end
    whole, _, whole_steps = first.run(budget, start_step=1500, t0=first.t - first.startup_s)

    # the resumed one: another machine speed (no hog), the checkpoint of step 1,200 and the file
    log.write_text(killed_log)
    again = Stage(slowdown=hog_at(100.0))
    resumed = BudgetController(
        again.plan(),
        Replanned(max_steps=first.planned_steps(), **SCHEDULE),
        cap=None,
        tokens_per_step=TOKENS,
        start=0.0,
        clock=lambda: again.t,
    )
    resumed.load_state_dict(saved)
    resumed.attach(log, fingerprint, is_main=True)
    assert resumed.horizon >= 1490 and resumed.max_steps == saved_max(saved, first.planned_steps())
    resumed, _, _ = again.run(resumed, stop_at=1500, start_step=1200)
    assert log.read_text() == killed_log  # steps 1,201-1,500 replayed, none re-decided
    assert resumed.changes == [c for c in whole.changes if c[0] <= 1500]
    assert [resumed.schedule(k) for k in range(1501)] == [whole.schedule(k) for k in range(1501)]
    assert whole_steps > 1500


def saved_max(state: dict, planned: int) -> int:
    return state["changes"][-1][1] if state["changes"] else planned


def controller(stage: Stage) -> BudgetController:
    """A fresh controller of `stage`'s plan, on its clock, counting validations and checkpoints."""
    schedule = Replanned(max_steps=stage.planned_steps(), **SCHEDULE)
    return BudgetController(
        stage.plan(), schedule, cap=None, tokens_per_step=TOKENS, every=(100, 200), start=0.0, clock=lambda: stage.t
    )


def test_a_run_killed_in_its_final_windows_resumes_deciding_every_step(tmp_path):
    """The final windows' flag is in the checkpoint and in each recorded decision: a run checkpointed
    inside them and killed a few steps later replays every step's decision after the checkpoint, and
    decides afresh (at every step, once it has measured its own speed again) only after them."""
    log, fingerprint = tmp_path / "budget.jsonl", {"train": {"steps": 1}}
    first = Stage(slowdown=hog_at(100.0))
    budget = controller(first)
    budget.attach(log, fingerprint, is_main=True)
    first.t = 0.0
    _, _, whole_steps = first.run(budget)
    fine_from = min(d["step"] for d in first.decisions if d["fine"])
    assert whole_steps - fine_from >= 6

    # the same run again, checkpointed 2 steps into the final windows, killed 3 steps later
    log.unlink()
    again = Stage(slowdown=hog_at(100.0))
    budget = controller(again)
    budget.attach(log, fingerprint, is_main=True)
    again.t = 0.0
    budget, _, _ = again.run(budget, stop_at=fine_from + 2)
    saved = json.loads(json.dumps(budget.state_dict()))
    assert saved["fine"] is True
    budget, _, _ = again.run(budget, stop_at=fine_from + 5, start_step=fine_from + 2, t0=again.t - again.startup_s)

    resumed = controller(again)
    resumed.load_state_dict(saved)
    resumed.attach(log, fingerprint, is_main=True)
    assert resumed.fine and resumed.horizon == fine_from + 5
    assert sorted(resumed.pending) == [fine_from + 3, fine_from + 4, fine_from + 5]  # every step's
    third = Stage(slowdown=hog_at(100.0))
    third.t = again.t
    resumed, _, _ = third.run(resumed, start_step=fine_from + 2, t0=again.t - third.startup_s)
    assert resumed.pending == {} and all(d["fine"] for d in third.decisions)
    assert [s for s, _ in resumed.changes if s > fine_from + 2] == [
        s for s, _ in budget.changes if fine_from + 2 < s <= fine_from + 5
    ] + [d["step"] for d in third.decisions if d["max_steps"] != d["previous"]]


def test_a_fresh_start_replays_a_log_of_its_own_trajectory_only(tmp_path):
    log = tmp_path / "budget.jsonl"
    stage = Stage(slowdown=hog_at(200.0))
    schedule = Replanned(max_steps=stage.planned_steps(), **SCHEDULE)
    budget = BudgetController(
        stage.plan(), schedule, cap=None, tokens_per_step=TOKENS, start=0.0, clock=lambda: stage.t
    )
    budget.attach(log, {"a": 1}, is_main=True)
    stage.t = 0.0
    budget, _, steps = stage.run(budget)

    replay = Stage()  # no hog: left to itself it would train far more steps
    other = BudgetController(
        replay.plan(),
        Replanned(max_steps=stage.planned_steps(), **SCHEDULE),
        cap=None,
        tokens_per_step=TOKENS,
        start=0.0,
        clock=lambda: replay.t,
    )
    other.attach(log, {"a": 1}, is_main=True)
    other, _, replayed_steps = replay.run(other)
    assert replayed_steps == steps and other.changes == budget.changes and replay.decisions == []

    stranger = BudgetController(
        replay.plan(),
        Replanned(max_steps=stage.planned_steps(), **SCHEDULE),
        cap=None,
        tokens_per_step=TOKENS,
        start=0.0,
    )
    stranger.attach(log, {"a": 2}, is_main=True)  # another trajectory's file: dropped, not replayed
    assert stranger.pending == {} and stranger.horizon == 0 and log.read_text() == ""


def test_the_aim_is_under_the_budget():
    assert 0.98 < AIM < 1.0


def test_a_dollar_budget_reaches_the_controller_as_the_seconds_it_buys():
    """The plan train makes from the smoke stage's measurements (build_plan, budget_seconds), read as
    train reads it (TrainPlan.of)."""
    raw = {
        "run_name": "b",
        "download": {"sources": [{"name": "s", "kind": "stdlib"}]},
        "train": {"budget": {"dollars": 2}},
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64},
        "smoke": {"price_per_gpu_hour": 3.0},
    }
    train = TrainSection.of(kiln_config.validate(raw)["train"])
    times = StageTimes(step_s=0.5, startup_s=20.0, validation_s=3.0, checkpoint_s=1.0)
    plan = build_plan(
        train,
        3.0,
        batch=BatchSplit(world=4, micro_batch=16, seq_len=256, grad_accum=1),
        times=times,
        tokens_per_s=4 * 16 * 256 / 0.5,
        n_params=10**6,
        train_tokens=10**8,
        checkpoint_bytes=12 * 10**6,
        model_bytes=4 * 10**6,
    )
    loaded = TrainPlan.of(plan | {"precision": "fp32", "activation_checkpointing": "none"})
    assert loaded.max_steps == plan["max_steps"]
    assert loaded.budget == BudgetPlan(pytest.approx(2 / 3.0 / 4 * 3600), times, pytest.approx(1.0 * 2 * 4 / 12))


def test_the_report_shows_the_budget_against_the_spent_time_and_the_planned_against_the_trained_steps():
    from kiln.report.run import _budget_rows

    summary = {"steps": 3140, "budget_s": 420.0, "spent_s": 415.8, "decisions": 313, "replans": 57}
    rows = "\n".join(_budget_rows({"max_steps": 2757}, summary))
    assert "| steps | 2,757 | 3,140 (57 re-plans in 313 decisions" in rows
    assert "budget 420 s | spent 416 s (99.0%)" in rows
    assert _budget_rows({"max_steps": 2757}, {"steps": 200}) == []  # a run planned in steps
    assert "speed" not in rows  # a summary from before the windows' speeds were recorded
    speeds = {"median": 17_900.0, "slowest": 960.0, "windows": 169, "below_half": 6}
    varied = summary | {"steps_range": [277, 1538], "window_tokens_per_s": speeds}
    rows = "\n".join(_budget_rows({"max_steps": 1538}, varied))
    assert "varied: log windows' median 17,900 tokens/s, slowest 960 (6 of 169 below half the median)" in rows
    assert "max_steps moved between 277 and 1,538" in rows
    steady = varied | {"window_tokens_per_s": speeds | {"slowest": 16_000.0, "below_half": 0}}
    assert "| speed | | steady: log windows' median 17,900 tokens/s, slowest 16,000 (0 of 169" in "\n".join(
        _budget_rows({"max_steps": 1538}, steady)
    )
