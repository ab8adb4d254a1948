"""kiln.train.trainer.run as the train stage calls it (workflow/scripts/train.py): with the stage's
callbacks (kiln.train.callbacks.default_callbacks), so a run writes metrics.jsonl, samples.jsonl,
checkpoints/ and budget.jsonl as a run of the pipeline does."""

from __future__ import annotations

from pathlib import Path

from kiln.config.run_config import RunConfig
from kiln.plan.steps import BudgetPlan
from kiln.train import trainer
from kiln.train.callbacks import default_callbacks
from kiln.train.result import RunResult
from kiln.train.samples import Sampler


def run(
    config: RunConfig,
    shard_dir: Path,
    out_dir: Path,
    *,
    sampler: Sampler | None = None,
    max_steps: int | None = None,
    budget: BudgetPlan | None = None,
) -> RunResult:
    """One run with the train stage's callbacks, `sampler`'s completions at each validation."""
    callbacks = default_callbacks(sampler)
    return trainer.run(config, shard_dir, out_dir, callbacks=callbacks, max_steps=max_steps, budget=budget)
