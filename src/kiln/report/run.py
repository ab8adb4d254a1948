"""results/<run>/report.md: what a run made, at a glance, with its loss curve."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

from kiln.config.models import attention_description
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import Budget
from kiln.eval.metrics import registry
from kiln.eval.metrics.code.section import IN_LOOP_PASS_AT_1
from kiln.plan.steps import budget_text
from kiln.plan.tables import checks_table, format_eta
from kiln.plan.verdict import SmokeReport
from kiln.report.cleaning import cleaning_section, heldout_section

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss(records: list[dict], png: Path, *args, **kwargs) -> None:
    """loss_figure's figure written to `png`."""
    fig = loss_figure(records, *args, **kwargs)
    fig.savefig(png, format="png")
    plt.close(fig)


def loss_figure(
    records: list[dict],
    unigram: float | None = None,
    bits_per_nat: float | None = None,
    cooldown_from: int | None = None,
) -> Figure:
    """The loss curves, with the in-loop eval's HumanEval pass@1 (eval.in_loop, where the records have
    it), the learning rate, throughput and MFU (TFLOP/s where no peak is known, as on a CPU) of the
    same log steps beneath; a line for the unigram baseline, measured on this run's val batches.
    eval.reference is not drawn: a line through the run's curve reads as a difference, and the figure
    was measured on another machine or data (the report gives it in words, with where and when). With
    bits_per_nat (the val split's bits per byte for one nat per token) a right-hand axis reads the
    curves in bits per byte. A dotted line through every panel marks where wsd's cooldown began
    (cooldown_from). The legends sit inside their axes, in small type: at the default's 7-inch width a
    long label outside the axes was cut at the figure's edge."""
    coded = [r for r in records if IN_LOOP_PASS_AT_1 in r]  # eval.in_loop's validations
    fig, (ax, *panels) = plt.subplots(
        4 + bool(coded),
        1,
        figsize=(7, 8.5 + 1.6 * bool(coded)),
        dpi=120,
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1, 1, 1] + [1] * bool(coded)},
    )
    ax_lr, ax_speed, ax_mfu = panels[-3:]
    if coded:
        panels[0].plot([r["step"] for r in coded], [100 * r[IN_LOOP_PASS_AT_1] for r in coded], "o-", color="tab:brown")
        panels[0].set_ylabel("HumanEval\npass@1 (%)")
    val = [r for r in records if "val_loss" in r]  # step 0 too, in a run started from other weights
    records = [r for r in records if "loss" in r]  # training log steps
    steps = [r["step"] for r in records]
    ax_lr.plot(steps, [r["lr"] for r in records], lw=1.2, color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_speed.plot(steps, [r["tokens_per_s"] for r in records], lw=1.2, color="tab:purple")
    ax_speed.set_ylabel("tokens/s")
    if records and all(r.get("mfu") is not None for r in records):
        ax_mfu.plot(steps, [100 * r["mfu"] for r in records], lw=1.2, color="tab:red", label="Kiln's FLOP count")
        if all(r.get("mfu_torchtitan") is not None for r in records):
            ax_mfu.plot(
                steps,
                [100 * r["mfu_torchtitan"] for r in records],
                lw=1.2,
                ls="--",
                color="tab:red",
                label="torchtitan transformers-backend count",
            )
            ax_mfu.legend(loc="lower right", fontsize="small", framealpha=0.85)
        ax_mfu.set_ylabel("MFU (%)")
    else:
        ax_mfu.plot(steps, [r["tflops"] for r in records], lw=1.2, color="tab:red")
        ax_mfu.set_ylabel("TFLOP/s per device")
    for a in panels:
        a.grid(alpha=0.3)
    ax.plot(steps, [r["loss"] for r in records], label="train loss", lw=1.2)
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss", lw=1.2)
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls="--", lw=1, label="unigram baseline (val)")
    if bits_per_nat:
        right = ax.secondary_yaxis("right", functions=(lambda n: n * bits_per_nat, lambda b: b / bits_per_nat))
        right.set_ylabel("bits per byte (val)")
    ax_mfu.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    if cooldown_from is not None:
        for a in (ax, *panels):
            a.axvline(cooldown_from, color="black", ls=":", lw=1, label="cooldown begins" if a is ax else None)
    ax.legend(loc="upper right", fontsize="small", framealpha=0.85)
    fig.tight_layout()
    return fig


def _appended(tok: dict) -> str:
    """The tokens an hf source's tokenizer had appended for the run's roles (its stats' added_tokens), for
    the tokenizer's line: none for a drop-in continuation, which keeps the source's tokenizer as it is."""
    added = tok.get("added_tokens")
    return "; appended: " + ", ".join(f"`{t}`" for t in added) if added else ""


def render(run: str, data: dict, png_name: str) -> str:
    """The report's markdown from the stages' outputs (`data` keys: config (the report stage's RunConfig),
    raw (the download manifest; optional), tokenizer, tokens, shards, smoke (a SmokeReport), plan, train,
    train_samples, eval (kiln.eval.metrics.output.EvalOutput), metrics (train's metrics.jsonl); the others
    as read from JSON). The eval metrics' parts come from their report.py, in registration order: their
    tables under "Evaluation", then their sections, then their examples (kiln.eval.metrics.registry)."""
    tok, split, train = data["tokenizer"], data["tokens"]["splits"], data["train"]
    lines = [
        f"# Kiln run `{run}`",
        "",
        *_config_summary(data["config"], train),
        "",
        "## Data",
        "",
        "| | documents | tokens | bytes |",
        "|---|---:|---:|---:|",
        *(f"| {s} | {split[s]['docs']:,} | {split[s]['tokens']:,} | {split[s]['bytes']:,} |" for s in ("train", "val")),
        "",
        f"Tokenizer: {tok['vocab_size']:,} tokens (padded to {tok['padded_vocab_size']:,}{_appended(tok)}), "
        f"{tok['heldout_bytes_per_token']:.2f} bytes/token on {tok['heldout_docs']} held-out documents. "
        f"FIM modes on the train split: {data['tokens']['fim_modes']}.",
        "",
        f"Shards: {data['shards']['splits']['train']['rows']:,} train and {data['shards']['splits']['val']['rows']:,} "
        f"val rows of {data['shards']['row_len']} tokens.",
        "",
        *(cleaning_section(data["raw"]) + [""] if "raw" in data else []),
        *heldout_section(data["tokens"]),
        *_smoke_section(data["smoke"], data["plan"], train),
        "",
        "## Training",
        "",
        f"![loss curve]({png_name})",
        "",
        "| | value |",
        "|---|---:|",
        f"| parameters | {train['n_params']:,} |",
        f"| steps | {train['steps']:,} |",
        f"| tokens seen | {train['tokens_seen']:,} |",
        f"| tokens/s (steady state; checkpoints and validation left out) | {train['tokens_per_s']:,.0f} |",
        f"| MFU, Kiln's count / torchtitan transformers-backend count | {_pct(train['mfu'])} / {_pct(train.get('mfu_torchtitan'))} |",
        *_cooldown_row(train),
        "",
        *_training_samples(data["train_samples"], data["eval"].samples.get("train_prompts", [])),
        "## Evaluation (held-out split)",
        "",
    ]
    for part in ("tables", "section", "examples"):
        lines += metric_parts(part, data)
    return "\n".join(lines) + "\n"


def metric_parts(part: str, data: dict) -> list[str]:
    """Every registered metric's `part` (tables, section or examples: kiln.eval.metrics.registry), in
    registration order; a metric without it, or without a report.py, adds nothing."""
    lines = []
    for metric in registry.metrics():
        render_part = getattr(metric.report, part, None)
        if render_part is not None:
            lines += render_part(data["eval"], data)
    return lines


def _config_summary(cfg: RunConfig, train_result: dict) -> list[str]:
    model, train = cfg.model, cfg.train
    shape = model.flavour or f"{model.family or 'gpt2'} {model.n_layer} layers x {model.d_model}, {model.n_head} heads"
    batch = train.batch_tokens or f"one micro-batch ({train.micro_batch} rows) on each of {train.ranks} ranks:"
    data = ", ".join(f"{source.name} ({source.kind})" for source in cfg.download.sources)
    return [
        "## Configuration",
        "",
        "| | |",
        "|---|---|",
        f"| data | {data} |",
        f"| model | {shape}; {train_result['n_params']:,} parameters; context {cfg.shard.seq_len} |",
        f"| batch | {batch} tokens per step |",
        f"| optimisation | {train_result['steps']:,} steps{_budget_note(train.budget)}, lr {train.lr:g} -> {train.min_lr:g} ({train.schedule}, "
        f"{train.warmup_steps} warmup), weight decay {train.weight_decay:g}, clip {train.grad_clip:g}, {train.precision} |",
        f"| seed | {cfg.seed} |",
        f"| initial weights | {train_result.get('init_from') or 'random (seed)'} |",
    ]


def _budget_note(budget: Budget | None) -> str:
    return f" (what a budget of {budget_text(budget.as_dict())} bought)" if budget else ""


def _smoke_section(smoke: SmokeReport, plan: dict, train: dict) -> list[str]:
    """The gate's checks, and what the smoke stage planned against what the full run took."""
    lines = ["## Smoke gate", "", f"Gate: **{smoke.summary}**.", "", checks_table(smoke.checks)]
    if smoke.measurements is not None and smoke.measurements.attention_kernel:
        lines += ["", f"Attention: {attention_description(smoke.measurements.attention_kernel)} (kiln.model.sdpa)."]
    if "eta_s" not in plan or smoke.measurements is None:
        return lines
    mfu = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    lines += [
        "",
        "### Plan against the full run",
        "",
        "| | planned (smoke) | actual (train) |",
        "|---|---:|---:|",
        f"| tokens | {plan['total_tokens']:,} | {train['tokens_seen']:,} |",
        f"| tokens/s | {plan['tokens_per_s']:,.0f} | {train['tokens_per_s']:,.0f} |",
        f"| MFU, Kiln's FLOP count (6N + 12·L·H·Q·T) | {mfu(smoke.measurements.probe.mfu)} | {mfu(train['mfu'])} |",
        f"| MFU, torchtitan transformers-backend count (6(N - embeddings) + 6·L·H·Q·T) | "
        f"{mfu(smoke.measurements.probe.mfu_torchtitan)} | {mfu(train.get('mfu_torchtitan'))} |",
        f"| time | {format_eta(plan['eta_s'])} | {format_eta(train['wall_s'])} (with validation and checkpoints) |",
        f"| tokens per parameter | {plan['tokens_per_param']:.2f} | |",
        *_budget_rows(plan, train),
    ]
    if plan["cost"] is not None:
        spent = train.get("spent_s", train["wall_s"])  # a budgeted stage's own wall time, else the loop's
        lines.append(f"| cost | ${plan['cost']:,.2f} | ${plan['cost'] * spent / plan['eta_s']:,.2f} |")
    return lines


def _budget_rows(plan: dict, train: dict) -> list[str]:
    """A budgeted run (kiln.train.budget): the steps the smoke stage planned against those trained,
    and the stage's wall time against its budget."""
    if "budget_s" not in train:
        return []
    rows = [
        f"| steps | {plan['max_steps']:,} | {train['steps']:,} ({train['replans']} re-plans in "
        f"{train['decisions']} decisions: train/budget.jsonl) |",
        f"| stage wall time | budget {train['budget_s']:,.0f} s | spent {train['spent_s']:,.0f} s "
        f"({train['spent_s'] / train['budget_s']:.1%}) |",
    ]
    speed = train.get("window_tokens_per_s")
    if speed:  # "varied" once a window ran below half the median: a stall or a hog moved the plan
        low, high = train["steps_range"]
        rows.append(
            f"| speed | | {'varied' if speed['below_half'] else 'steady'}: log windows' median "
            f"{speed['median']:,.0f} tokens/s, slowest {speed['slowest']:,.0f} ({speed['below_half']} of "
            f"{speed['windows']} below half the median); max_steps moved between {low:,} and {high:,} |"
        )
    return rows


def _cooldown_row(train: dict) -> list[str]:
    """Where wsd's cooldown began (the dotted line of loss.png), against the steps trained: a budgeted
    run's re-plans may move it; the schedule's own share is train.decay_fraction."""
    start = train.get("cooldown_from")
    if start is None or not train["steps"]:
        return []
    return [
        f"| cooldown (wsd) | from step {start:,}: the last {(train['steps'] - start) / train['steps']:.0%} of the steps |"
    ]


def _training_samples(rows: list[dict], final: list[dict]) -> list[str]:
    """train.samples' prompts: completed at the first validation step (train/samples.jsonl) and by
    the final model (the eval stage, which completes the prompts as they are set now), each with how
    it was decoded (rows from before the label were greedy). A run from before eval completed them
    shows the last validation step instead."""
    if not rows and not final:
        return []
    steps = sorted({r["step"] for r in rows})
    shown = [(s, [r for r in rows if r["step"] == s]) for s in (steps[:1] if final else steps[:1] + steps[1:][-1:])]
    if final:
        shown.append(("final", final))
    lines = ["### Samples during training", "", "| step | prompt | decoding | completion |", "|---:|---|---|---|"]
    for step, at in shown:
        lines += [f"| {step} | `{r['prompt']!r}` | {r.get('decoding', 'greedy')} | `{r['completion']!r}` |" for r in at]
    return lines + [""]


def _pct(value: float | None) -> str:
    return "n/a (no GPU peak)" if value is None else f"{value:.1%}"
