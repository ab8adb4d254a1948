"""A train job killed or preempted, rerun through Snakemake as a user would, continues exactly: the
tiny pipeline on two gloo ranks, 20 steps, a checkpoint every 5, dropout 0.1 (so each rank's RNG
state must be restored), faults injected through KILN_FAULT (kiln.train.faults).

- SIGKILL of every rank at step 13, then a SIGKILL of the save of step 15 (its temp folder is left
  and removed by the next run), then a SIGKILL of rank 0 alone at step 18: each rerun resumes from the
  newest complete checkpoint (10, 10, 15), and the loss of every step and the final weights are
  bitwise those of an uninterrupted run.
- SIGTERM to one rank at step 13: both ranks save step 13, the job exits 75 and the rerun resumes at
  step 14; then SIGUSR1 to torchrun, which passes it to both ranks: the same (both hold at that step
  until it reaches them, so the step saved does not depend on how many steps run meanwhile).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tiny
from safetensors.torch import load_file
from tiny import TINY

# One micro-batch of 8 rows per rank: the global batch of tiny.yaml (1,024 tokens) on two ranks.
OVERRIDES = [
    "train={max_steps: 20, checkpoint_every: 5, log_every: 1, eval_every: 10, nproc_per_node: 2, micro_batch: 8}",
    "model={dropout: 0.1}",
]


def snakemake(workdir: Path, target: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The tiny run to `target` with OVERRIDES, KILN_FAULT set to `fault` (or unset); the train log read
    into the result's train_log."""
    result = tiny.snakemake(
        workdir, target, "--configfile", str(TINY), "--config", *OVERRIDES, env={"KILN_FAULT": fault}, timeout=600
    )
    result.train_log = (workdir / "results" / "tiny" / "logs" / "train.log").read_text()
    return result


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Data stages and smoke of the run, done once."""
    workdir = tmp_path_factory.mktemp("prepared")
    result = tiny.snakemake(
        workdir, "results/tiny/smoke/report.json", "--configfile", str(TINY), "--config", *OVERRIDES, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir


def _fresh(prepared: Path, workdir: Path) -> Path:
    shutil.copytree(prepared / "results", workdir / "results")  # copy2: mtimes kept, nothing reruns
    return workdir


def _train(workdir: Path) -> Path:
    return workdir / "results" / "tiny" / "train"


def _losses(workdir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (_train(workdir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"a step logged twice or out of order: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def _checkpoints(workdir: Path) -> list[str]:
    return sorted(p.name for p in (_train(workdir) / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory) -> Path:
    workdir = _fresh(prepared, tmp_path_factory.mktemp("uninterrupted"))
    result = snakemake(workdir, "results/tiny/train/summary.json")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def _assert_same_as(reference: Path, workdir: Path) -> None:
    want, got = _losses(reference), _losses(workdir)
    assert list(got) == list(range(1, 21)) and got == want  # bitwise: == on floats, steps 11-20 included
    ours, theirs = load_file(_train(workdir) / "model.safetensors"), load_file(_train(reference) / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key].equal(theirs[key]), key


def test_killed_three_times_once_mid_save_the_reruns_match_an_uninterrupted_run(prepared, reference, tmp_path):
    workdir = _fresh(prepared, tmp_path)
    target = "results/tiny/train/summary.json"

    first = snakemake(workdir, target, "sigkill@13")
    assert first.returncode != 0 and re.search(r"Signal 9 \(SIGKILL\) received", first.train_log)
    assert _checkpoints(workdir) == ["LATEST", "step-0000005", "step-0000010"]

    second = snakemake(workdir, target, "kill_in_save@15")
    assert second.returncode != 0 and "resumed from step 10" in second.train_log
    temps = [name for name in _checkpoints(workdir) if name.startswith(".step-0000015.tmp-")]
    assert len(temps) == 1 and (_train(workdir) / "checkpoints" / "LATEST").read_text() == "step-0000010\n"

    third = snakemake(workdir, target, "sigkill@18:0")  # rank 0 alone: rank 1 is left in a collective
    assert third.returncode != 0 and "resumed from step 10" in third.train_log
    assert f"checkpoints/{temps[0]}, left by a writer that died mid-save" in third.train_log
    assert _checkpoints(workdir) == ["LATEST", "step-0000010", "step-0000015"]

    last = snakemake(workdir, target)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "resumed from step 15" in last.train_log
    _assert_same_as(reference, workdir)


def test_a_preempted_train_saves_on_every_rank_exits_75_and_the_rerun_continues(prepared, reference, tmp_path):
    workdir = _fresh(prepared, tmp_path)
    target = "results/tiny/train/summary.json"

    one_rank = snakemake(workdir, target, "sigterm@13:1")  # only rank 1 gets it; both must save step 13
    assert one_rank.returncode != 0 and "returned non-zero exit status 75" in one_rank.stderr
    assert one_rank.train_log.count("every rank saved step 13") == 2
    assert "kiln.train.launch: the ranks exited with code 75 (PREEMPTED)" in one_rank.train_log
    assert "step-0000013" in _checkpoints(workdir) and max(_losses(workdir)) == 13

    # SIGUSR1 to torchrun, which passes it on to both ranks (kiln.train.launch asks it to). Each rank
    # holds at step 16 until the signal has reached it (KILN_FAULT hold): without that, how many steps
    # ran while torchrun passed it on would depend on the machine's speed (a fast one could even reach
    # the last step, which is never a preemption). A rank torchrun did not pass it to would wait there.
    forwarded = snakemake(workdir, target, "sigusr1_parent@16:0,hold@16")
    assert forwarded.returncode != 0 and "returned non-zero exit status 75" in forwarded.stderr
    assert "resumed from step 13" in forwarded.train_log
    saved = int(re.search(r"SIGUSR1: every rank saved step (\d+)", forwarded.train_log).group(1))
    assert saved == 16 and forwarded.train_log.count(f"every rank saved step {saved}") == 2
    assert f"step-{saved:07d}" in _checkpoints(workdir)

    last = snakemake(workdir, target)
    assert last.returncode == 0, last.stderr[-3000:]
    assert f"resumed from step {saved}" in last.train_log
    _assert_same_as(reference, workdir)
