"""Contamination in the report: each eval set's items that share a 13-gram with the training tokens."""

from __future__ import annotations

from kiln.eval.metrics.output import EvalOutput
from kiln.report.markdown import number


def tables(out: EvalOutput, data: dict) -> list[str]:
    lines = [
        "### Contamination (13-gram overlap with the training tokens)",
        "",
        "| eval set | items | items with overlap | 13-grams found |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {row['items']} | {row['contaminated_items']} | {number(row['ngram_overlap'])} |"
        for name, row in out.metrics["contamination"].items()
    ]
    return lines + [""]
