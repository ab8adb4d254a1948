"""Learning-rate schedules: linear warmup, then cosine to min_lr, warmup-stable-decay, or constant.

The LR is a pure function of the optimizer step, so a checkpoint needs no scheduler state: the step
it saves is the schedule's whole state (the "scheduler not saved" resume bug cannot happen).

- cosine: after warmup, half a cosine from lr down to min_lr at max_steps.
- wsd (warmup-stable-decay, Hägele et al. 2024, arXiv:2405.18392): lr held until the last
  decay_fraction of the steps, then a cooldown to min_lr, linear or "1-sqrt"
  (lr scaled by 1 - sqrt(progress), the shape that paper found best).
- constant: lr after warmup until the end (min_lr unused).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

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
    """LR for optimizer step `step` (0-based). Warmup starts at lr/warmup_steps, never at 0, so the
    first step already moves the weights."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if kind == "constant":
        return lr
    if step >= max_steps:
        return min_lr
    if kind == "cosine":
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    if kind == "wsd":
        decay_steps = max(1, round(decay_fraction * max_steps))
        decay_start = max(warmup_steps, max_steps - decay_steps)
        if step < decay_start:
            return lr
        if cooldown not in COOLDOWNS:
            raise ValueError(f"unknown cooldown {cooldown!r} (known: {', '.join(COOLDOWNS)})")
        progress = (step - decay_start) / max(1, max_steps - decay_start)  # [0, 1)
        scale = 1.0 - math.sqrt(progress) if cooldown == "1-sqrt" else 1.0 - progress
        return min_lr + scale * (lr - min_lr)
    raise ValueError(f"unknown schedule {kind!r} (known: {', '.join(KINDS)})")


def schedule_from_config(train: dict, max_steps: int) -> Callable[[int], float]:
    """step -> LR for a validated `train` section, run for max_steps steps."""
    return partial(
        lr_at,
        lr=train["lr"],
        min_lr=train["min_lr"],
        warmup_steps=train["warmup_steps"],
        max_steps=max_steps,
        kind=train["schedule"],
        decay_fraction=train["decay_fraction"],
        cooldown=train["cooldown"],
    )
