"""Run by test_budget_resume.py in a process of its own: one budgeted train run (kiln.train.trainer.run,
as the train stage calls it) on the synthetic shards, so KILN_FAULT's sigkill kills the whole process.

    python tests/budget_worker.py SHARDS OUT
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from synthetic import train_sections
from train_stage import run

from kiln.config.run_config import RunConfig
from kiln.plan.steps import BudgetPlan, StageTimes

# Of this process's training (no launcher: from the trainer's creation). The test kills the run at
# step 15: a budget this size still buys 20+ steps where start-up, steps and saves are ~20x slower
# than alone (a 7-s budget once bought 17 steps on a loaded machine).
BUDGET_S = 12.0
PLANNED = 400  # what a smoke stage would have planned; the run re-plans from its own speed at once
TIMES = StageTimes(step_s=0.01, startup_s=0.5, validation_s=0.02, checkpoint_s=0.02)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    shards, out = Path(sys.argv[1]), Path(sys.argv[2])
    sections = train_sections(
        max_steps=None,
        budget={"minutes": BUDGET_S / 60},
        log_every=2,
        eval_every=20,
        checkpoint_every=10,
        keep_checkpoints=2,
    )
    run(RunConfig.of(sections), shards, out, max_steps=PLANNED, budget=BudgetPlan(BUDGET_S, TIMES, final_s=0.02))


if __name__ == "__main__":
    main()
