"""Loss spikes: a step whose loss is far above the running average, logged so a long run's curve can
be read (and a bad batch or LR found) without staring at it.

The running average is an exponential moving average of the per-step loss (the mean over ranks),
updated on the host at log steps from the losses the trainer kept on the device in between. It is
part of Trainer.state_dict, so a resumed run flags the same steps an uninterrupted one does.
"""

from __future__ import annotations

import math


class SpikeDetector:
    """loss > factor x EMA(loss) is a spike. The EMA warms up over `warmup` steps before anything is
    flagged, and follows a spike only up to factor x itself, so one spike neither hides the next
    nor becomes the new normal at once."""

    def __init__(self, factor: float, beta: float = 0.9, warmup: int = 5):
        self.factor, self.beta, self.warmup = factor, beta, warmup
        self.ema: float | None = None
        self.seen = 0

    def update(self, loss: float) -> float | None:
        """Take one step's loss; return its ratio to the running average if it is a spike."""
        if not math.isfinite(loss):
            return None
        if self.ema is None:
            self.ema, self.seen = loss, 1
            return None
        ratio = loss / self.ema if self.ema > 0 else math.inf
        spike = self.seen >= self.warmup and ratio > self.factor
        self.ema = self.beta * self.ema + (1 - self.beta) * min(loss, self.factor * self.ema)
        self.seen += 1
        return ratio if spike else None

    def state_dict(self) -> dict:
        return {"ema": self.ema, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.seen = state["ema"], state["seen"]
