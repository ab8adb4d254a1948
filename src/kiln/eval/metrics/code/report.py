"""The report's "Code" section: the eval stage's HumanEval and HumanEval-Infilling scores (kiln.eval.code),
each with its 95% interval, and beside them the published figures (kiln.eval.code_references)."""

from __future__ import annotations

from kiln.eval.code_references import METRICS, for_benchmark
from kiln.eval.metrics.output import EvalOutput

INFILL_BENCHMARK = {
    "single_line": "humaneval-infilling-single-line",
    "multi_line": "humaneval-infilling-multi-line",
    "random_span": "humaneval-infilling-random-span",
}


def _size(params_b: float) -> str:
    return f"{params_b:g}B" if params_b >= 1 else f"{params_b * 1000:g}M"


def _interval(score: dict) -> str:
    return f"{score['value']:.1%} [{score['low']:.1%}, {score['high']:.1%}]"


def _reasons(reasons: dict) -> str:
    return ", ".join(f"{reason} x{count}" for reason, count in reasons.items())


def _published(benchmark: str) -> list[str]:
    """One benchmark's published figures, a row per model, smallest first, a column per metric."""
    rows = for_benchmark(benchmark)
    metrics = [m for m in METRICS if any(r.metric == m for r in rows)]
    models: dict[str, dict] = {}
    for r in rows:
        models.setdefault(r.model, {"row": r})[r.metric] = f"{r.percent:.2f}%"
    lines = [
        f"{benchmark}:",
        "",
        f"| model | size | {' | '.join(metrics)} | source |",
        f"|---|---:|{'---:|' * len(metrics)}---|",
    ]
    for values in models.values():
        r = values["row"]
        cells = " | ".join(values.get(m, "") for m in metrics)
        lines.append(f"| {r.model} | {_size(r.params_b)} | {cells} | [{r.where}]({r.url}) ({r.source_kind}) |")
    return lines + [""]


def smallest_nonzero() -> str:
    """The plain statement of scale: the smallest published model with a non-zero HumanEval pass@1."""
    row = min((r for r in for_benchmark("humaneval", "pass@1") if r.percent > 0), key=lambda r: r.params_b)
    return (
        f"A tiny model trained on a CPU scores 0 on these benchmarks, as expected: the smallest published "
        f"non-zero HumanEval figure is {row.model}'s {row.percent:.1f}% pass@1 ({_size(row.params_b)} parameters, "
        f"{row.note})."
    )


def _humaneval(he: dict) -> list[str]:
    if "not_run" in he:
        return [f"HumanEval not run: {he['not_run']}", ""]
    lines = [
        f"HumanEval, the first {he['problems']} of 164 problems, up to {he['max_new_tokens']} new tokens:",
        "",
        "| decoding | metric | ours (95% interval) | outcomes |",
        "|---|---|---:|---|",
    ]
    for run in [he, *he.get("sampled", [])]:
        lines += [
            f"| {run['protocol']} | {key} | {_interval(run[key])} | {_reasons(run['reasons'])} |"
            for key in run
            if key.startswith("pass@")
        ]
    return lines + [""]


def _tasks(row: dict) -> str:
    """How many tasks a row scored, "8 of 133" where a cap left some of the kind's out."""
    made = row.get("made", row["tasks"])  # an eval from before the cap scored every task
    return f"{row['tasks']}" if made == row["tasks"] else f"{row['tasks']} of {made}"


def _infill(inf: dict) -> list[str]:
    if "not_run" in inf:
        return [f"HumanEval-Infilling not run: {inf['not_run']}", ""]
    cap = inf.get("tasks_per_kind")
    lines = [
        f"HumanEval-Infilling, the tasks made from HumanEval's first {inf['problems']} problem(s)"
        + (f", at most {cap} of each kind (the same ones every run)" if cap else "")
        + f", {inf['protocol']}"
        + (
            " (from one problem the interval is the whole [0%, 100%]: no spread to measure):"
            if inf["problems"] == 1
            else ":"
        ),
        "",
        "| kind | mode | tasks | pass@1 (95% interval) | exact match | edit similarity | outcomes |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for kind, modes in inf["kinds"].items():
        lines += [
            f"| {kind} | {mode} | {_tasks(row)} | {_interval(row['pass@1'])} | {row['exact_match']:.1%} | "
            f"{row['edit_similarity']:.3f} | {_reasons(row['reasons'])} |"
            for mode, row in modes.items()
        ]
    return lines + [""]


def section(out: EvalOutput, data: dict) -> list[str]:
    """The section's markdown lines; none for an eval from before the code benchmarks."""
    return code_section(out.metrics.get("code"), out.samples.get("code"))


def code_section(code: dict | None, examples: list[dict] | None = None) -> list[str]:
    if not code:
        return []
    he, inf = code["humaneval"], code["humaneval_infill"]
    kinds = list(inf.get("kinds", {}))
    lines = ["## Code (HumanEval, HumanEval-Infilling)", "", smallest_nonzero(), ""]
    lines += _humaneval(he) + _infill(inf)
    if he.get("pass@1", {}).get("value") == 0.0:
        lines += [
            f"0 solved of {he['problems']}: the interval's top is what that bounds (Wilson's score interval).",
            "",
        ]
    if "sandbox" in code:
        lines += ["Every program ran in the sandbox (kiln.eval.sandbox), never in the eval process. It held:", ""]
        lines += [f"- {layer}: {what}" for layer, what in code["sandbox"].items()] + [""]
    lines += [
        "### Published figures",
        "",
        "Protocols differ (Codex: pass@k from 200 samples per problem at T=0.2 / 0.8; FIM paper: pass@1 from "
        "100 samples per task at T=0.2); greedy pass@1 above is a cheaper estimate. Compare metric with metric.",
        "",
    ]
    for benchmark in ["humaneval", *(INFILL_BENCHMARK[k] for k in kinds)]:
        lines += _published(benchmark)
    for ex in (examples or [])[:2]:
        lines += [
            f"`{ex['task_id']}` ({ex['benchmark']}):",
            "",
            "```",
            ex["completion"].replace("```", "ʼʼʼ"),
            "```",
            "",
        ]
    return lines
