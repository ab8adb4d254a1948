"""fit's seam (kiln.train.callbacks): a caller's callback sees every step after the train stage's
callbacks have validated, logged and saved it, can change the run's length as the budget does, and
alone (a class with the Protocol's hooks) gets every event in order on a run that trains the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from synthetic import train_sections

from kiln import layout
from kiln.config.run_config import RunConfig
from kiln.train import checkpoint
from kiln.train.callbacks import Callback, StepEnd, default_callbacks
from kiln.train.result import RunResult
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


class Recorder(Callback):
    """What a caller's callback sees at each step, and what was on disk by then."""

    def __init__(self, ckpt_root):
        self.ckpt_root, self.seen, self.ended, self.closed = ckpt_root, [], False, False

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        saved = [step for step, _ in checkpoint.kept(self.ckpt_root)]
        record = None if end.record is None else dict(end.record)
        self.seen.append((end.due.step, trainer.step, record, saved))

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        self.ended = True

    def close(self) -> None:
        self.closed = True


def test_a_callers_callback_sees_each_step_validated_logged_and_saved(shards, tmp_path):
    out = tmp_path / "run"
    recorder = Recorder(out / layout.CHECKPOINTS)
    sections = train_sections(max_steps=8, log_every=2, eval_every=4, checkpoint_every=3)
    result = Trainer(RunConfig.of(sections), shards).fit(out, callbacks=[*default_callbacks(), recorder])

    assert [(due, step) for due, step, _, _ in recorder.seen] == [(s, s) for s in range(1, 9)]
    records = {due: record for due, _, record, _ in recorder.seen if record is not None}
    assert sorted(records) == [2, 4, 6, 8]
    assert [s for s, r in records.items() if "val_loss" in r] == [4, 8]  # Validation ran before it
    written = [json.loads(line) for line in (out / layout.METRICS).read_text().splitlines()]
    assert [r["step"] for r in written] == sorted(records)  # Metrics had written what it saw
    assert [r["val_loss"] for r in written if "val_loss" in r] == [records[4]["val_loss"], records[8]["val_loss"]]
    saved = {due: steps for due, _, _, steps in recorder.seen}
    assert saved[3] == [3] and saved[6] == [3, 6] and saved[8] == [6, 8]  # Checkpoints ran before it (keep 2)
    assert recorder.ended and recorder.closed and result.steps == 8


class StopEarly(Callback):
    """Shortens the run at a step, as train.budget's controller does."""

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if end.due.step == 3:
            trainer.max_steps = 5


def test_a_callback_that_shortens_the_run_gets_the_last_steps_log_and_checkpoint(shards, tmp_path):
    out = tmp_path / "run"
    result = Trainer(RunConfig.of(train_sections(max_steps=20, log_every=2)), shards).fit(
        out, callbacks=[*default_callbacks(), StopEarly()]
    )
    assert result.steps == 5 and result.tokens_seen == 5 * result.tokens_per_step
    assert [json.loads(line)["step"] for line in (out / layout.METRICS).read_text().splitlines()] == [2, 4, 5]
    assert checkpoint.kept(out / layout.CHECKPOINTS)[-1][0] == 5
    assert (out / "model.safetensors").is_file()


class Listener:
    """A caller's own callback: the Protocol's four hooks, nothing inherited."""

    def __init__(self):
        self.events = []

    def before_fit(self, trainer: Trainer, out_dir: Path) -> None:
        self.events.append(("before_fit", trainer.step, out_dir.name))

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        self.events.append(("after_step", end.due.step, end.record is not None))

    def after_fit(self, trainer: Trainer, result: RunResult) -> None:
        self.events.append(("after_fit", result.losses == [], trainer.step))

    def close(self) -> None:
        self.events.append(("close",))


def test_a_callers_own_callback_alone_gets_every_event_in_order_and_the_same_weights(shards, tmp_path):
    """fit knows no callback by name: with only the caller's, it trains the weights the train stage's
    callbacks train (none of them changes the trajectory: validation and checkpoints read the model,
    and Budget, the one that re-plans the steps, does nothing without a budget plan), and writes only
    the final model."""
    sections = train_sections(max_steps=6, log_every=2, eval_every=3, checkpoint_every=3)
    listener: Callback = Listener()
    alone = Trainer(RunConfig.of(sections), shards).fit(tmp_path / "alone", callbacks=[listener])
    stage = Trainer(RunConfig.of(sections), shards).fit(tmp_path / "stage", callbacks=default_callbacks())

    steps = [("after_step", s, s % 2 == 0) for s in range(1, 7)]
    assert listener.events == [("before_fit", 0, "alone"), *steps, ("after_fit", False, 6), ("close",)]
    assert alone.losses == stage.losses and alone.steps == stage.steps == 6
    weights = [load_file(tmp_path / run / "model.safetensors") for run in ("alone", "stage")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # bitwise
    assert sorted(p.name for p in (tmp_path / "alone").iterdir()) == ["model.safetensors", "model_config.json"]
    assert (tmp_path / "stage" / layout.METRICS).is_file() and checkpoint.kept(tmp_path / "stage" / layout.CHECKPOINTS)
