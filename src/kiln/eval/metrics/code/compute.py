"""HumanEval and HumanEval-Infilling as eval.humaneval and eval.humaneval_infill set them, every program
run in kiln.eval.sandbox (kiln.eval.code.run_code_evals); infilling is not run for a model trained
without FIM, as the held-out infilling is not.

metrics.json key: code ({humaneval, humaneval_infill, sandbox}); samples.json key: code (a few
completions of each benchmark).
"""

from __future__ import annotations

from kiln.eval.code import run_code_evals
from kiln.eval.context import Context
from kiln.eval.metrics.output import EvalOutput


def measure(ctx: Context) -> EvalOutput:
    scores, examples = run_code_evals(ctx.model, ctx.tokenizer, ctx.cfg, ctx.seed, ctx.data.infill_not_run)
    return EvalOutput({"code": scores}, {"code": examples})
