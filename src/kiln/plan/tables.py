"""How the smoke stage's plan and checks, and a run's durations, read to a person: the markdown the
smoke stage logs and the report (kiln.report.run) shows, and the ETA the trainer logs. Torch-free,
like the report stage.
"""

from __future__ import annotations

from typing import Sequence

from kiln.plan.steps import CHINCHILLA_TOKENS_PER_PARAM, budget_text
from kiln.plan.verdict import Check


def format_eta(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as terminal lines, each column as wide as its widest cell (`kiln plan`'s sweep,
    `kiln status`, `kiln rehearse`)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _size(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n_bytes < 1024 or unit == "TiB":
            return f"{n_bytes:.1f} {unit}" if unit != "B" else f"{int(n_bytes)} B"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def checks_table(checks: Sequence[Check]) -> str:
    """The smoke gate's checks as a markdown table."""
    lines = ["| check | result | measured | threshold | note |", "|---|---|---|---|---|"]
    lines += [
        f"| {c.name} | {'pass' if c.passed else 'FAIL'} | {c.figure} | {c.threshold} | {c.detail} |" for c in checks
    ]
    return "\n".join(lines)


def render_plan(plan: dict) -> str:
    """plan.md: the plan (kiln.plan.steps.full_run_plan) as a table a person reads before paying for the run."""
    cost = (
        f"${plan['cost']:,.2f} at ${plan['price_per_gpu_hour']:g} per device-hour"
        if plan["cost"] is not None
        else "no price set (smoke.price_per_gpu_hour)"
    )
    ratio = plan["tokens_per_param"] / CHINCHILLA_TOKENS_PER_PARAM
    epochs = f"{plan['epochs']:.2f}" if plan["epochs"] is not None else "n/a"
    repeat = " (the train split repeats: more epochs than one)" if plan["epochs"] and plan["epochs"] > 1 else ""
    rows = [
        (
            "global batch",
            f"{plan['ranks']} ranks x {plan['grad_accum']} micro-batches x {plan['micro_batch']} rows "
            f"x {plan['seq_len']} tokens = {plan['tokens_per_step']:,} tokens/step",
        ),
        ("total tokens", f"{plan['max_steps']:,} steps x {plan['tokens_per_step']:,} = {plan['total_tokens']:,}"),
        ("throughput", f"{plan['tokens_per_s']:,.0f} tokens/s ({plan['tokens_per_s_per_rank']:,.0f} per rank)"),
        ("time", f"{plan['eta_h']:.2f} h ({plan['device_hours']:.1f} device-hours)"),
        ("cost", cost),
        (
            "tokens per parameter",
            f"{plan['tokens_per_param']:.2f} for {plan['n_params']:,} parameters "
            f"({ratio:.2f}x Chinchilla's {CHINCHILLA_TOKENS_PER_PARAM})",
        ),
        ("epochs of the train split", f"{epochs} of {plan['train_tokens']:,} tokens{repeat}"),
        ("disk", disk_text(plan)),
    ]
    if plan.get("budget"):
        t = plan["stage_times"]
        rows.append(
            (
                "budget",
                f"{budget_text(plan['budget'])} = {plan['budget_s']:,.0f} s of the train stage buys "
                f"{plan['max_steps']:,} steps at {t['step_s']:.3f} s/step, after {t['startup_s']:.0f} s "
                f"of start-up, with validations of {t['validation_s']:.1f} s and checkpoints of "
                f"{t['checkpoint_s']:.1f} s: the stage should take {plan['stage_s']:,.0f} s",
            )
        )
    if "precision" in plan:  # auto's pick says how it was made (an older plan: the candidates timed, if any)
        timed = ", ".join(f"{k} {v:,.0f}" for k, v in plan.get("precision_tokens_per_s", {}).items())
        why = plan.get("precision_why") or ("the faster here" if timed else "")
        said = why + (f"; tokens/s timed {timed}" if timed else "")
        rows.append(("precision", f"{plan['precision']} (auto: {said})" if why else plan["precision"]))
    if "eval" in plan:
        rows.append(("eval (predicted)", eval_text(plan["eval"])))
    if "in_loop_eval" in plan:
        loop = plan["in_loop_eval"]
        rows.append(
            (
                "in-loop eval (predicted)",
                f"HumanEval's first {loop['problems']} problems greedy at {loop['evals']:,} steps, "
                f"{loop['s_each']:.1f} s each: {format_eta(loop['s'])}, {loop['share']:.2%} of the train stage",
            )
        )
    if "memory" in plan:
        rows += memory_rows(plan["memory"])
    if plan.get("rehearsal"):
        rows.append(rehearsal_row(plan["rehearsal"]))
    return "\n".join(["# Plan for the full run", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""])


def eval_text(cost: dict) -> str:
    """The eval's line in the plan (kiln.forecast prices it: kiln.eval.sizes)."""
    parts = [
        f"{name} {part['prompts']:,} prompts and programs, {format_eta(part['s'])}"
        for name, part in cost.items()
        if isinstance(part, dict)
    ]
    share = "" if cost["share"] is None else f", {cost['share']:.1%} of the train stage"
    price = "" if cost.get("cost") is None else f", ${cost['cost']:,.2f}"
    return f"{cost['sizes']}: {format_eta(cost['s'])} on one GPU{share}{price} ({'; '.join(parts) or 'no code evals'})"


def disk_text(plan: dict) -> str:
    """The plan's disk figure and what it adds up: the data stages' parts when the plan has them
    (`kiln plan`; the smoke stage's plan counts the run's own files), the checkpoints kept at once
    (the newest and the milestones) and the final weights twice."""
    data = plan.get("data_bytes") or {}
    parts = []
    if "raw" in data:
        parts.append(
            f"raw text {_size(data['raw'])} at most (zstd parquet: less on disk)"
            if data["raw"]
            else "raw text not counted (a source without download max_bytes)"
        )
    if "pretokenized" in data:
        parts.append(
            f"the token ids twice, pretokenized and sharded ({_size(data['pretokenized'])} each)"
            if data["pretokenized"]
            else "token ids not counted (no pretokenize.train_tokens or max_bytes)"
        )
    milestones = plan.get("milestone_checkpoints", 0)
    kept = f"{plan['keep_checkpoints']} checkpoints"
    if milestones:
        kept += f" + {milestones} milestone{'s' if milestones > 1 else ''}"
    parts.append(f"{kept} of {_size(plan['checkpoint_bytes'])}")
    weights = f" ({_size(2 * plan['model_bytes'])})" if "model_bytes" in plan else ""
    parts.append(f"the final weights twice{weights}: safetensors and the HF export")
    return f"{_size(plan['disk_bytes'])}: " + "; ".join(parts)


def memory_rows(memory: dict) -> list[tuple[str, str]]:
    """kiln.plan.memory.fit_report as two plan rows: the estimate per GPU, and whether it fits."""
    parts = ", ".join(f"{name} {gib:.1f}" for name, gib in memory["parts_gib"].items())
    gpu = f"{memory['gpu']} ({memory['gpu_memory_gib']:g} GiB)"
    if memory["fits"]:
        verdict = f"yes: {memory['gib_per_gpu']:.1f} of the {memory['usable_gib']:.1f} GiB a step may use"
    else:
        tries = (
            "; ".join(f"{c['set']} ({c['gib_per_gpu']:.1f} GiB)" for c in memory["changes"])
            or "nothing in train alone: a shorter shard.seq_len, a smaller model or a larger GPU"
        )
        verdict = (
            f"no: {memory['gib_per_gpu']:.1f} GiB > the {memory['usable_gib']:.1f} a step may use; what fits: {tries}"
        )
    return [
        (
            "memory per GPU",
            f"{memory['gib_per_gpu']:.1f} GiB estimated at the step's peak ({memory['peak_at']}): "
            f"{parts}; {memory['assumes']}",
        ),
        (f"fits on {gpu}?", verdict),
    ] + ([("train.micro_batch / activation_checkpointing", memory["auto"])] if memory.get("auto") else [])


def rehearsal_row(rehearsed: dict) -> tuple[str, str]:
    """kiln.plan.rehearsal.plan_rows as the plan's row beside the estimate."""
    if "stale" in rehearsed:
        return ("memory per GPU, rehearsed", rehearsed["stale"])
    phases = ", ".join(
        f"{name} {p['gib']:.1f} GiB"
        + (" (compiled, estimated)" if p["compiled"] else "")
        + ("" if p["fits"] else " DOES NOT FIT")
        for name, p in rehearsed["phases"].items()
    )
    return ("memory per GPU, rehearsed", f"{phases} ({rehearsed['path']})")
