"""lm-eval in the report: every task's metrics (their standard errors left out)."""

from __future__ import annotations

from kiln.eval.metrics.output import EvalOutput
from kiln.report.markdown import number


def tables(out: EvalOutput, data: dict) -> list[str]:
    lines = ["### lm-evaluation-harness", "", "| task | metric | value |", "|---|---|---:|"]
    for task, metrics in out.metrics["lm_eval"].items():
        lines += [
            f"| {task} | {metric.split(',')[0]} | {number(value) if not isinstance(value, str) else value} |"
            for metric, value in metrics.items()
            if "stderr" not in metric
        ]
    return lines + [""]
