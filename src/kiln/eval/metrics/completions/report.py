"""The completions in the report's samples: sampled first (what the model writes), then greedy (the
decoding exact-match metrics score), each labelled as eval decoded it (samples.json from before the
labels: the bare names)."""

from __future__ import annotations

from kiln.eval.metrics.output import EvalOutput
from kiln.report.markdown import fence


def examples(out: EvalOutput, data: dict) -> list[str]:
    how = out.samples.get("decoding", {"sampled": "sampled", "greedy": "greedy"})
    lines = ["## Samples", ""]
    for row in out.samples["completions"]:
        lines += [f"Prompt `{row['prompt']!r}`, {how['sampled']}:", "", fence(row["prompt"] + row["sampled"]), ""]
        lines += [f"{how['greedy']}:", "", fence(row["prompt"] + row["greedy"]), ""]
    return lines
