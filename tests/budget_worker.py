"""Run by test_budget_resume.py and test_budget_stalls.py in a process of its own: one budgeted train run
(kiln.train.trainer.run, as the train stage calls it) on the synthetic shards, so KILN_FAULT's sigkill
kills the whole process and its stall stalls the run. Writes OUT/summary.json: the run's steps, its
cooldown's start and the budget's summary (kiln.train.budget).

    python tests/budget_worker.py SHARDS OUT ['{"budget_s": 24, "train": {"schedule": "wsd"}}']
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch
from synthetic import train_sections
from train_stage import run

from kiln.config.run_config import RunConfig
from kiln.plan.steps import BudgetPlan, StageTimes
from kiln.train.budget import final_summary

# Of this process's training (no launcher: from the trainer's creation). The test kills the run at
# step 15: a budget this size still buys 20+ steps where start-up, steps and saves are ~20x slower
# than alone (a 7-s budget once bought 17 steps on a loaded machine).
BUDGET_S = 12.0
PLANNED = 400  # what a smoke stage would have planned; the run re-plans from its own speed at once
TIMES = StageTimes(step_s=0.01, startup_s=0.5, validation_s=0.02, checkpoint_s=0.02)


def run_worker(
    shards: Path, out: Path, fault: str | None = None, options: dict | None = None
) -> subprocess.CompletedProcess:
    """This script in a process of its own (KILN_FAULT set to `fault`, none inherited), output captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_FAULT", "KILN_LAUNCH_START")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    if fault:
        env["KILN_FAULT"] = fault
    argv = [sys.executable, __file__, str(shards), str(out), *([json.dumps(options)] if options else [])]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    shards, out = Path(sys.argv[1]), Path(sys.argv[2])
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    budget_s = options.get("budget_s", BUDGET_S)
    train = dict(log_every=2, eval_every=20, checkpoint_every=10, keep_checkpoints=2) | options.get("train", {})
    sections = train_sections(max_steps=None, budget={"minutes": budget_s / 60}, **train)
    plan = BudgetPlan(budget_s, TIMES, final_s=0.02)
    result = run(RunConfig.of(sections), shards, out, max_steps=PLANNED, budget=plan)
    summary = {"steps": result.steps, "cooldown_from": result.cooldown_from, **final_summary(result.budget)}
    (out / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
