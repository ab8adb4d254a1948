"""Learning-rate schedules: linear warmup, then cosine to min_lr, warmup-stable-decay, or constant.

The LR is a pure function of the optimizer step, so a checkpoint needs no scheduler state: the step
it saves is the schedule's whole state (the "scheduler not saved" resume bug cannot happen).

- cosine: after warmup, half a cosine from lr down to min_lr at max_steps.
- wsd (warmup-stable-decay, Hägele et al. 2024, arXiv:2405.18392): lr held until the last
  decay_fraction of the steps, then a cooldown to min_lr, linear or "1-sqrt"
  (lr scaled by 1 - sqrt(progress), the shape that paper found best).
- constant: lr after warmup until the end (min_lr unused).

Warmup ramps linearly to lr from 0, or, for a run continuing another model (train.init_from's
warmup_from), from the LR that model ended at: a trained model started near zero LR and then warmed
up again spends its first steps hardly moving, and its optimizer moments (optimizer: true) were
shaped at that level.

A budgeted run changes its max_steps as it goes (kiln.train.budget): Replanned is the schedule of
such a run, a function of the step and of the re-plans made so far, which its checkpoints hold.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from kiln.config.train_sections import TrainSection

KINDS = ("cosine", "wsd", "constant")
COOLDOWNS = ("linear", "1-sqrt")


def lr_at(
    step: int,
    *,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    max_steps: int,
    kind: str = "cosine",
    decay_fraction: float = 0.2,
    cooldown: str = "linear",
) -> float:
    """LR for optimizer step `step` (0-based) of a run of max_steps steps: Replanned's schedule
    before any re-plan (one formula for both). Warmup starts at lr/warmup_steps, never at 0, so the
    first step already moves the weights."""
    return Replanned(
        lr=lr,
        min_lr=min_lr,
        warmup_steps=warmup_steps,
        max_steps=max_steps,
        kind=kind,
        decay_fraction=decay_fraction,
        cooldown=cooldown,
    )(step)


def schedule_from_config(train: TrainSection, max_steps: int) -> Replanned:
    """step -> LR for the `train` section, run for max_steps steps."""
    return Replanned.from_config(train, max_steps)


@dataclass(frozen=True)
class _Segment:
    """The schedule from step `start` on: the run ends at max_steps; the decay (the cooldown of wsd,
    the whole post-warmup phase of cosine) starts at decay_start; from `anchor` its progress runs
    linearly from p0 at anchor to 1 at max_steps. A segment with p0 0 and anchor decay_start is
    lr_at's own schedule for max_steps."""

    start: int
    max_steps: int
    decay_start: int
    anchor: int
    p0: float = 0.0


class Replanned:
    """The LR schedule (lr_at is this, never re-planned), whose max_steps may change during the run
    (kiln.train.budget re-plans the steps from the speed it measures) without a jump in the LR.

    Before the decay (warmup, wsd's stable phase) the LR is the peak's ramp or the peak; in it, the
    decay's progress in [0, 1] is scaled by half a cosine, or wsd's linear or 1-sqrt cooldown. A re-plan at step s (steps 0..s-1 done) to M
    steps changes the LR of steps s onwards only:
    - before the decay has begun (warmup, or wsd's stable phase), the schedule becomes lr_at's for M:
      the LR held at its peak until M's own decay start, or, when that lies behind s already, a
      cooldown that starts at s;
    - once the decay has begun, its start is kept and its progress is re-anchored: it goes on from
      the progress reached at s, linearly to 1 at M. The LR is continuous; only its slope changes
      (steeper when the run was shortened, flatter when lengthened).
    The schedule is a function of the re-plans, (step, max_steps) pairs: replaying them gives the
    same LR at every step (a resumed run replays its checkpoint's)."""

    def __init__(
        self,
        *,
        lr: float,
        min_lr: float,
        warmup_steps: int,
        max_steps: int,
        kind: str = "cosine",
        decay_fraction: float = 0.2,
        cooldown: str = "linear",
        warmup_from: float | None = None,
    ):
        if kind not in KINDS:
            raise ValueError(f"unknown schedule {kind!r} (known: {', '.join(KINDS)})")
        if kind == "wsd" and cooldown not in COOLDOWNS:
            raise ValueError(f"unknown cooldown {cooldown!r} (known: {', '.join(COOLDOWNS)})")
        self.kw = dict(
            lr=lr,
            min_lr=min_lr,
            warmup_steps=warmup_steps,
            kind=kind,
            decay_fraction=decay_fraction,
            cooldown=cooldown,
            warmup_from=warmup_from or 0.0,
        )
        first = self._plain(0, max_steps)
        self.segments: list[_Segment] = [first]
        self._starts = [0]

    @classmethod
    def from_config(cls, train: TrainSection, max_steps: int) -> Replanned:
        return cls(
            lr=train.lr,
            min_lr=train.min_lr,
            warmup_steps=train.warmup_steps,
            max_steps=max_steps,
            kind=train.schedule,
            decay_fraction=train.decay_fraction,
            cooldown=train.cooldown,
            warmup_from=_warmup_from(train),
        )

    @property
    def max_steps(self) -> int:
        return self.segments[-1].max_steps

    @property
    def cooldown_from(self) -> int | None:
        """The step wsd's cooldown begins at, as the schedule stands (fixed once begun); None for
        cosine and constant, whose decay is the whole run after warmup or none."""
        return self.segments[-1].decay_start if self.kw["kind"] == "wsd" else None

    def _decay_start(self, max_steps: int) -> int:
        warmup = self.kw["warmup_steps"]
        if self.kw["kind"] != "wsd":
            return warmup
        return max(warmup, max_steps - max(1, round(self.kw["decay_fraction"] * max_steps)))

    def _plain(self, start: int, max_steps: int) -> _Segment:
        decay_start = self._decay_start(max_steps)
        return _Segment(start, max_steps, decay_start, decay_start)

    def _segment(self, step: int) -> _Segment:
        return self.segments[bisect.bisect_right(self._starts, step) - 1]

    def _progress(self, step: int, seg: _Segment) -> float:
        """The decay's progress at `step` (>= seg.decay_start) under seg, in [0, 1]."""
        if seg.p0 == 0.0 and seg.anchor == seg.decay_start:  # lr_at's own formula
            progress = (step - seg.decay_start) / max(1, seg.max_steps - seg.decay_start)
        else:
            progress = seg.p0 + (1.0 - seg.p0) * (step - seg.anchor) / max(1, seg.max_steps - seg.anchor)
        return min(1.0, max(0.0, progress))

    def replan(self, step: int, max_steps: int) -> None:
        """From step `step` (0-based: the next step to run) on, the run ends at max_steps."""
        last = self.segments[-1]
        if step < last.start:
            raise ValueError(f"a re-plan at step {step} after one at step {last.start}: re-plans run forwards")
        if max_steps == last.max_steps:
            return
        if self.kw["kind"] == "constant" or step < last.decay_start:
            seg = self._plain(step, max_steps)
            if seg.decay_start < step:  # the new end's cooldown should have begun already: it begins now
                seg = _Segment(step, max_steps, step, step)
        else:
            seg = _Segment(step, max_steps, last.decay_start, step, self._progress(step, last))
        if last.start == step:
            self.segments[-1] = seg
        else:
            self.segments.append(seg)
            self._starts.append(step)

    def __call__(self, step: int) -> float:
        seg = self._segment(step)
        lr, min_lr, warmup = self.kw["lr"], self.kw["min_lr"], self.kw["warmup_steps"]
        if step < warmup:  # from warmup_from at step -1, so step 0 already moves (0 + lr * ...: as ever)
            start = self.kw["warmup_from"]
            return start + (lr - start) * (step + 1) / warmup
        if self.kw["kind"] == "constant":
            return lr
        if step >= seg.max_steps:
            return min_lr
        if step < seg.decay_start:
            return lr
        progress = self._progress(step, seg)
        if self.kw["kind"] == "cosine":
            scale = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.kw["cooldown"] == "1-sqrt":
            scale = 1.0 - math.sqrt(progress)
        else:
            scale = 1.0 - progress
        return min_lr + scale * (lr - min_lr)


def _warmup_from(train: TrainSection) -> float | None:
    """train.init_from.warmup_from as an LR. `source` is replaced by the source's (a run's or a
    checkpoint's) last LR before the train stage builds its schedule
    (kiln.train.init_from.resolved_warmup); the smoke stage, which times a random init, keeps it
    and ramps from 0."""
    start = train.init_from.warmup_from if train.init_from else None
    return start if isinstance(start, (int, float)) else None
