"""The checkpoint layout (kiln.train.checkpoint) against what kills, full disks and lost or torn files
leave behind: the newest complete checkpoint is found without LATEST, a torn or unreadable one is
skipped for the one before it (an error when asked for by name), pruning never removes the newest
complete one, a save is fsynced before LATEST moves, and a kill or ENOSPC mid-save leaves the
previous checkpoint intact. Small states (no model), so every test runs in well under a second but
the SIGKILL one, which needs a process to kill."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kiln.errors import KilnError
from kiln.io import sha256_file
from kiln.train import checkpoint, faults

REPO = Path(__file__).resolve().parents[3]


def _save(root: Path, step: int, keep: int = 5, fault: str = "") -> Path:
    state = {"step": step, "fingerprint": "f", "model": {"w": torch.full((64,), float(step))}, "tokens_seen": step}
    return checkpoint.save(root, state, keep=keep, faults=faults.parse(fault, 0))


def _dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _marker(root: Path) -> str:
    return (root / checkpoint.MARKER).read_text().strip()


def test_newest_complete_checkpoint_is_found_without_latest(tmp_path):
    for step in (2, 4):
        _save(tmp_path, step)
    (tmp_path / checkpoint.MARKER).unlink()  # lost
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 4
    (tmp_path / checkpoint.MARKER).write_text("step-0000002\n")  # killed before LATEST moved to step 4
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 4
    (tmp_path / checkpoint.MARKER).write_text("step-0000077\n")  # names nothing
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 4
    # A folder without complete.json never finished (or was copied in part): not a checkpoint.
    (tmp_path / "step-0000009").mkdir()
    torch.save({"step": 9, "fingerprint": "f"}, tmp_path / "step-0000009" / checkpoint.STATE)
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 4
    # Nor is a checkpoint under another step's name.
    shutil.copytree(tmp_path / "step-0000002", tmp_path / "step-0000006")
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 4
    assert [step for step, _ in checkpoint.kept(tmp_path)] == [2, 4]


@pytest.mark.parametrize("damage", ["truncated", "byte flipped", "not a checkpoint", "manifest torn", "file gone"])
def test_a_torn_or_unreadable_newest_is_skipped_for_the_one_before(tmp_path, caplog, damage):
    for step in (2, 4):
        _save(tmp_path, step)
    newest = tmp_path / "step-0000004"
    state = newest / checkpoint.STATE
    data = state.read_bytes()
    if damage == "truncated":
        state.write_bytes(data[: len(data) // 2])
    elif damage == "byte flipped":
        state.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "not a checkpoint":  # the manifest matches the file, which does not load
        state.write_bytes(b"\x00" * len(data))
        manifest = json.loads((newest / checkpoint.MANIFEST).read_text())
        manifest["files"][checkpoint.STATE]["sha256"] = sha256_file(state)
        (newest / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    elif damage == "manifest torn":
        (newest / checkpoint.MANIFEST).write_text('{"step": 4, "fi')
    else:
        state.unlink()
    with caplog.at_level(logging.WARNING, logger="kiln.checkpoint"):
        assert checkpoint.load_latest(tmp_path, "f")["step"] == 2
    assert f"checkpoint {newest} skipped" in caplog.text and "trying the one before it" in caplog.text
    # Asked for by name, it is an error naming it, never a silent fallback.
    with pytest.raises(KilnError, match=rf"{newest}: the checkpoint asked for \(KILN_RESUME_FROM\) is unusable"):
        checkpoint.load_latest(tmp_path, "f", requested="step-0000004")
    assert checkpoint.load_latest(tmp_path, "f", requested=tmp_path / "step-0000002")["step"] == 2
    # The next save prunes the unreadable folder past it, and keeps step 2 (then the newest).
    _save(tmp_path, 3, keep=1)
    assert _dirs(tmp_path) == ["step-0000003"] and _marker(tmp_path) == "step-0000003"


def test_when_no_checkpoint_reads_it_is_an_error_not_a_fresh_start(tmp_path, caplog):
    (tmp_path / "step-0000001").mkdir()  # never finished (no complete.json): nothing to resume from
    assert checkpoint.load_latest(tmp_path, "f") is None
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    (tmp_path / "step-0000002" / checkpoint.STATE).write_bytes(b"x" * 10)
    state = tmp_path / "step-0000004" / checkpoint.STATE
    data = state.read_bytes()
    state.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    # The run did save, and none of it reads: never silently replaced by step 0.
    with pytest.raises(KilnError, match=r"no checkpoint there reads \(step-0000004, step-0000002: see the warnings"):
        checkpoint.load_latest(tmp_path, "f")
    assert "step-0000001 skipped: no complete.json (never finished)" in caplog.text


def test_another_runs_checkpoint_is_an_error(tmp_path):
    _save(tmp_path, 2)
    with pytest.raises(KilnError, match="fingerprint"):
        checkpoint.load_latest(tmp_path, "another run")


def test_pruning_never_removes_the_newest_complete_checkpoint(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
        assert _marker(tmp_path) == f"step-{step:07d}"
        assert checkpoint.load_latest(tmp_path, "f")["step"] == step
    assert _dirs(tmp_path) == ["step-0000003", "step-0000004"]
    # A torn folder does not count among the `keep` newest: the complete ones do.
    (tmp_path / "step-0000004" / checkpoint.STATE).write_bytes(b"torn")
    _save(tmp_path, 5, keep=2)  # (a run resumed from 3 would be here)
    assert _dirs(tmp_path) == ["step-0000003", "step-0000005"]
    # A rollback (KILN_RESUME_FROM) to step 3 discards the history after it once it saves.
    _save(tmp_path, 4, keep=5)
    assert _dirs(tmp_path) == ["step-0000003", "step-0000004"]


def test_pruning_keeps_milestones_besides_the_newest(tmp_path):
    """train.keep_checkpoint_every: every checkpoint at a multiple of it stays, besides the newest
    `keep`; a milestone past the one just written (a discarded history) goes like any other."""
    for step in range(10, 70, 10):
        state = {"step": step, "fingerprint": "f", "tokens_seen": step}
        checkpoint.save(tmp_path, state, keep=2, faults=faults.NONE, milestone_every=20)
    assert _dirs(tmp_path) == ["step-0000020", "step-0000040", "step-0000050", "step-0000060"]
    saver = checkpoint.Saver(tmp_path, "full", 2, rank=0, world=1, milestone_every=20)  # what train builds
    saver.save({"step": 70, "fingerprint": "f", "tokens_seen": 70})
    assert _dirs(tmp_path) == ["step-0000020", "step-0000040", "step-0000060", "step-0000070"]
    # a rollback to step 30 (KILN_RESUME_FROM) discards the history after it, milestones too
    checkpoint.save(tmp_path, {"step": 30, "fingerprint": "f", "tokens_seen": 30}, keep=2, milestone_every=20)
    assert _dirs(tmp_path) == ["step-0000020", "step-0000030"]
    # without milestones, only the newest `keep`
    checkpoint.save(tmp_path, {"step": 40, "fingerprint": "f", "tokens_seen": 40}, keep=1)
    assert _dirs(tmp_path) == ["step-0000040"]


def test_a_full_disk_mid_save_is_a_clear_error_and_leaves_the_previous_checkpoint(tmp_path):
    _save(tmp_path, 2)
    before = (tmp_path / "step-0000002" / checkpoint.STATE).read_bytes()
    with pytest.raises(KilnError, match=r"step-0000003: no space left on the device .* nothing was replaced"):
        _save(tmp_path, 3, fault="enospc@3")
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.MARKER, "step-0000002"]  # no temp
    assert _marker(tmp_path) == "step-0000002"
    assert (tmp_path / "step-0000002" / checkpoint.STATE).read_bytes() == before
    assert checkpoint.load_latest(tmp_path, "f")["step"] == 2


def test_a_kill_mid_save_leaves_the_previous_checkpoint_and_a_temp_the_next_run_removes(tmp_path):
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_checkpoint import _save; "
        f"from pathlib import Path; _save(Path({str(tmp_path)!r}), 2); _save(Path({str(tmp_path)!r}), 3, fault='kill_in_save@3')"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(".step-0000003.tmp-")]
    assert len(temps) == 1 and (temps[0] / checkpoint.STATE).is_file()  # the half-done save
    assert temps[0].name.endswith(f"-{socket.gethostname()}-{temps[0].name.rsplit('-', 1)[1]}")
    assert _marker(tmp_path) == "step-0000002" and checkpoint.load_latest(tmp_path, "f")["step"] == 2
    checkpoint.remove_dead_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.MARKER, "step-0000002"]


def test_files_and_folder_are_fsynced_before_latest_moves(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _save(tmp_path, 2)
    monkeypatch.undo()
    folder, marker = str(tmp_path / "step-0000002"), str(tmp_path / checkpoint.MARKER)
    renamed, moved = events.index(("replace", folder)), events.index(("replace", marker))
    synced_before = [path for kind, path in events[:renamed] if kind == "fsync"]
    for name in (checkpoint.STATE, checkpoint.MANIFEST):  # inside the temp folder, before its rename
        assert any(".step-0000002.tmp-" in p and p.endswith(name) for p in synced_before), name
    assert events[renamed + 1] == ("fsync", str(tmp_path))  # the rename itself, before LATEST moves
    assert moved > renamed + 1 and events[moved + 1] == ("fsync", str(tmp_path))


def test_load_weights_of_a_torn_checkpoint_names_it(tmp_path):
    folder = _save(tmp_path, 2)
    weights, at = checkpoint.load_weights(folder)
    assert at == {"step": 2, "tokens": 2}
    (folder / checkpoint.STATE).write_bytes(b"torn")
    with pytest.raises(KilnError, match=rf"{folder}: checkpoint unusable: state.pt is 4 bytes"):
        checkpoint.load_weights(folder)


def _save_sharded(root: Path, step: int, async_save: bool = False, fault: str = "", keep: int = 5) -> Path:
    """A sharded checkpoint from one process (no process group): state.pt without model or optimizer,
    the tensors through DCP."""
    saver = checkpoint.Saver(
        root, "sharded", keep, rank=0, world=1, async_save=async_save, faults=faults.parse(fault, 0)
    )
    weights = {"w": torch.full((64,), float(step))}
    saver.save(
        {"step": step, "fingerprint": "f", "tokens_seen": step},
        {"model": weights, "optimizer": {"state": {"w": {"exp_avg": torch.ones(64)}}}},
    )
    weights["w"].fill_(-1.0)  # training goes on: an async save wrote the copy taken at the save
    saver.wait()
    return root / checkpoint.step_name(step)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_sharded_checkpoint_lists_its_shards_and_reads_back(tmp_path, async_save):
    folder = _save_sharded(tmp_path, 2, async_save)
    files = json.loads((folder / checkpoint.MANIFEST).read_text())["files"]
    assert sorted(files) == [f"{checkpoint.SHARDS}/.metadata", f"{checkpoint.SHARDS}/__0_0.distcp", checkpoint.STATE]
    assert _marker(tmp_path) == "step-0000002" and [s for s, _ in checkpoint.kept(tmp_path)] == [2]
    state = checkpoint.load_latest(tmp_path, "f")
    assert "model" not in state and state[checkpoint.SHARDS] == folder / checkpoint.SHARDS
    into = {"model": {"w": torch.zeros(64)}, "optimizer": {"state": {"w": {"exp_avg": torch.zeros(64)}}}}
    checkpoint.read_shards(state[checkpoint.SHARDS], into)
    assert into["model"]["w"].eq(2.0).all() and into["optimizer"]["state"]["w"]["exp_avg"].eq(1.0).all()
    weights, at = checkpoint.load_weights(folder)  # eval: the model's entries only, whole
    assert list(weights) == ["w"] and weights["w"].eq(2.0).all() and at == {"step": 2, "tokens": 2}


@pytest.mark.parametrize("damage", ["shard truncated", "shard byte flipped", "index gone"])
def test_a_torn_sharded_checkpoint_is_skipped_for_the_one_before(tmp_path, caplog, damage):
    _save_sharded(tmp_path, 2)
    newest = _save_sharded(tmp_path, 4)
    shard = newest / checkpoint.SHARDS / "__0_0.distcp"
    data = shard.read_bytes()
    if damage == "shard truncated":
        shard.write_bytes(data[:-8])
    elif damage == "shard byte flipped":
        shard.write_bytes(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])
    else:
        (newest / checkpoint.SHARDS / ".metadata").unlink()
    with caplog.at_level(logging.WARNING, logger="kiln.checkpoint"):
        assert checkpoint.load_latest(tmp_path, "f")["step"] == 2
    assert f"checkpoint {newest} skipped" in caplog.text


def test_a_kill_while_an_async_save_is_in_flight_leaves_the_previous_checkpoint(tmp_path):
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_checkpoint import _save_sharded; "
        f"from pathlib import Path; root = Path({str(tmp_path)!r}); _save_sharded(root, 2, True); "
        f"_save_sharded(root, 3, True, fault='kill_in_save@3')"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(".step-0000003.tmp-")]
    assert len(temps) == 1 and (temps[0] / checkpoint.SHARDS / "__0_0.distcp").is_file()  # shards written
    assert not (temps[0] / checkpoint.MANIFEST).exists()
    assert _marker(tmp_path) == "step-0000002" and checkpoint.load_latest(tmp_path, "f")["step"] == 2
    checkpoint.remove_dead_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.MARKER, "step-0000002"]
