"""A budgeted train run killed after it re-planned its steps resumes bitwise equal to an uninterrupted
one (kiln.train.budget): the kill is real (KILN_FAULT sigkill, the whole process), the decisions are
made from the run's own measured speed, and the resumed run must replay them, the checkpoint's and the
ones recorded in train/budget.jsonl after it, rather than decide again.

The uninterrupted run to compare with cannot measure the same speeds, so it is given the killed run's
final decision log before it starts: a run that starts from step 0 over a log of its own trajectory
replays it (as an attempt killed before its first checkpoint does), so it follows the same steps and
schedule from the first step. If a resume re-decided what was recorded, or lost the checkpoint's
decisions, the killed run's log would not be a prefix of its final one, or its LR, losses and weights
would differ from the comparison's.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

from budget_worker import run_worker
from safetensors.torch import load_file
from synthetic import write_shards

from kiln import layout


def decisions(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / layout.BUDGET_LOG).read_text().splitlines()]


def metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (out / layout.METRICS).read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"a step logged twice or out of order: {steps}"
    return {r["step"]: (r["loss"], r["lr"]) for r in rows}


def test_a_budgeted_run_killed_after_its_decisions_resumes_bitwise_equal_to_an_uninterrupted_one(tmp_path):
    shards = write_shards(tmp_path / "shards")
    killed = tmp_path / "killed"

    first = run_worker(shards, killed, "sigkill@15")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    before = (killed / layout.BUDGET_LOG).read_text()
    made = decisions(killed)
    assert [d["step"] for d in made] == list(range(4, 15, 2))  # every log step after the first window
    assert any(d["max_steps"] != d["previous"] for d in made)  # it re-planned from its own speed
    assert sorted(p.name for p in (killed / "checkpoints").glob("step-*")) == ["step-0000010"]

    again = run_worker(shards, killed)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 10" in again.stderr
    after = (killed / layout.BUDGET_LOG).read_text()
    assert after.startswith(before) and len(after) > len(before)  # steps 12 and 14 replayed, not re-decided
    summary_steps = max(metrics(killed))

    whole = tmp_path / "uninterrupted"
    whole.mkdir()
    shutil.copy(killed / layout.BUDGET_LOG, whole / layout.BUDGET_LOG)
    reference = run_worker(shards, whole)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert (whole / layout.BUDGET_LOG).read_text() == after  # it decided nothing of its own

    assert metrics(whole) == metrics(killed)  # every log step's loss and LR, bitwise
    assert summary_steps == decisions(killed)[-1]["max_steps"] or summary_steps > decisions(killed)[-1]["step"]
    ours, theirs = load_file(killed / "model.safetensors"), load_file(whole / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key].equal(theirs[key]), key
