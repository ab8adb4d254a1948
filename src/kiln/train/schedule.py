"""Learning-rate schedule: linear warmup, then cosine decay to min_lr at max_steps."""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """LR for optimizer step `step` (0-based). Warmup starts at lr/warmup_steps, never at 0, so the
    first step already moves the weights."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
