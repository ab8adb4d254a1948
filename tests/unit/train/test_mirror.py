"""train.checkpoint_mirror (kiln.train.mirror): every complete checkpoint copied off the node in the
background, never a partial one under a checkpoint's name, and a failing target reported without
stopping training. Tiny in-process runs (tests/synthetic.py) with a local folder or a shell command
as the target."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from synthetic import train_sections
from train_stage import run

from kiln import layout
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.train import checkpoint, faults
from kiln.train.mirror import Mirror

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)
STEPS = (5, 10, 15, 20)


def mirrored(setting: str) -> TrainSection:
    """A validated train section with train.checkpoint_mirror set."""
    return TrainSection.of(train_sections(checkpoint_mirror=setting)["train"])


def _entries(train_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (train_dir / layout.MIRROR_LOG).read_text().splitlines()]


def _same_weights(a: Path, b: Path) -> None:
    (wa, ma), (wb, mb) = checkpoint.load_weights(a), checkpoint.load_weights(b)
    assert ma == mb and wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["full", "sharded-async"])
def test_every_complete_checkpoint_is_mirrored_whole_and_loads(shards, tmp_path, fmt):
    """keep_checkpoints 1 prunes each checkpoint at the next save, while its copy may still run: the
    mirror keeps them all. The async sharded save hands the checkpoint over from its own thread."""
    extra = {"checkpoint_format": "sharded", "async_checkpoint": True} if fmt == "sharded-async" else {}
    out = tmp_path / "my-run" / "train"
    result = run(
        RunConfig.of(
            train_sections(checkpoint_every=5, keep_checkpoints=1, checkpoint_mirror=str(tmp_path / "mirror"), **extra)
        ),
        shards,
        out,
    )
    assert result.steps == 20 and result.mirror_failures == 0
    mirror = tmp_path / "mirror" / "my-run"  # <folder>/<run>/
    entries = _entries(out)
    copied = [e["name"] for e in entries if e["ok"]]
    skipped = [e["name"] for e in entries if e.get("skipped")]  # one arrived before its predecessor's copy began
    assert sorted(copied + skipped) == [checkpoint.step_name(s) for s in STEPS] and checkpoint.step_name(20) in copied
    # Each copy is whole (complete.json matches every file) and nothing else is there: no temporary left.
    assert [folder.name for _, folder in checkpoint.kept(mirror)] == copied
    assert sorted(p.name for p in mirror.iterdir()) == sorted(copied + [checkpoint.MARKER])
    assert (mirror / checkpoint.MARKER).read_text().strip() == checkpoint.step_name(20)
    assert [p.name for p in (out / layout.CHECKPOINTS).glob("step-*")] == [checkpoint.step_name(20)]  # pruned here
    _same_weights(mirror / checkpoint.step_name(20), out / layout.CHECKPOINTS / checkpoint.step_name(20))
    assert not list(out.glob(".mirror-*"))  # the hard-linked snapshots are gone


def test_a_mirror_command_gets_each_checkpoint_folder(shards, tmp_path):
    dest = tmp_path / "remote dir"  # a space: the placeholders are shell-quoted
    dest.mkdir()
    command = f"cp -R {{src}} '{dest}'/{{run}}-{{name}}"
    out = tmp_path / "cmd-run" / "train"
    result = run(RunConfig.of(train_sections(checkpoint_every=10, checkpoint_mirror=command)), shards, out)
    assert result.mirror_failures == 0
    final = dest / f"cmd-run-{checkpoint.step_name(20)}"
    _same_weights(final, out / layout.CHECKPOINTS / checkpoint.step_name(20))


@pytest.mark.parametrize("target", ["folder under a file", "command exiting 1"])
def test_a_failing_mirror_leaves_training_finished_and_reports_it(shards, tmp_path, caplog, target):
    (tmp_path / "a-file").write_text("not a folder")
    setting = (
        str(tmp_path / "a-file" / "mirror")
        if target == "folder under a file"
        else "test -d {src} && echo quota exceeded on {name} >&2; exit 1"
    )
    out = tmp_path / "run" / "train"
    with caplog.at_level(logging.WARNING, logger="kiln.train"):
        result = run(RunConfig.of(train_sections(checkpoint_every=10, checkpoint_mirror=setting)), shards, out)
    assert result.steps == 20 and (out / "model.safetensors").is_file()
    assert checkpoint.kept(out / layout.CHECKPOINTS)[-1][0] == 20  # the node's checkpoints are intact
    failed = [e for e in _entries(out) if not e["ok"] and not e.get("skipped")]
    assert failed and failed[-1]["name"] == checkpoint.step_name(20)
    assert result.mirror_failures == len(failed)
    assert any("NOT copied" in r.getMessage() and "training goes on" in r.getMessage() for r in caplog.records)
    if target == "command exiting 1":
        assert "exited with status 1: quota exceeded on step-0000020" in failed[-1]["error"]
    else:
        assert not (tmp_path / "a-file").is_dir()


def _save(root: Path, step: int) -> Path:
    state = {"step": step, "fingerprint": "f", "model": {"w": torch.full((8,), float(step))}, "tokens_seen": step}
    return checkpoint.save(root, state, keep=5, faults=faults.NONE)


def test_the_next_job_copies_the_newest_checkpoint_a_stopped_job_did_not(tmp_path):
    """A preempted job does not wait for its copy; the next one's catch_up copies the newest
    checkpoint unless mirror.jsonl shows it copied."""
    train_dir = tmp_path / "run" / "train"
    root = train_dir / layout.CHECKPOINTS
    _save(root, 1)
    _save(root, 2)
    first = Mirror.of(mirrored(str(tmp_path / "m")), train_dir, rank=0)
    first.catch_up(root)
    assert first.close(60)
    assert [f.name for _, f in checkpoint.kept(tmp_path / "m" / "run")] == ["step-0000002"]
    again = Mirror.of(mirrored(str(tmp_path / "m")), train_dir, rank=0)
    again.catch_up(root)  # already there: nothing to do
    assert again.close(60) and len(_entries(train_dir)) == 1
    assert not Mirror.of(mirrored(str(tmp_path / "m")), train_dir, rank=1).enabled


@pytest.mark.parametrize(
    "setting,match",
    [
        (
            "rclone copy {src} remote:{step}",
            r"train.checkpoint_mirror: .* placeholders can only be \{name\} and \{run\}",
        ),
        ("/backup/{run}", r"train.checkpoint_mirror: .* has a placeholder but no \{src\}"),
    ],
)
def test_a_bad_mirror_setting_is_a_clear_error(tmp_path, setting, match):
    with pytest.raises(KilnError, match=match):
        Mirror.of(mirrored(setting), tmp_path / "train", rank=0)
