"""A time (or dollar) budget spent to within a few percent: the train stage re-plans its steps from its
own measured speed as it goes, and records every decision so a resumed run follows the same ones.

The smoke stage turns train.budget into steps from a ~20 s probe (kiln.plan.steps.budget_steps); a run
that then goes faster or slower than the probe, or whose machine slows down half-way (another job
starts on it), would end well before or after its budget. BudgetController re-plans at every log step, where
the host has read the step anyway, and in the run's final log windows at every step:

    spent      the stage's wall time so far, from the launcher's start (KILN_LAUNCH_START, which
               kiln.train.launch sets for the ranks: process start, imports, model build, compile,
               data open included), plus what earlier attempts of the run spent (their last recorded
               decision's figure; the seconds between a killed attempt's last decision and its death
               are not known to anyone and not counted). Without the launcher: from this object's
               creation.
    per step   the all-in seconds per step of this attempt so far (validation, checkpoints and logging
               included, the first log window with its warm-up and compilation left out), scaled by
               how much slower or faster the recent steps are than that average: the median of the
               last RECENT windows; in the final windows, the median of the last FINE_RECENT steps'
               own wall times. A median, so that one window cannot move it: a stall (the process off
               the CPU for 40 s, a slow checkpoint write, a straggler) costs the seconds it took and
               the steps they would have bought, and the plan believes a slow-down once it has lasted
               most of RECENT windows. The slower of the last window and the median, as this was
               once, took one stalled window for a hog come to stay: the README's run cut max_steps
               from 1,538 to 277, its cooldown began there, and it cooled down for 84% of its steps
               (tests/unit/train/test_budget_controller.py simulates that stall: 79% there, 30% now).
               A hog that stays is seen RECENT // 2 windows later than the last window would see it;
               those windows' extra seconds are spent, and the next decisions re-plan from them (the
               simulated hogs, 2x to 8x, at any moment, still end inside the budget at the default's
               0.12 s steps).
    end        the last step's validation and checkpoint, the weights and Hugging Face export after
               the loop (smoke's measured times, or the largest overhead this run measured around a
               window, whichever is more, in units of steps so that they slow down with the steps),
               and EXIT_S for the processes' exit (slowed as the steps are, up to EXIT_SLOWDOWN).
               Not the window after this attempt's first validation: that one compiles the
               validation's graph (train.compile), once, and the end's validation does not. Counted,
               the compile was both kept in hand and predicted as the end's for the rest of the run,
               twice its seconds unspent: issue 60's run (1.5 s steps) predicted 407 s at its last
               decision and ended at 401 of its 420 (the simulation: 407.6 and 401.9 s, 95.7%, with
               a 6 s compile; 413.9 and 413.9, 98.5%, without counting it).
    margin     NOISE_SIGMAS x the measured spread of the windows' step time (from successive windows'
               differences, so a hog's one jump is not noise), over the windows left (at most
               MAX_NOISE of the budget). None in the final windows: a decision every step corrects
               the noise of the one before it.

The plan aims at AIM of the budget less the margin (earlier when what follows the last decision, a
step or a log window and the end at the run's usual speed, is more than the budget's last 1 - AIM):
max_steps is kept while the predicted end is within BAND of that, else set to the most steps that fit
(at least one more; never past train.max_steps, the cap). A decision at step s changes steps s+1 on;
the LR schedule follows it without a jump (kiln.train.schedule.Replanned), in the cooldown too.

The cooldown (wsd's) begins at the decision whose max_steps puts its start at or behind the step, and
only there: so, from the median's evidence, never from one window. Once begun it is kept, stretched or
steepened by later decisions. Each decision records the step the cooldown begins at as the schedule
then stands (`cooldown_from`, the last decision's is the run's), and the first in the cooldown says
so ("the cooldown begins" when it is the decision that began it).

The final windows: once a decision finds at most FINE_WINDOWS log windows left, the run decides after
every step to its end (the device synced first, so that a step's wall time is its own). A log
window's time is noisy on a busy machine (under one spinning process per core the 2-core VM's
10-step windows differed by ~90% of their mean), and a margin for that noise over the last window
would leave ~5% of the budget unspent; deciding every step leaves one step's noise. A slow-down can
then only surprise what follows the last decision: one step, the last validation and checkpoint, the
export and the exit (~3 s in the default, EXIT_S included). The aim keeps that much of the budget in
hand, so a machine that halves its speed at any moment, in the cooldown or in those last seconds,
still ends inside the budget; one that slows k-fold there ends at most (k - 2) x those seconds past
it. When the end's seconds and a step are more than the budget's last 1 - AIM, that reserve, not
AIM, sets the aim, and nothing else is left unspent but the rounding down to whole steps: with 1.5 s
steps (0.4% of 7 minutes) a quiet run ends at 98-99% of the budget. There a halving can cost up to one
step past the budget: the last decision cannot drop the step after it (max_steps is at least one
more), so a halving that begins just after the decision before it slows two steps and the end, and
the reserve holds one step (the simulation's worst, 1.5 s steps: 421 s of 420). A slow-down before
the final windows costs steps, not the budget (tests/unit/train/test_budget_controller.py
simulates each case), as long as a log window stays short against what is left (steps slowed 20x
and more, as spinning processes on every core slowed the quick bench's tiny model, make a window of
log_every steps a long time, and the run can only react a window later).

Every decision, {step, spent_s, step_s, tokens_per_s, per_step_s, end_s, margin_s, max_steps,
previous, predicted_s, fine, why, cooldown_from}, is a line of train/budget.jsonl (kiln.layout.BUDGET_LOG, set aside
with the trajectory), and the checkpoint holds the ones that changed max_steps, the last step decided
and whether the final windows had begun. A resumed run replays the checkpoint's, then the file's
recorded after the checkpoint (an attempt killed after deciding), at their steps, and decides afresh
only after the last recorded one: it follows the same steps and schedule as the run it continues. The
trajectory fingerprint holds the smoke stage's planned steps, never a re-planned max_steps, so a
re-plan never looks like a changed run.

All ranks decide alike, at the same steps: whether a step decides follows from the step, the agreed
max_steps and the agreed final-windows flag, and each decision's inputs are agreed (the max over
ranks) before it is made.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from kiln.config.train_sections import TrainSection
from kiln.io import atomic_file
from kiln.plan.steps import BudgetPlan
from kiln.train.distributed import max_across_ranks
from kiln.train.launch import LAUNCH_START_ENV
from kiln.train.schedule import Replanned

AIM = 0.99  # of the budget: where the stage is planned to end (over 100% is what the user pays for)
BAND = 0.002  # of the budget: a plan predicted to end this close to the aim is kept (no churn)
NOISE_SIGMAS = 2.0
MAX_NOISE = 0.05  # of the budget: the noise margin at most
RECENT = 5  # windows in the median of the recent step time
FINE_WINDOWS = 2  # log windows left when the run starts deciding after every step
FINE_RECENT = 3  # steps in the median of the recent step time, in the final windows
# After summary.json: the ranks' interpreter teardown, torchrun's and the launcher's exit. It cannot be
# measured before it happens; on the 2-core VM a process that imported torch took 1.3-2.3 s to exit and
# torchrun's one rank 1.6-2.7 s after its last line (bench/budget.py measures the whole stage).
EXIT_S = 2.0
# The exit is one thread's work: processes spinning on every core take about half of its core (the
# hogged quick bench: 2.2 -> 4.6 s), while the steps' threads wait on each other and slow far more
# (6.7x there). So it is slowed as the steps are, up to this factor.
EXIT_SLOWDOWN = 2.5


def stage_start() -> float | None:
    """When kiln.train.launch started this stage (epoch seconds), None when it did not."""
    value = os.environ.get(LAUNCH_START_ENV)
    return float(value) if value else None


def run_id(fingerprint: dict) -> str:
    """A short digest of a run's fingerprint: the file's lines of another trajectory are not replayed."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:16]


def aim_s(budget_s: float, after_s: float, margin_s: float) -> float:
    """Where the stage is planned to end: AIM of the budget, or earlier by after_s, what follows the
    last decision (a log window and the end) at the run's usual speed, when that is more than the
    budget's last (1 - AIM): a machine that halves its speed just after the last decision still ends
    inside the budget. Less the noise margin."""
    return min(AIM * budget_s, budget_s - after_s) - margin_s


def plan_steps(*, step: int, spent_s: float, aim: float, per_step_s: float, end_s: float) -> int:
    """The most steps whose stage ends by `aim` (seconds of the stage), at least step + 1: the
    decision's core, pure arithmetic."""
    return step + max(1, math.floor((aim - spent_s - end_s) / per_step_s))


class BudgetController:
    """The budget controller of one train run: its decisions, the schedule they shape, its state."""

    def __init__(
        self,
        plan: BudgetPlan,
        schedule: Replanned,
        *,
        cap: int | None,
        tokens_per_step: int,
        every: tuple[int, int] = (0, 0),
        start: float | None = None,
        clock: Callable[[], float] = time.time,
        agree: Callable[[list[float]], list[float]] = lambda xs: xs,
        sync: Callable[[], None] = lambda: None,
    ):
        self.plan, self.schedule, self.cap = plan, schedule, cap
        # the steps that validate and those that save (0: none), whose costs the final windows count
        self.validate_every, self.checkpoint_every = every
        self.planned_steps = schedule.max_steps  # the smoke stage's: the fingerprint's, never re-planned
        self.tokens_per_step, self.clock, self.agree, self.sync = tokens_per_step, clock, agree, sync
        self.start = start if start is not None else stage_start() or clock()
        self.offset_s = 0.0  # what earlier attempts spent
        self.changes: list[tuple[int, int]] = []  # (step, max_steps) of every decision that changed it
        self.horizon = 0  # the last step decided, here or by an earlier attempt
        self.fine = False  # in the final windows: a decision after every step
        self.pending: dict[int, dict] = {}  # decisions recorded after the checkpoint, to replay
        self.records = 0  # decisions made or replayed in the run's lineage
        self.path: Path | None = None
        self.id, self.is_main = "", True
        # this attempt's measurements
        self._last: tuple[int, float] | None = None  # (step, time) of the previous log step
        self._base: tuple[int, float] | None = None  # the same, after the first window
        self._pure: list[float] = []  # each window's step seconds (steps only: kiln.train.metrics' window)
        self._pure_s = 0.0  # their seconds, summed over the windows' steps
        self._overhead_steps = 0.0  # the largest overhead around a window, in steps of its speed
        self._validated = False  # whether this attempt measured a window after a validation (module docstring)
        self._window = 1  # steps in the last window (log_every)
        self._steps: list[float] = []  # the wall seconds of single steps (the final windows')
        self._timed: tuple[int, float] | None = None  # (step, time) of the last step timed

    @classmethod
    def of(
        cls, plan: BudgetPlan | None, train: TrainSection, max_steps: int, tokens_per_step: int, d
    ) -> BudgetController | None:
        """The controller of a Trainer (d: its kiln.train.distributed setup) for the smoke stage's
        budget plan; None for a run planned in steps. train.max_steps, when set, is the cap."""
        if plan is None:
            return None

        def agree(values: list[float]) -> list[float]:
            return max_across_ranks(torch.tensor(values, dtype=torch.float64, device=d.device), d.world).tolist()

        def sync() -> None:  # a step's wall time is its own only once the device has run it
            if d.device.type == "cuda":
                torch.cuda.synchronize(d.device)

        schedule = Replanned.from_config(train, max_steps)
        every = (math.lcm(train.log_every, train.eval_every), train.checkpoint_every)  # validations: at log steps
        return cls(
            plan, schedule, cap=train.max_steps, tokens_per_step=tokens_per_step, every=every, agree=agree, sync=sync
        )

    @property
    def max_steps(self) -> int:
        return self.schedule.max_steps

    def spent(self, now: float | None = None) -> float:
        """The stage's seconds so far, earlier attempts' included."""
        return self.offset_s + ((self.clock() if now is None else now) - self.start)

    # --- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "changes": [list(c) for c in self.changes],
            "horizon": self.horizon,
            "fine": self.fine,
            "spent_s": self.spent(),
            "records": self.records,
            "planned_steps": self.planned_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's decisions, replayed into the schedule (before attach reads the file)."""
        for step, max_steps in state["changes"]:
            self._apply(int(step), int(max_steps))
        self.horizon, self.records, self.offset_s = int(state["horizon"]), int(state["records"]), state["spent_s"]
        self.fine = bool(state.get("fine", False))  # (a checkpoint of a version without the final windows)

    def attach(self, path: Path, fingerprint: dict, *, is_main: bool) -> None:
        """Read the decision log `path` (every rank) after the checkpoint, if any, was loaded: the
        decisions of this trajectory recorded after the checkpoint's are replayed at their steps, and
        the spent seconds continue from the last one. Rank 0 rewrites the file to that lineage (a
        file of another trajectory, or of a branch the checkpoint is not on, is dropped) and appends
        its decisions from here on."""
        self.path, self.id, self.is_main = Path(path), run_id(fingerprint), is_main
        lines = [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()] if self.path.exists() else []
        ours = [r for r in lines if r.get("run") == self.id]
        upto = [
            (r["step"], r["max_steps"]) for r in ours if r["step"] <= self.horizon and r["max_steps"] != r["previous"]
        ]
        lineage = ours if upto == self.changes else []
        later = [r for r in lineage if r["step"] > self.horizon]
        self.pending = {r["step"]: r for r in later}
        if later:  # (the final windows' flag is replayed with them, at their steps)
            self.horizon, self.offset_s = later[-1]["step"], later[-1]["spent_s"]
        if is_main and lineage != lines:
            with atomic_file(self.path) as tmp:
                tmp.write_text("".join(json.dumps(r) + "\n" for r in lineage))

    # --- decisions ----------------------------------------------------------------------------

    def _apply(self, step: int, max_steps: int) -> None:
        if max_steps != self.schedule.max_steps:
            self.schedule.replan(step, max_steps)
            self.changes.append((step, max_steps))

    def after_step(
        self, step: int, tokens_per_s: float | None = None, *, log: bool, now: float | None = None
    ) -> dict | None:
        """After the loop's step `step` (log: a log step, whose window the host has read; tokens_per_s:
        that window's speed, steps only): replay the decision recorded for it, or decide (at log steps,
        and at every step of the final windows), or (this attempt's first log step) only measure.
        Returns the decision made here, if any. A collective, when there are several ranks, at the
        steps that decide."""
        timed = log or self.fine
        if timed:
            if not log:
                self.sync()  # a log step's host read its steps already
            now = self.clock() if now is None else now
            if log:
                self._measure(step, tokens_per_s, now)
            self._time_step(step, now)
        if step <= self.horizon:
            self._replay(step)
            return None
        if not timed or self._base is None or self._base[0] == step or step >= self.max_steps:
            return None  # nothing measured yet but the warm-up window (or the run is at its end)
        return self._record(self._decide(step, now))

    def _replay(self, step: int) -> None:
        """The decision recorded for `step`, if any (the loop asks at every step)."""
        if step in self.pending:
            decision = self.pending.pop(step)
            self._apply(step, decision["max_steps"])
            self.fine = decision.get("fine", False)  # (a line of a version without the final windows)
            self.records += 1

    def _record(self, decision: dict) -> dict:
        cooling = self.records > 0 and self._cooling(self.horizon)  # as the last decision left it
        self._apply(decision["step"], decision["max_steps"])
        start = decision["cooldown_from"] = self.schedule.cooldown_from
        if not cooling and self._cooling(decision["step"]):
            decision["why"] += (
                "; the cooldown begins" if start == decision["step"] else f"; the cooldown began at {start}"
            )
        self.horizon, self.records, self.fine = decision["step"], self.records + 1, decision["fine"]
        if self.is_main and self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(decision) + "\n")
        return decision

    def _cooling(self, step: int) -> bool:
        """Whether wsd's cooldown has begun by `step` (the next step to run)."""
        start = self.schedule.cooldown_from
        return start is not None and start <= step

    def _measure(self, step: int, tokens_per_s: float | None, now: float) -> None:
        last, self._last = self._last, (step, now)
        if last is None:
            return  # this attempt's first window: warm-up and compilation, not the run's speed
        steps, wall = step - last[0], now - last[1]
        pure = self.tokens_per_step / tokens_per_s if tokens_per_s else wall / steps
        if self._base is None:
            self._base = last
        self._pure.append(pure)
        self._window = steps
        self._pure_s += pure * steps
        if self.validate_every and last[0] % self.validate_every == 0 and not self._validated:
            self._validated = True  # its validation compiled the graph: a one-off, not the end's cost
        else:
            self._overhead_steps = max(self._overhead_steps, (wall - pure * steps) / pure)

    def _time_step(self, step: int, now: float) -> None:
        if self._timed is not None and self._timed[0] == step - 1:
            self._steps.append(now - self._timed[1])
        self._timed = (step, now)

    def _decide(self, step: int, now: float) -> dict:
        base_step, base_t = self._base
        # the final windows begin (max_steps and the log window are the same on every rank)
        fine = self.fine or self.max_steps - step <= FINE_WINDOWS * self._window
        recent = statistics.median(self._pure[-RECENT:])  # not one window's: a stall is not a hog
        usual = _usual(self._pure)  # the run's unhurried speed: slow-downs are measured against it
        slowdown = recent / usual  # the exit's
        if fine and len(self._steps) >= FINE_RECENT:  # single steps: a slow-down shows within two
            recent = statistics.median(self._steps[-FINE_RECENT:])
            slowdown = recent / usual
        average = self._pure_s / (step - base_step)
        all_in = (now - base_t) / (step - base_step)
        times = self.plan.times
        end_steps = max((times.validation_s + times.checkpoint_s) / times.step_s, self._overhead_steps)
        end_steps += self.plan.final_s / times.step_s
        spread = _spread(self._pure[-4 * RECENT :])
        # Every input agreed by the ranks (the max: the slowest rank's, the larger cost), so that each
        # makes the same decision.
        spent, per_step, recent, spread, slowdown, unslowed, end_steps = self.agree(
            [self.spent(now), all_in * recent / average, recent, spread, slowdown, min(1.0, usual / recent), end_steps]
        )
        end = end_steps * recent + EXIT_S * min(EXIT_SLOWDOWN, max(1.0, slowdown))
        # each window's time varies by spread x its mean; over the n steps left, n / window windows
        steps_left = max(0, self.max_steps - step)
        noise = NOISE_SIGMAS * spread * per_step * math.sqrt(steps_left * self._window)
        margin = 0.0 if fine else min(MAX_NOISE * self.plan.budget_s, noise)
        if fine:  # single steps' own time, and the validations and checkpoints before the last step counted
            per_step = recent
            events = self._events(step, recent / times.step_s)

        def end_at(n: int) -> float:  # the stage's end with n more steps (windows: overheads in per_step)
            return spent + n * per_step + (events(n) if fine else 0.0) + end

        previous = self.max_steps
        predicted = end_at(previous - step)
        # what follows this decision before the next: at the usual speed (a hog comes once)
        after = (end + per_step * (1 if fine else self._window)) * unslowed
        aim = aim_s(self.plan.budget_s, after, margin)
        new = plan_steps(step=step, spent_s=spent, aim=aim, per_step_s=per_step, end_s=end)
        while new > step + 1 and end_at(new - step) > aim:
            new -= 1
        if self.cap is not None and new > self.cap:
            new, why = self.cap, "capped by train.max_steps"
        elif abs(predicted - aim) <= BAND * self.plan.budget_s:
            new, why = previous, "on plan"
        else:
            why = "slower than planned" if new < previous else "faster than planned" if new > previous else "on plan"
        if new != previous:
            predicted = end_at(new - step)
        return {
            "step": step,
            "spent_s": round(spent, 3),
            "step_s": recent,
            "tokens_per_s": self.tokens_per_step / recent,
            "per_step_s": per_step,
            "end_s": round(end, 3),
            "margin_s": round(margin, 3),
            "max_steps": new,
            "previous": previous,
            "predicted_s": round(predicted, 3),
            "fine": fine,
            "why": why,
            "run": self.id,
        }

    def _events(self, step: int, scale: float) -> Callable[[int], float]:
        """The seconds of the validations and checkpoints in the n - 1 steps after `step` (the last
        step's are the end's), at the smoke stage's measured costs times `scale`."""
        times = self.plan.times

        def seconds(n: int) -> float:
            def count(every: int) -> int:
                return (step + n - 1) // every - step // every if every else 0

            return (
                count(self.validate_every) * times.validation_s + count(self.checkpoint_every) * times.checkpoint_s
            ) * scale

        return seconds

    def summary(self) -> dict:
        """What train's summary.json records of the budget: the seconds it bought and spent so far
        (train.py adds the export's), the steps planned by the smoke stage and trained, the decisions,
        the range max_steps moved in, and how the windows' speed varied."""
        steps = [self.planned_steps, *(m for _, m in self.changes)]
        return {
            "budget_s": self.plan.budget_s,
            "spent_s": self.spent(),
            "planned_steps": self.planned_steps,
            "final_steps": self.max_steps,
            "decisions": self.records,
            "replans": len(self.changes),
            "start": self.start,
            "offset_s": self.offset_s,
            "steps_range": [min(steps), max(steps)],
            **self._speeds(),
        }

    def _speeds(self) -> dict:
        """How this attempt's log windows' speed (steps only) varied: their median and slowest tokens/s,
        and how many ran below half the median (a stall, a hog)."""
        if not self._pure:
            return {}
        median = statistics.median(self._pure)
        return {
            "window_tokens_per_s": {
                "median": self.tokens_per_step / median,
                "slowest": self.tokens_per_step / max(self._pure),
                "windows": len(self._pure),
                "below_half": sum(p > 2 * median for p in self._pure),
            }
        }


def _usual(values: list[float]) -> float:
    """The step time of the run's faster windows (the lower quartile of all): robust to one fast
    outlier, and to a slow-down that has lasted less than most of the run."""
    return statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0]


def _spread(values: list[float]) -> float:
    """The relative standard deviation of successive windows' step times, from the median of their
    differences (robust: a speed that changes once, a hog starting, is one difference, not noise)."""
    if len(values) < 2:
        return 0.0
    diffs = [abs(b - a) for a, b in zip(values, values[1:])]
    return statistics.median(diffs) / 0.954 / statistics.median(values)  # median |x - y| = 0.954 sigma (normal)


def final_summary(summary: dict, now: float | None = None) -> dict:
    """BudgetController.summary with spent_s as of now (train.py, after the export: all but the exit)."""
    now = time.time() if now is None else now
    kept = {k: v for k, v in summary.items() if k not in ("start", "offset_s")}
    return kept | {"spent_s": summary["offset_s"] + now - summary["start"]}
