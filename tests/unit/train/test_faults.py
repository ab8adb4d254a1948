"""Faults injected into real training runs through KILN_FAULT (kiln.train.faults), in-process on one
rank: a non-finite loss or gradient is never applied and never saved (stop, or skip up to a cap), a
loss spike is logged and its detector's state survives a resume, a preemption signal saves the step
it lands in and the rerun continues exactly, a held rank waits for that signal however fast it trains,
a full disk mid-save is a clear error; and on two ranks
(torchrun, tests/fault_worker.py) a step non-finite on one rank is skipped by both. Kills and
preemption through Snakemake: test_kill_resume.py."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal as signals
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest
import torch
from synthetic import TINY_MODEL, train_sections, write_shards
from train_stage import run

from kiln.config.run_config import RunConfig
from kiln.errors import ExitCode, KilnError, RunStopped
from kiln.model.build import load_model
from kiln.train import checkpoint, faults, launch
from kiln.train.preemption import StopSignal

pytestmark = pytest.mark.usefixtures("one_thread")
DROPOUT_MODEL = TINY_MODEL | {"dropout": 0.1}  # the RNG state matters on resume


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _state(out: Path, step: int) -> dict:
    return torch.load(out / "checkpoints" / f"step-{step:07d}" / checkpoint.STATE, weights_only=False)


def _all_finite(tensors: dict) -> bool:
    return all(torch.isfinite(t).all() for t in tensors.values() if isinstance(t, torch.Tensor))


def _adam_steps(state: dict) -> set[int]:
    return {int(s["step"]) for s in state["optimizer"]["state"].values()}


def test_a_nan_loss_is_never_applied_nor_saved_and_stops_naming_the_last_good_checkpoint(shards, tmp_path, monkeypatch):
    # The case: checkpoints every 2 steps, log lines every 5, NaN at step 3. The step-4
    # checkpoint would be the first save after it: the run must stop before it.
    monkeypatch.setenv("KILN_FAULT", "nan_loss@3")
    out = tmp_path / "run"
    with pytest.raises(
        RunStopped,
        match=r"step 3: loss nan, .*not finite, so not applied.*"
        r"Last good checkpoint: .*step-0000002, where a rerun resumes",
    ) as stopped:
        run(RunConfig.of(train_sections(max_steps=10, log_every=5, checkpoint_every=2)), shards, out)
    assert stopped.value.exit_code == ExitCode.NONFINITE == 76
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [checkpoint.MARKER, "step-0000002"]
    saved = _state(out, 2)
    assert _all_finite(saved["model"]) and _adam_steps(saved) == {2}
    # The rerun (the fault gone) resumes from the last good checkpoint and finishes.
    monkeypatch.delenv("KILN_FAULT")
    run(RunConfig.of(train_sections(max_steps=10, log_every=5, checkpoint_every=2)), shards, out)
    assert [r["step"] for r in _records(out)] == [5, 10] and _all_finite(load_model(out).state_dict())


def test_skip_mode_drops_non_finite_steps_and_applies_the_rest(shards, tmp_path, monkeypatch):
    # A NaN loss, then a finite loss with an infinite gradient: neither update is applied (Adam's
    # step count says so: the fused update is skipped whole), the run goes on and logs them.
    monkeypatch.setenv("KILN_FAULT", "nan_loss@3,inf_grad@6")
    out = tmp_path / "run"
    sections = train_sections(
        max_steps=10, log_every=5, checkpoint_every=10, nonfinite={"action": "skip", "max_skips": 2}
    )
    result = run(RunConfig.of(sections), shards, out)
    records = _records(out)
    assert [(r["step"], r.get("skipped_steps")) for r in records] == [(5, [3]), (10, [6])]
    assert all(math.isfinite(r["loss"]) for r in records) and result.losses == [r["loss"] for r in records]
    final = _state(out, 10)
    assert final["skipped"] == 2 and _adam_steps(final) == {8}
    assert _all_finite(final["model"]) and _all_finite(load_model(out).state_dict())


def test_skip_mode_stops_past_max_skips(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_FAULT", "nan_loss@3,inf_grad@4")
    sections = train_sections(
        max_steps=10, log_every=5, checkpoint_every=2, nonfinite={"action": "skip", "max_skips": 1}
    )
    with pytest.raises(
        RunStopped, match=r"step 4: .*2 batches skipped, more than train.nonfinite.max_skips 1.*step-0000002"
    ):
        run(RunConfig.of(sections), shards, tmp_path / "run")


def test_a_loss_spike_is_logged_and_its_detector_survives_a_resume(shards, tmp_path, monkeypatch, caplog):
    sections = train_sections(max_steps=20, log_every=5, checkpoint_every=10)
    run(RunConfig.of(sections), shards, tmp_path / "plain")
    assert not any("spike_steps" in r for r in _records(tmp_path / "plain"))  # no false alarm
    monkeypatch.setenv("KILN_FAULT", "spike@12")
    full = tmp_path / "full"
    run(RunConfig.of(sections), shards, full)
    assert [r["step"] for r in _records(full) if r.get("spike_steps") == [12]] == [15]
    assert "step 12: loss spike:" in caplog.text and "the running average" in caplog.text
    # Resumed from step 10, the detector has its running average (a fresh one would still be
    # warming up at step 12 and miss the spike), and ends where the uninterrupted run's did.
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoints" / "step-0000010", resumed / "checkpoints" / "step-0000010")
    run(RunConfig.of(sections), shards, resumed)
    assert [(r["step"], r.get("spike_steps")) for r in _records(resumed)] == [(15, [12]), (20, None)]
    assert _state(resumed, 20)["spikes"] == _state(full, 20)["spikes"]
    assert _state(full, 10)["spikes"]["seen"] == 10


@pytest.mark.parametrize("signal", ["sigterm", "sigusr1"])
def test_a_preemption_signal_saves_that_step_and_the_rerun_continues_exactly(shards, tmp_path, monkeypatch, signal):
    sections = train_sections(model=DROPOUT_MODEL, max_steps=12, log_every=1, checkpoint_every=10)
    run(RunConfig.of(sections), shards, tmp_path / "full")
    out = tmp_path / "preempted"
    monkeypatch.setenv("KILN_FAULT", f"{signal}@7")
    with pytest.raises(
        RunStopped, match=rf"{signal.upper()}: every rank saved step 7 .*step-0000007.*from step 8"
    ) as stopped:
        run(RunConfig.of(sections), shards, out)
    assert stopped.value.exit_code == ExitCode.PREEMPTED == 75
    assert [r["step"] for r in _records(out)] == list(range(1, 8))
    monkeypatch.delenv("KILN_FAULT")
    result = run(RunConfig.of(sections), shards, out)
    assert len(result.losses) == 5  # steps 8-12 only
    assert [r["loss"] for r in _records(out)] == [r["loss"] for r in _records(tmp_path / "full")]
    for key, value in load_model(tmp_path / "full").state_dict().items():
        assert torch.equal(load_model(out).state_dict()[key], value), key


def test_hold_waits_at_its_step_until_a_preemption_signal_has_arrived():
    held, stop = faults.parse("hold@3", 0), StopSignal()
    assert faults.parse("hold@3:1", 0) == faults.NONE  # another rank's
    other_step = threading.Thread(target=held.before_step, args=(2, stop), daemon=True)
    other_step.start()
    other_step.join(timeout=10)
    assert not other_step.is_alive(), "hold@3 waited at step 2"
    signalled = threading.Timer(0.5, setattr, (stop, "received", "SIGTERM"))
    start = time.monotonic()
    signalled.start()
    held.before_step(3, stop)
    assert stop.received == "SIGTERM" and time.monotonic() - start >= 0.5  # returned only once signalled
    held.before_step(3, stop)  # signalled already: goes on at once


def test_a_held_run_waits_for_the_signal_then_saves_that_step(shards, tmp_path, monkeypatch):
    # The signal is sent only once the rank sleeps in hold (so the test does not depend on how fast
    # the steps before it run); without hold in Trainer.fit none is sent and the run finishes.
    sleeping = threading.Event()

    def sleep(seconds: float) -> None:
        sleeping.set()
        time.sleep(seconds)

    def preempt() -> None:
        if sleeping.wait(timeout=300):
            os.kill(os.getpid(), signals.SIGUSR1)

    monkeypatch.setattr(faults, "time", types.SimpleNamespace(sleep=sleep))
    monkeypatch.setenv("KILN_FAULT", "hold@4")
    sender = threading.Thread(target=preempt, daemon=True)
    sender.start()
    out = tmp_path / "run"
    with pytest.raises(RunStopped, match=r"SIGUSR1: every rank saved step 4 .*step-0000004.*from step 5") as stopped:
        run(RunConfig.of(train_sections(max_steps=12, log_every=1, checkpoint_every=10)), shards, out)
    sender.join(timeout=10)
    assert stopped.value.exit_code == ExitCode.PREEMPTED
    assert [r["step"] for r in _records(out)] == [1, 2, 3, 4]
    # The rerun starts at step 5, after the held step: the same KILN_FAULT does not hold it again.
    monkeypatch.setattr(faults, "time", time)
    run(RunConfig.of(train_sections(max_steps=12, log_every=1, checkpoint_every=10)), shards, out)
    assert [r["step"] for r in _records(out)] == list(range(1, 13))


def test_a_full_disk_while_checkpointing_is_a_clear_error_and_the_previous_checkpoint_stays(
    shards, tmp_path, monkeypatch
):
    monkeypatch.setenv("KILN_FAULT", "enospc@4")
    out = tmp_path / "run"
    with pytest.raises(KilnError, match=r"step-0000004: no space left on the device") as failed:
        run(RunConfig.of(train_sections(max_steps=6, log_every=2, checkpoint_every=2)), shards, out)
    assert failed.value.exit_code == ExitCode.ERROR
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [checkpoint.MARKER, "step-0000002"]
    assert checkpoint.load_latest(out / "checkpoints", _state(out, 2)["fingerprint"])["step"] == 2


def test_a_malformed_fault_spec_names_the_variable(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_FAULT", "nan@3")
    with pytest.raises(KilnError, match=r"KILN_FAULT: 'nan@3' is not kind@step\[:rank\] .* with kind one of nan_loss"):
        run(RunConfig.of(train_sections(max_steps=3)), shards, tmp_path / "run")
    with pytest.raises(KilnError, match=r"kind one of nan_loss, .*, enospc, hold, oom, stall$"):
        faults.parse("hold@3,wait@4", 0)


def test_a_stall_sleeps_its_own_seconds_on_the_ranks_it_names():
    """stall@step[:seconds[:rank]]: the seconds default to STALL_S, the rank to every rank."""
    assert faults.parse("stall@4", 1).stall_s == ((4, faults.STALL_S),)
    assert faults.parse("stall@20:30,stall@9:0.5:1", 1).stall_s == ((9, 0.5), (20, 30.0))
    assert faults.parse("stall@9:0.5:1", 0).stall_s == ()
    stalled = faults.parse("stall@2:0.3", 0)
    start = time.perf_counter()
    stalled.before_step(1, stop=None)
    stalled.before_step(2, stop=None)
    assert 0.3 <= time.perf_counter() - start < 3
    with pytest.raises(KilnError, match="stall@step"):
        faults.parse("stall@2:x", 0)


@pytest.mark.process
def test_on_two_ranks_a_step_non_finite_on_one_rank_is_skipped_by_both(tmp_path):
    """DDP and FSDP2 under torchrun (gloo): a NaN loss on rank 1 only, then an infinite gradient on rank
    0 only; every rank skips both updates (the flag is agreed on the device), so the ranks' weights
    stay identical and finite, and Adam took 4 of the 6 steps."""
    write_shards(tmp_path / "shards")
    argv = launch.command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": ""},
        [str(Path(__file__).parents[2].joinpath("fault_worker.py")), str(tmp_path)],
    )
    path = os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = json.loads((tmp_path / "result.json").read_text())
    for strategy, run_ in runs.items():
        first, second = run_["ranks"]
        assert first == second and first["finite"] and first["skipped"] == 2, strategy
        assert run_["adam_steps"] == [4] and all(math.isfinite(x) for x in run_["losses"]), strategy
