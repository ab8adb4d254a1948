"""Infilling in the report: its scores by span and layout (or why it was not run), and a few examples."""

from __future__ import annotations

from kiln.eval.metrics.output import EvalOutput
from kiln.report.markdown import fence, number

SHOWN = 6  # examples


def tables(out: EvalOutput, data: dict) -> list[str]:
    infill = out.metrics["infill"]
    lines = ["### Fill-in-the-middle (held-out documents)", ""]
    if "not_run" in infill:  # kiln.eval.infill.not_run_reason
        return lines + [f"not run: {infill['not_run']}", ""]
    lines += ["| span / layout | problems | exact match | edit similarity |", "|---|---:|---:|---:|"]
    lines += [
        f"| {name} | {row['problems']} | {number(row['exact_match'])} | {number(row['edit_similarity'])} |"
        for name, row in infill.items()
    ]
    return lines + [""]


def examples(out: EvalOutput, data: dict) -> list[str]:
    found = out.samples["infill"]
    lines = ["## Infilling examples (greedy, scored by exact match)", ""] if found else []
    for ex in found[:SHOWN]:
        mark = "exact" if ex["exact_match"] else f"similarity {ex['edit_similarity']:.2f}"
        lines += [
            f"`{ex['doc_id']}` ({ex['span']}, {ex['layout']}, {mark}):",
            "",
            "expected:",
            "",
            fence(ex["expected"].rstrip()),
            "",
            "got:",
            "",
            fence(ex["completion"].rstrip()),
            "",
        ]
    return lines
