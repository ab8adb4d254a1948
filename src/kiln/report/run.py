"""results/<run>/report.md: what a run made, at a glance, with its loss curve."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

from kiln.config.eval_sections import Reference
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import Budget
from kiln.plan.steps import budget_text
from kiln.plan.tables import checks_table, format_eta
from kiln.plan.verdict import SmokeReport
from kiln.report.cleaning import cleaning_section, heldout_section
from kiln.report.code import code_section

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss(
    records: list[dict],
    png: Path,
    unigram: float | None = None,
    reference: Reference | None = None,
    bits_per_nat: float | None = None,
) -> None:
    """The loss curves, with the learning rate, throughput and MFU (TFLOP/s where no peak is known,
    as on a CPU) of the same log steps beneath; reference lines for the unigram baseline and for a
    published figure (eval.reference). With bits_per_nat (the val split's bits per byte for one nat
    per token) a right-hand axis reads the curves in bits per byte."""
    fig, (ax, ax_lr, ax_speed, ax_mfu) = plt.subplots(
        4, 1, figsize=(7, 8.5), dpi=120, sharex=True, gridspec_kw={"height_ratios": [3, 1, 1, 1]}
    )
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
            ax_mfu.legend(fontsize="small")
        ax_mfu.set_ylabel("MFU (%)")
    else:
        ax_mfu.plot(steps, [r["tflops"] for r in records], lw=1.2, color="tab:red")
        ax_mfu.set_ylabel("TFLOP/s per device")
    for a in (ax_lr, ax_speed, ax_mfu):
        a.grid(alpha=0.3)
    ax.plot(steps, [r["loss"] for r in records], label="train loss", lw=1.2)
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss", lw=1.2)
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls="--", lw=1, label="unigram baseline (val)")
    if reference is not None and (nats := reference_loss(reference, bits_per_nat)) is not None:
        figure = (
            f"{reference.val_loss:g}" if reference.val_loss is not None else f"{reference.bits_per_byte:g} bits/byte"
        )
        ax.axhline(nats, color="tab:orange", ls=":", lw=1.2, label=f"reference {figure} ({reference.source})")
    if bits_per_nat:
        right = ax.secondary_yaxis("right", functions=(lambda n: n * bits_per_nat, lambda b: b / bits_per_nat))
        right.set_ylabel("bits per byte (val)")
    ax_mfu.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, format="png")
    plt.close(fig)


def _fence(text: str) -> str:
    return "```\n" + text.replace("```", "ʼʼʼ") + "\n```"


def render(run: str, data: dict, png_name: str) -> str:
    """The report's markdown from the stages' outputs (`data` keys: config (the report stage's RunConfig),
    raw (the download manifest; optional), tokenizer, tokens, shards, smoke (a SmokeReport), plan, train, train_samples, eval, samples; the others
    as read from JSON)."""
    ev, tok, split, train = data["eval"], data["tokenizer"], data["tokens"]["splits"], data["train"]
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
        f"Tokenizer: {tok['vocab_size']:,} tokens (padded to {tok['padded_vocab_size']:,}), "
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
        "",
        *_training_samples(data["train_samples"], data["samples"].get("train_prompts", [])),
        "## Evaluation (held-out split)",
        "",
        "| metric | model | unigram baseline |",
        "|---|---:|---:|",
        f"| loss (nats/token) | {ev['val_loss']:.4f} | {ev['unigram_val_loss']:.4f} |",
        f"| bits per byte | {ev['val_bits_per_byte']:.4f} | {ev['unigram_bits_per_byte']:.4f} |",
        f"| perplexity | {ev['val_perplexity']:.2f} | |",
        "",
        *_from_source(data.get("metrics", [])),
        *_reference_line(data["config"].eval.reference, ev["val_loss"], ev["val_bits_per_byte"]),
        *_eval_tables(ev),
        *code_section(ev.get("code"), data["samples"].get("code")),  # none in an eval from before it
        *_completions(data["samples"]),
    ]
    lines += ["## Infilling examples (greedy, scored by exact match)", ""] if data["samples"]["infill"] else []
    for ex in data["samples"]["infill"][:6]:
        mark = "exact" if ex["exact_match"] else f"similarity {ex['edit_similarity']:.2f}"
        lines += [
            f"`{ex['doc_id']}` ({ex['span']}, {ex['layout']}, {mark}):",
            "",
            "expected:",
            "",
            _fence(ex["expected"].rstrip()),
            "",
            "got:",
            "",
            _fence(ex["completion"].rstrip()),
            "",
        ]
    return "\n".join(lines) + "\n"


def reference_loss(reference: Reference, bits_per_nat: float | None) -> float | None:
    """eval.reference in nats/token: its val_loss, or its bits_per_byte over the val split's bits
    per byte for one nat per token (None when that is unknown)."""
    if reference.val_loss is not None:
        return reference.val_loss
    return reference.bits_per_byte / bits_per_nat if bits_per_nat else None


def _reference_line(reference: Reference | None, val_loss: float, val_bpb: float) -> list[str]:
    if reference is None:
        return []
    name, ours, theirs = (
        ("val loss", val_loss, reference.val_loss)
        if reference.val_loss is not None
        else ("bits per byte", val_bpb, reference.bits_per_byte)
    )
    gap = ours - theirs
    return [
        f"Reference: {name} {theirs:g} ({reference.source}); this run "
        f"{ours:.4f}, {abs(gap):.3f} {'above' if gap > 0 else 'below'} it.",
        "",
    ]


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


def _from_source(metrics: list[dict]) -> list[str]:
    """A run started from other weights: the source's held-out figure (the step-0 validation, before
    any step) beside the run's last one; both are training's validation, on the same batches of this
    run's val split, so the difference is what the continuation changed."""
    vals = [r for r in metrics if "val_loss" in r]
    if len(vals) < 2 or vals[0].get("step") != 0 or "init_from" not in vals[0]:
        return []
    start, end = vals[0], vals[-1]
    bpb = lambda r: "n/a" if r.get("val_bpb") is None else f"{r['val_bpb']:.4f}"  # noqa: E731
    return [
        f"Started from {start['init_from']}: on training's validation batches, its weights before any "
        "step against this run's after its last:",
        "",
        "| | step | loss (nats/token) | bits per byte |",
        "|---|---:|---:|---:|",
        f"| source | 0 | {start['val_loss']:.4f} | {bpb(start)} |",
        f"| continued | {end['step']:,} | {end['val_loss']:.4f} | {bpb(end)} |",
        "",
    ]


def _budget_note(budget: Budget | None) -> str:
    return f" (what a budget of {budget_text(budget.as_dict())} bought)" if budget else ""


def _smoke_section(smoke: SmokeReport, plan: dict, train: dict) -> list[str]:
    """The gate's checks, and what the smoke stage planned against what the full run took."""
    lines = ["## Smoke gate", "", f"Gate: **{smoke.summary}**.", "", checks_table(smoke.checks)]
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
    return [
        f"| steps | {plan['max_steps']:,} | {train['steps']:,} ({train['replans']} re-plans in "
        f"{train['decisions']} decisions: train/budget.jsonl) |",
        f"| stage wall time | budget {train['budget_s']:,.0f} s | spent {train['spent_s']:,.0f} s "
        f"({train['spent_s'] / train['budget_s']:.1%}) |",
    ]


def _completions(samples: dict) -> list[str]:
    """The eval stage's completions: sampled first (what the model writes), then greedy (the decoding
    exact-match metrics score), each labelled as eval decoded it (samples.json from before the
    labels: the bare names)."""
    how = samples.get("decoding", {"sampled": "sampled", "greedy": "greedy"})
    lines = ["## Samples", ""]
    for row in samples["completions"]:
        lines += [f"Prompt `{row['prompt']!r}`, {how['sampled']}:", "", _fence(row["prompt"] + row["sampled"]), ""]
        lines += [f"{how['greedy']}:", "", _fence(row["prompt"] + row["greedy"]), ""]
    return lines


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


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _eval_tables(ev: dict) -> list[str]:
    """Per-source, per-checkpoint, infilling, lm-eval and contamination tables of the eval stage's metrics."""
    lines = [
        "### Per source",
        "",
        "| source | loss | perplexity | bits per byte | tokens evaluated |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {m['loss']:.4f} | {m['perplexity']:.2f} | {m['bits_per_byte']:.4f} | {m['tokens_evaluated']:,} |"
        for name, m in ev["val_by_source"].items()
    ]
    lines += ["", "### Checkpoints kept", "", "| step | tokens | val loss | bits per byte |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {_number(c['step'])}{' (final)' if c['final'] else ''} | {_number(c['tokens'])} | "
        f"{c['val_loss']:.4f} | {c['val_bits_per_byte']:.4f} |"
        for c in ev["checkpoints"]
    ]
    lines += ["", "### Fill-in-the-middle (held-out documents)", ""]
    if "not_run" in ev["infill"]:  # kiln.eval.infill.not_run_reason
        lines += [f"not run: {ev['infill']['not_run']}"]
    else:
        lines += ["| span / layout | problems | exact match | edit similarity |", "|---|---:|---:|---:|"]
        lines += [
            f"| {name} | {row['problems']} | {_number(row['exact_match'])} | {_number(row['edit_similarity'])} |"
            for name, row in ev["infill"].items()
        ]
    lines += ["", "### lm-evaluation-harness", "", "| task | metric | value |", "|---|---|---:|"]
    for task, metrics in ev["lm_eval"].items():
        lines += [
            f"| {task} | {metric.split(',')[0]} | {_number(value) if not isinstance(value, str) else value} |"
            for metric, value in metrics.items()
            if "stderr" not in metric
        ]
    lines += [
        "",
        "### Contamination (13-gram overlap with the training tokens)",
        "",
        "| eval set | items | items with overlap | 13-grams found |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {row['items']} | {row['contaminated_items']} | {_number(row['ngram_overlap'])} |"
        for name, row in ev["contamination"].items()
    ]
    return lines + [""]
