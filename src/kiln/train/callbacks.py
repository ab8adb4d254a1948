"""What fit runs around each step, behind one small interface (as OLMo-core's trainer callbacks).

fit (kiln.train.trainer) owns the step: train it, decide what follows it (kiln.train.step_actions),
read the steps the host ran ahead on when it syncs, and build a log step's record. Everything else
that happens after a step is a Callback, called on every rank in list order; most of them run
collectives, so every rank has the same list:

    Budget       re-plans max_steps from the measured speed (train.budget)
    Validation   validation loss and bits per byte into the record; the sampler's completions
    Metrics      the record into metrics.jsonl (and W&B)
    Checkpoints  a checkpoint when the cadence says so
    Preemption   the end of a preempted run, once every rank has saved the same step

A caller's own callbacks (fit's `callbacks`) run after these, on a record already validated and
written. fit runs every callback under the throughput meter's pause: their time is not training time
(the budget counts it: it measures its own wall clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kiln.train import checkpoint, preemption, progress
from kiln.train.budget import BudgetController
from kiln.train.distributed import barrier
from kiln.train.metrics import MetricsSink
from kiln.train.result import RunResult
from kiln.train.samples import Sampler
from kiln.train.step_actions import StepActions

if TYPE_CHECKING:  # the trainer imports this module; callbacks only receive one
    from kiln.train.trainer import Trainer


@dataclass
class StepEnd:
    """What fit hands its callbacks after a step."""

    due: StepActions  # what the cadence asks of this step
    record: dict | None  # a log step's metrics.jsonl record (earlier callbacks add to it); None off log steps
    result: RunResult  # the run's report, filled as it goes


class Callback(Protocol):
    """A part of fit that runs after each step; each hook is called on every rank. A caller's callback
    implements the three hooks, or subclasses this to inherit the ones it does not need."""

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        """After step `end.due.step` was trained and, where it syncs, read."""

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        """After the last step, before the weights are saved."""

    def close(self) -> None:
        """When fit ends, after its last step or by a RunStopped (preemption, a non-finite step): release
        files and handlers (no collectives)."""


class Budget(Callback):
    """train.budget: the steps re-planned from the measured speed (kiln.train.budget); max_steps is
    read afresh by the loop, so a decision at a step counts from the next one."""

    def __init__(self, controller: BudgetController):
        self.controller = controller

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        speed = end.record["tokens_per_s"] if end.record is not None else None
        self.controller.after_step(end.due.step, speed, log=end.due.log)
        trainer.max_steps = self.controller.max_steps

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        result.budget = self.controller.summary()


class Validation(Callback):
    """At validation steps: validation loss into the record, and the sampler's greedy completions
    (collective: an FSDP forward is) into samples.jsonl."""

    def __init__(self, sink: MetricsSink, sampler: Sampler | None):
        self.sink, self.sampler = sink, sampler

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if not end.due.validate:
            return
        record = end.record
        record["val_loss"] = trainer.evaluate()
        record["val_bpb"] = trainer.bits_per_byte(record["val_loss"], "val")
        end.result.val_losses.append((record["step"], record["val_loss"]))
        samples = trainer.sample(self.sampler)
        if trainer.dist.is_main:
            progress.log_validation(record, samples)
            self.sink.log_samples(record["step"], samples)


class Metrics(Callback):
    """A log step's record into metrics.jsonl and W&B (the sink writes on rank 0 only)."""

    def __init__(self, sink: MetricsSink):
        self.sink = sink

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if end.record is not None:
            self.sink.log(end.record)

    def close(self) -> None:
        self.sink.close()


class Checkpoints(Callback):
    """A checkpoint at the steps the cadence saves (every checkpoint_every, the last, a preempted one),
    through `saver` (collective); an async save's writing overlaps the steps after it."""

    def __init__(self, saver: checkpoint.Saver):
        self.saver = saver

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if end.due.save:
            trainer.save_checkpoint(self.saver)

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        self.saver.wait()


class Preemption(Callback):
    """A preemption signal (kiln.train.preemption) ends the run at a step every rank agreed on, once
    every rank has saved it (Checkpoints ran before this): RunStopped(PREEMPTED), exit 75."""

    def __init__(self, saver: checkpoint.Saver):
        self.saver = saver

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if not end.due.preempted:
            return
        self.saver.wait()  # an async save: this rank's shards written (rank 0: the checkpoint in place)
        barrier(trainer.dist.world)  # rank 0 has written the checkpoint before any rank exits
        raise preemption.stopped(trainer.stop.received, end.due.step, self.saver.last_checkpoint())
