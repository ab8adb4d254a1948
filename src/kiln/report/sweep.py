"""results/<sweep>/sweep.md: a sweep's arms side by side (kiln.config.sweep).

Per arm: the values it varies, parameters, steps and tokens, final train and held-out loss, bits per
byte, tokens/s, the train stage's time and cost; the arm with the lowest held-out loss is marked.
The plot overlays every arm's validation curve against tokens and against training wall time (the
`elapsed_s` of metrics.jsonl, which a resumed run carries on from its checkpoint). When the arms
span three or more model sizes (a ladder) the report fits held-out loss as a power law of
parameters and of training compute (6·N·D) and says what the next size up would reach.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib
import numpy as np

from kiln.config.run_config import RunConfig
from kiln.io import benchmark_seconds, read_json
from kiln.layout import EVAL_METRICS, METRICS, Layout
from kiln.plan.tables import format_eta
from kiln.report.run import read_metrics

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LADDER_SIZES = 3  # distinct model sizes from which a sweep is read as a ladder and fitted


@dataclass
class Arm:
    run: str
    values: dict  # the varied keys' values in this arm
    n_params: int
    steps: int
    tokens: int
    train_loss: float | None
    val_loss: float
    val_bpb: float | None
    tokens_per_s: float
    time_s: float  # the train stage's wall time (its benchmark), else the loop's
    cost: float | None
    init_from: str | None = None


def _get(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _stage_seconds(paths: Layout, summary: dict) -> float:
    """The train stage's wall time (its benchmark), else the loop's."""
    seconds = benchmark_seconds(paths.benchmark("train"))
    return summary.get("wall_s", 0.0) if seconds is None else seconds


def collect(runs: dict[str, dict], varied: list[str], results: Path) -> tuple[list[Arm], dict[str, list[dict]]]:
    """Every arm's figures, and its metrics.jsonl records (for the curves)."""
    arms, curves = [], {}
    for run, cfg in runs.items():
        paths = Layout(cfg, root=results)
        summary = read_json(paths.output("train", "summary.json"))
        metrics = read_json(paths.output("eval", EVAL_METRICS))  # heldout's keys (kiln.eval.metrics.output)
        records = read_metrics(paths.folder("train") / METRICS)
        time_s = _stage_seconds(paths, summary)
        typed = RunConfig.of(cfg)
        price = typed.smoke.price_per_gpu_hour
        losses = [r["loss"] for r in records if "loss" in r]
        arms.append(
            Arm(
                run=run,
                values={key: _get(cfg, key) for key in varied},
                n_params=summary["n_params"],
                steps=summary["steps"],
                tokens=summary["tokens_seen"],
                train_loss=losses[-1] if losses else None,
                val_loss=metrics["val_loss"],
                val_bpb=metrics.get("val_bits_per_byte"),
                tokens_per_s=summary["tokens_per_s"],
                time_s=time_s,
                cost=time_s / 3600 * typed.train.ranks * price if price else None,
                init_from=summary.get("init_from"),
            )
        )
        curves[run] = records
    return arms, curves


def ladder_fit(arms: list[Arm]) -> dict | None:
    """Held-out loss as a power law of parameters (L = a·N^b) and of compute (L = a·C^b, C = 6·N·D),
    least squares in log-log; the prediction for the next size up (the largest times the ladder's
    last step ratio). None unless the arms span LADDER_SIZES sizes. A pure power law has no
    irreducible-loss floor, so far extrapolations read low."""
    sizes = sorted({a.n_params for a in arms})
    if len(sizes) < LADDER_SIZES:
        return None
    n = np.array([a.n_params for a in arms], dtype=float)
    c = 6 * n * np.array([a.tokens for a in arms], dtype=float)
    loss = np.array([a.val_loss for a in arms], dtype=float)
    out = {}
    for name, x in (("params", n), ("compute", c)):
        slope, intercept = np.polyfit(np.log(x), np.log(loss), 1)
        predicted = intercept + slope * np.log(x)
        residual = np.sum((np.log(loss) - predicted) ** 2)
        total = np.sum((np.log(loss) - np.log(loss).mean()) ** 2)
        out[name] = {
            "a": float(math.exp(intercept)),
            "b": float(slope),
            "r2": float(1 - residual / total) if total > 0 else 1.0,
        }
    next_size = sizes[-1] * sizes[-1] / sizes[-2]
    tokens_per_param = max(a.tokens / a.n_params for a in arms if a.n_params == sizes[-1])
    next_compute = 6 * next_size * next_size * tokens_per_param
    out["next"] = {
        "n_params": int(next_size),
        "tokens": int(next_size * tokens_per_param),
        "val_loss_by_params": out["params"]["a"] * next_size ** out["params"]["b"],
        "val_loss_by_compute": out["compute"]["a"] * next_compute ** out["compute"]["b"],
    }
    return out


def plot(arms: list[Arm], curves: dict[str, list[dict]], png: Path) -> None:
    fig, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120, sharey=True)
    best = min(arms, key=lambda a: a.val_loss).run
    for arm in arms:
        val = [r for r in curves[arm.run] if "val_loss" in r]
        label = arm.run + (" (best)" if arm.run == best else "")
        width = 2.2 if arm.run == best else 1.2
        by_tokens.plot([r["tokens"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, lw=width, label=label)
        timed = [r for r in val if "elapsed_s" in r]
        by_time.plot([r["elapsed_s"] / 60 for r in timed], [r["val_loss"] for r in timed], "o-", ms=3, lw=width)
    by_tokens.set_xlabel("tokens trained")
    by_time.set_xlabel("training wall time (minutes)")
    by_tokens.set_ylabel("held-out loss (nats/token)")
    for ax in (by_tokens, by_time):
        ax.grid(alpha=0.3)
    by_tokens.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, format="png")
    plt.close(fig)


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def render(name: str, arms: list[Arm], varied: list[str], fit: dict | None, png_name: str) -> str:
    best = min(arms, key=lambda a: a.val_loss)
    header = [
        "arm",
        *varied,
        "parameters",
        "steps",
        "tokens",
        "train loss",
        "val loss",
        "bits/byte",
        "tokens/s",
        "time",
        "cost",
    ]
    lines = [
        f"# Sweep {name}",
        "",
        f"{len(arms)} arms over the same data where their data settings agree; the best held-out loss is "
        f"**{best.run}** ({best.val_loss:.4f}).",
        "",
        f"![validation curves]({png_name})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for a in arms:
        mark = " **best**" if a is best else ""
        cells = [
            a.run + mark,
            *(_number(a.values[k]) for k in varied),
            f"{a.n_params:,}",
            f"{a.steps:,}",
            f"{a.tokens:,}",
            "" if a.train_loss is None else f"{a.train_loss:.4f}",
            f"{a.val_loss:.4f}",
            "" if a.val_bpb is None else f"{a.val_bpb:.4f}",
            f"{a.tokens_per_s:,.0f}",
            format_eta(a.time_s),
            "" if a.cost is None else f"${a.cost:,.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Time is the train stage's wall time (start-up, validation and checkpoints included); cost is that "
        "time x the arm's devices x smoke.price_per_gpu_hour.",
    ]
    if fit is not None:
        p, c, nxt = fit["params"], fit["compute"], fit["next"]
        lines += [
            "",
            "## Ladder fit",
            "",
            f"- against parameters: val loss = {p['a']:.4g} · N^{p['b']:.4f} (R² {p['r2']:.3f})",
            f"- against compute: val loss = {c['a']:.4g} · C^{c['b']:.4f} (R² {c['r2']:.3f}), C = 6·N·D",
            f"- the next size up, {nxt['n_params']:,} parameters on {nxt['tokens']:,} tokens (the same tokens "
            f"per parameter as the largest arm), would reach about {nxt['val_loss_by_params']:.3f} by the "
            f"parameter fit and {nxt['val_loss_by_compute']:.3f} by the compute fit. A power law without an "
            "irreducible term reads low far from the fitted sizes.",
        ]
    return "\n".join(lines) + "\n"


def table(arms: list[Arm], fit: dict | None) -> dict:
    best = min(arms, key=lambda a: a.val_loss)
    return {"best": best.run, "arms": [asdict(a) for a in arms], "ladder_fit": fit}
