"""What the training loop does after a step, decided in one place (kiln.train.trainer's fit reads it).

After each optimizer step the loop may read the steps it ran ahead on (a host sync), log, validate,
save a checkpoint, and stop for a preemption. Which of these happen follows from the step number, the
run's length and the train section's cadences, and from whether some rank got a preemption signal;
the loop asks once per step (Cadence.at) and then does what the answer says, in that order.

The rules (each one a behaviour the run's files show):
- save every checkpoint_every steps and at the last step (the final checkpoint marks the run done);
- log every log_every steps, at the last step, and at a preempted step (its line is the last one);
- validate at log steps that are a multiple of eval_every, and at the last step;
- a preemption is read from the stop flag of the newest step where the host syncs anyway (a log or
  checkpoint step), else of the step before it, and never at the last step: the run ends normally;
  a preempted step saves, logs, and the run exits 75;
- read (the host sync) at every step that logs or saves, before either: a checkpoint never holds an
  unread non-finite step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class StepActions:
    """What the loop does after `step`."""

    step: int
    last: bool  # the run's final step (max_steps as it stands now)
    log: bool  # a metrics.jsonl record and a progress line
    validate: bool  # validation loss and samples, in that record
    save: bool  # a checkpoint of this step
    preempted: bool  # every rank saves this step, then the run stops (exit 75)

    @property
    def read(self) -> bool:
        """Whether the host reads the unread steps (one sync) before logging and saving."""
        return self.log or self.save


@dataclass(frozen=True)
class Cadence:
    """How often a run logs, validates and saves (train.log_every, eval_every, checkpoint_every)."""

    log_every: int
    eval_every: int
    checkpoint_every: int

    def at(self, step: int, max_steps: int, stop_requested: Callable[[bool], bool]) -> StepActions:
        """The actions after `step` of a run of `max_steps`. `stop_requested(synced)` says whether a rank
        got a preemption signal (kiln.train.step_reader.StepReader.stop_requested); it is not asked at the
        last step, and `synced` tells it whether this step syncs anyway."""
        last = step == max_steps
        at_log, at_save = step % self.log_every == 0, step % self.checkpoint_every == 0 or last
        preempted = not last and stop_requested(at_save or at_log)
        log = at_log or last or preempted
        return StepActions(
            step=step,
            last=last,
            log=log,
            validate=log and (step % self.eval_every == 0 or last),
            save=at_save or preempted,
            preempted=preempted,
        )
