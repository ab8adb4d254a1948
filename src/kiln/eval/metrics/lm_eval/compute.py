"""lm-eval results by task (kiln.eval.lm_tasks), through lm-eval's own copy of the final model; the
local tasks' YAMLs go in the eval folder, naming the eval_data stage's files. A task that cannot be
loaded (a hub task offline) is reported, not fatal.

metrics.json key: lm_eval ({task: {metric: value}}, or {task: {unavailable: why}}).
"""

from __future__ import annotations

import logging

from kiln.eval.context import Context, release_cast_weights
from kiln.eval.lm_tasks import LOCAL_TASKS, current_names, run_lm_eval, write_task_configs
from kiln.eval.metrics.output import EvalOutput

log = logging.getLogger("kiln.eval")


def measure(ctx: Context) -> EvalOutput:
    cfg, paths = ctx.cfg.lm_eval, ctx.paths
    tasks = current_names(cfg.tasks)
    log.info("lm-eval tasks: %s", ", ".join(tasks))
    release_cast_weights()  # the final model's, before lm-eval loads its own copy of it
    tasks_dir = ctx.work_dir / "lm_eval_tasks"
    write_task_configs(ctx.data.task_data, tasks_dir)
    model_args = {
        "pretrained": str(paths.model),
        "tokenizer": str(paths.tokenizer),
        "device": str(ctx.device),
        "precision": ctx.precision,
    }
    # The local tasks in one call (each call loads lm-eval's copy of the model and builds its task
    # index); a hub task alone, so that one it cannot fetch leaves the others their figures.
    local = [task for task in tasks if task in LOCAL_TASKS]
    results = run_lm_eval("kiln", model_args, local, tasks_dir, limit=cfg.limit) if local else {}
    for task in (task for task in tasks if task not in LOCAL_TASKS):
        try:
            results.update(run_lm_eval("kiln", model_args, [task], tasks_dir, limit=cfg.limit))
        except Exception as exc:  # lm-eval raises many kinds for a task it cannot fetch or build
            log.warning("lm-eval task %s unavailable: %s", task, exc)
            results[task] = {"unavailable": str(exc)[:300]}
    release_cast_weights()  # lm-eval's model's
    return EvalOutput({"lm_eval": results})
