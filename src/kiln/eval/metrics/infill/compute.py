"""The eval_data stage's infilling problems (single/multi-line spans, PSM/SPM), the middles written
greedily (kiln.eval.infill); not run for a model trained without FIM (kiln.eval.infill.not_run_reason),
which could only score noise.

metrics.json key: infill (scores by span and layout, or {not_run: why}); samples.json key: infill
(examples, greedy: scored by exact match).
"""

from __future__ import annotations

import logging

from kiln.eval.context import Context
from kiln.eval.infill import run_infill
from kiln.eval.metrics.output import EvalOutput

log = logging.getLogger("kiln.eval")


def measure(ctx: Context) -> EvalOutput:
    data = ctx.data
    if data.infill_not_run:
        log.info("infilling not run: %s", data.infill_not_run)
        return EvalOutput({"infill": {"not_run": data.infill_not_run}}, {"infill": []})
    log.info("infilling: %d problems", len(data.infill_problems))
    infill = run_infill(ctx.model, ctx.tokenizer, list(data.infill_problems))
    return EvalOutput({"infill": infill["scores"]}, {"infill": infill["examples"]})
