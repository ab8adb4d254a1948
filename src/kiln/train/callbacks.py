"""What fit runs around each step, behind one small interface (as OLMo-core's trainer callbacks).

fit (kiln.train.trainer) owns the step: resume, train it, decide what follows it
(kiln.train.step_actions), read the steps the host ran ahead on when it syncs, and build a log step's
record. Everything else that happens around the steps is a Callback its caller hands it, called on
every rank in list order; most of them run collectives, so every rank has the same list. fit knows
none of them by name: the train stage's are `default_callbacks()`, in this order:

    Budget       re-plans max_steps from the measured speed (train.budget; nothing in a run planned in steps)
    Validation   validation loss and bits per byte into the record; the sampler's completions
    (evaluators) the caller's figures beside the validation's (kiln.eval.in_loop: HumanEval pass@1)
    Metrics      the record into metrics.jsonl (and W&B)
    Checkpoints  a checkpoint when the cadence says so
    Preemption   the end of a preempted run, once every rank has saved the same step

A caller adds its own after these (they then see a record already validated and written), or passes
only its own: fit with no callbacks trains the same weights, writing only the final model. fit runs
every callback under the throughput meter's pause: their time is not training time (the budget
counts it: it measures its own wall clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from kiln import layout
from kiln.config import checkpoint_format
from kiln.train import checkpoint, preemption, progress
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
    """A part of fit that runs around its steps; each hook is called on every rank. A caller's callback
    implements the four hooks, or subclasses this to inherit the ones it does not need."""

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        """After the resume (trainer.step is the step the run continues from), before the first step:
        open what the run writes into out_dir."""

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        """After step `end.due.step` was trained and, where it syncs, read."""

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        """After the last step, before the weights are saved."""

    def close(self) -> None:
        """When fit ends, after its last step or by a RunStopped (preemption, a non-finite step): release
        files and handlers (no collectives)."""


class Budget(Callback):
    """train.budget: the trainer's steps re-planned from the measured speed (kiln.train.budget); max_steps
    is read afresh by the loop, so a decision at a step counts from the next one. Nothing for a trainer
    without a budget plan (a run planned in steps)."""

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        if trainer.budget is not None:  # the decisions recorded after the checkpoint, replayed at their steps
            trainer.budget.attach(out_dir / layout.BUDGET_LOG, trainer.fingerprint, is_main=trainer.dist.is_main)

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if trainer.budget is None:
            return
        speed = end.record["tokens_per_s"] if end.record is not None else None
        trainer.budget.after_step(end.due.step, speed, log=end.due.log)
        trainer.max_steps = trainer.budget.max_steps

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        if trainer.budget is not None:
            result.budget = trainer.budget.summary()


class Metrics(Callback):
    """A log step's record into metrics.jsonl and W&B (the sink writes on rank 0 only)."""

    def __init__(self):
        self.sink: MetricsSink | None = None

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        self.open(trainer, out_dir)

    def open(self, trainer: Trainer, out_dir: Path) -> MetricsSink:
        """metrics.jsonl and samples.jsonl (and the W&B run), opened once, after the resume: the
        records past the step it continues from are dropped (Validation opens it first)."""
        if self.sink is None:
            self.sink = MetricsSink(
                out_dir / layout.METRICS,
                trainer.config.wandb.as_dict() if trainer.config.wandb else {"mode": "disabled"},
                trainer.config.as_dict(),
                enabled=trainer.dist.is_main,
                resume_step=trainer.step,
            )
        return self.sink

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if end.record is not None:
            self.sink.log(end.record)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


class Validation(Callback):
    """At validation steps: validation loss into the record, and the sampler's greedy completions
    (collective: an FSDP forward is) into samples.jsonl, through `metrics`' sink. A run that starts
    from another model's weights (train.init_from) is validated before its first step too."""

    def __init__(self, metrics: Metrics, sampler: Sampler | None):
        self.metrics, self.sampler = metrics, sampler

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        sink = self.metrics.open(trainer, out_dir)
        if trainer.step == 0 and trainer.init_source is not None:  # where the source left off
            self._log_start(trainer, sink)

    def _log_start(self, trainer: Trainer, sink: MetricsSink) -> None:
        """A validation at step 0 in metrics.jsonl (step 0, tokens 0, no training figures): the
        source's last validation, on this run's data."""
        source = trainer.init_source.describe()
        record = {"step": 0, "tokens": 0, "val_loss": trainer.evaluate(), "init_from": source}
        record["val_bpb"] = trainer.bits_per_byte(record["val_loss"], "val")
        samples = trainer.sample(self.sampler)
        if trainer.dist.is_main:
            progress.log_start_validation(record["val_loss"], source)
            sink.log_samples(0, samples)
        sink.log(record)

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
            self.metrics.sink.log_samples(record["step"], samples)


class Checkpoints(Callback):
    """A checkpoint at the steps the cadence saves (every checkpoint_every, the last, a preempted one)
    under out_dir/checkpoints, in train.checkpoint_format (collective); an async save's writing
    overlaps the steps after it, and rank 0 hands each saved checkpoint to the trainer's mirror."""

    def __init__(self):
        self.saver: checkpoint.Saver | None = None

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        train = trainer.train
        self.saver = checkpoint.Saver(
            out_dir / layout.CHECKPOINTS,
            checkpoint_format(train.checkpoint_format, train.parallel),
            train.keep_checkpoints,
            rank=trainer.dist.rank,
            world=trainer.dist.world,
            collective=trainer.dist.grouped,
            async_save=train.async_checkpoint,
            faults=trainer.faults,
            on_saved=trainer.mirror.submit,
            milestone_every=train.keep_checkpoint_every,
        )

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if end.due.save:
            trainer.save_checkpoint(self.saver)

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        self.saver.wait()


class Preemption(Callback):
    """A preemption signal (kiln.train.preemption) ends the run at a step every rank agreed on, once
    every rank has saved it through `checkpoints` (which runs before this): RunStopped(PREEMPTED), exit 75."""

    def __init__(self, checkpoints: Checkpoints):
        self.checkpoints = checkpoints

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if not end.due.preempted:
            return
        saver = self.checkpoints.saver
        saver.wait()  # an async save: this rank's shards written (rank 0: the checkpoint in place)
        barrier(trainer.dist.world)  # rank 0 has written the checkpoint before any rank exits
        raise preemption.stopped(trainer.stop.received, end.due.step, saver.last_checkpoint())


def default_callbacks(sampler: Sampler | None = None, evaluators: Sequence[Callback] = ()) -> list[Callback]:
    """The train stage's callbacks, in order (module docstring); `sampler`'s completions at each
    validation (kiln.train.samples.make_sampler; None: no samples.jsonl rows); `evaluators` run after
    the validation and before the record is written, so what they add to it is logged with it
    (kiln.eval.in_loop)."""
    metrics, checkpoints = Metrics(), Checkpoints()
    return [Budget(), Validation(metrics, sampler), *evaluators, metrics, checkpoints, Preemption(checkpoints)]
