"""What the training loop does after a step (kiln.train.step_actions.Cadence.at) at the edges: plain,
log, checkpoint, validation, last and preempted steps; and how the step reader (kiln.train.step_reader)
learns of a stop signal: at once where the host syncs anyway, one step late in between (the GPU
run-ahead), never by reading a step it has already read."""

from __future__ import annotations

import math

import torch

from kiln.config.train_sections import NonFinite
from kiln.train.health import SpikeDetector
from kiln.train.step_actions import Cadence
from kiln.train.step_reader import StepReader, StepRecord

CADENCE = Cadence(log_every=5, eval_every=10, checkpoint_every=4)


def _at(step: int, max_steps: int = 100, signal: bool = False) -> tuple:
    asked = []

    def stop_requested(synced: bool) -> bool:
        asked.append(synced)
        return signal

    return CADENCE.at(step, max_steps, stop_requested), asked


def test_a_plain_step_does_nothing_and_asks_for_the_stop_flag_without_a_sync():
    due, asked = _at(3)
    assert (due.read, due.log, due.validate, due.save, due.preempted, due.last) == (False,) * 6
    assert asked == [False]


def test_log_and_checkpoint_steps_read_and_ask_for_this_steps_stop_flag():
    log_step, asked_log = _at(5)
    assert (log_step.read, log_step.log, log_step.save, log_step.validate) == (True, True, False, False)
    save_step, asked_save = _at(8)
    assert (save_step.read, save_step.log, save_step.save, save_step.validate) == (True, False, True, False)
    assert asked_log == asked_save == [True]


def test_validation_comes_at_log_steps_that_are_multiples_of_eval_every():
    assert _at(10)[0].validate and _at(20)[0].validate  # log steps, multiples of eval_every (20 also saves)
    assert not _at(15)[0].validate  # a log step, not a multiple of eval_every
    assert not Cadence(log_every=4, eval_every=6, checkpoint_every=100).at(6, 100, lambda synced: False).validate


def test_the_last_step_logs_validates_and_saves_and_is_never_a_preemption():
    due, asked = _at(7, max_steps=7, signal=True)
    assert (due.last, due.read, due.log, due.validate, due.save, due.preempted) == (True, True, True, True, True, False)
    assert asked == []  # the run ends normally: the stop flag is not even read


def test_a_preempted_step_reads_logs_and_saves_then_stops():
    due, _ = _at(3, signal=True)
    assert (due.preempted, due.read, due.log, due.save, due.validate, due.last) == (
        True,
        True,
        True,
        True,
        False,
        False,
    )
    assert _at(10, signal=True)[0].validate  # a preempted step on the validation cadence validates too


def _record(step: int, loss: float = 1.0, stop: bool = False) -> StepRecord:
    return StepRecord(step, torch.tensor(loss), torch.tensor(0.5), torch.tensor([0.0, float(stop)]))


def test_the_reader_sees_a_stop_flag_one_step_late_between_syncs_and_at_once_at_a_sync():
    reader = StepReader(NonFinite.of({"action": "stop", "max_skips": 0}), SpikeDetector(10.0), world=1, is_main=True)
    reader.add(_record(1, stop=True))
    assert not reader.stop_requested(synced=False)  # the newest step is not waited for between syncs
    assert reader.stop_requested(synced=True)
    reader.add(_record(2))
    assert reader.stop_requested(synced=False)  # step 1's flag, one step late
    assert reader.read(lambda: "none") is None and reader.unread == []
    reader.add(_record(3))
    assert not reader.stop_requested(synced=False)  # step 2 was read at the sync: nothing older to look at
    assert reader.read(lambda: "none") is None
    window = reader.take_window()
    assert window.losses == [1.0, 1.0, 1.0] and reader.take_window().losses == []
    assert math.isnan(reader.window.mean_loss())
