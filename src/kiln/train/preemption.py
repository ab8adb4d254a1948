"""Preemption: a signal that asks the run to stop soon (SIGTERM from Slurm at its time limit or from
torchrun passing one on, or SIGUSR1 from `sbatch --signal=USR1@<s>`) sets a flag; the trainer shares
the flag with every rank at each step boundary, and all of them save a checkpoint at the same step
and exit with ExitCode.PREEMPTED (75).

The handler only records the signal: saving from inside it could interrupt a collective or a write
half-way. A second signal changes nothing (Slurm signals every process of a step, and torchrun then
passes the same signal on).
"""

from __future__ import annotations

import signal
import threading

from kiln.errors import ExitCode, RunStopped

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignal:
    """`stop.install()` ... `stop.received` is the first signal's name, or None ... `stop.restore()`.
    Outside the main thread (where Python cannot set handlers) it never fires."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name


def stopped(received: str | None, step: int, last_checkpoint: str) -> RunStopped:
    """What a preempted run raises once every rank has saved `step` (`received`: this rank's signal, or
    None where another rank got it): exit 75, and what a rerun does."""
    signal_name = received or "a preemption signal on another rank"
    return RunStopped(
        f"train: {signal_name}: every rank saved step {step} ({last_checkpoint}); rerun the same command to "
        f"continue from step {step + 1}",
        ExitCode.PREEMPTED,
    )
