"""results/<run>/report.md: what a run made, at a glance, with its loss curve."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss(records: list[dict], png: Path, unigram: float | None = None) -> None:
    """The loss curves, with the learning rate and throughput of the same log steps beneath."""
    fig, (ax, ax_lr, ax_speed) = plt.subplots(3, 1, figsize=(7, 7), dpi=120, sharex=True,
                                              gridspec_kw={"height_ratios": [3, 1, 1]})
    steps = [r["step"] for r in records]
    ax_lr.plot(steps, [r["lr"] for r in records], lw=1.2, color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_speed.plot(steps, [r["tokens_per_s"] for r in records], lw=1.2, color="tab:purple")
    ax_speed.set_ylabel("tokens/s")
    for a in (ax_lr, ax_speed):
        a.grid(alpha=0.3)
    ax.plot(steps, [r["loss"] for r in records], label="train loss", lw=1.2)
    val = [r for r in records if "val_loss" in r]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss", lw=1.2)
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls="--", lw=1, label="unigram baseline (val)")
    ax_speed.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, format="png")
    plt.close(fig)


def _fence(text: str) -> str:
    return "```\n" + text.replace("```", "ʼʼʼ") + "\n```"


def render(run: str, data: dict, png_name: str) -> str:
    """The report's markdown from the stages' JSON outputs (`data` keys: raw, tokenizer, tokens,
    shards, smoke, train, eval, samples)."""
    ev, tok, split, smoke, train = data["eval"], data["tokenizer"], data["tokens"]["splits"], data["smoke"], data["train"]
    lines = [
        f"# Kiln run `{run}`", "",
        "## Data", "",
        "| | documents | tokens | bytes |", "|---|---:|---:|---:|",
        *(f"| {s} | {split[s]['docs']:,} | {split[s]['tokens']:,} | {split[s]['bytes']:,} |" for s in ("train", "val")),
        "",
        f"Tokenizer: {tok['vocab_size']:,} tokens (padded to {tok['padded_vocab_size']:,}), "
        f"{tok['heldout_bytes_per_token']:.2f} bytes/token on {tok['heldout_docs']} held-out documents. "
        f"FIM modes on the train split: {data['tokens']['fim_modes']}.", "",
        f"Shards: {data['shards']['splits']['train']['rows']:,} train and {data['shards']['splits']['val']['rows']:,} "
        f"val rows of {data['shards']['row_len']} tokens.", "",
        "## Training", "",
        f"![loss curve]({png_name})", "",
        "| | value |", "|---|---:|",
        f"| parameters | {train['n_params']:,} |",
        f"| steps | {train['steps']:,} |",
        f"| tokens seen | {train['tokens_seen']:,} |",
        f"| tokens/s (steady state) | {train['tokens_per_s']:,.0f} |",
        f"| smoke check | {'passed' if smoke['passed'] else 'FAILED'}: {smoke['reason']} |",
        f"| smoke tokens/s | {smoke['tokens_per_s']:,.0f} |", "",
        "## Evaluation (held-out split)", "",
        "| metric | model | unigram baseline |", "|---|---:|---:|",
        f"| loss (nats/token) | {ev['val_loss']:.4f} | {ev['unigram_val_loss']:.4f} |",
        f"| bits per byte | {ev['val_bits_per_byte']:.4f} | {ev['unigram_bits_per_byte']:.4f} |",
        f"| perplexity | {ev['val_perplexity']:.2f} | |", "",
        *_eval_tables(ev),
        "## Samples", "",
    ]
    for row in data["samples"]["completions"]:
        lines += [f"Prompt `{row['prompt']!r}`, greedy:", "", _fence(row["prompt"] + row["greedy"]), "",
                  "sampled:", "", _fence(row["prompt"] + row["sampled"]), ""]
    lines += ["## Infilling examples", ""]
    for ex in data["samples"]["infill"][:6]:
        mark = "exact" if ex["exact_match"] else f"similarity {ex['edit_similarity']:.2f}"
        lines += [f"`{ex['doc_id']}` ({ex['span']}, {ex['layout']}, {mark}):", "",
                  "expected:", "", _fence(ex["expected"].rstrip()), "", "got:", "", _fence(ex["completion"].rstrip()), ""]
    return "\n".join(lines) + "\n"


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _eval_tables(ev: dict) -> list[str]:
    """Infilling, lm-eval and contamination tables of the eval stage's metrics."""
    lines = ["### Fill-in-the-middle (held-out code)", "",
             "| span / layout | problems | exact match | edit similarity |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {row['problems']} | {_number(row['exact_match'])} | {_number(row['edit_similarity'])} |"
              for name, row in ev["infill"].items()]
    lines += ["", "### lm-evaluation-harness", "", "| task | metric | value |", "|---|---|---:|"]
    for task, metrics in ev["lm_eval"].items():
        lines += [f"| {task} | {metric.split(',')[0]} | {_number(value) if not isinstance(value, str) else value} |"
                  for metric, value in metrics.items() if "stderr" not in metric]
    lines += ["", "### Contamination (13-gram overlap with the training tokens)", "",
              "| eval set | items | items with overlap | 13-grams found |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {row['items']} | {row['contaminated_items']} | {_number(row['ngram_overlap'])} |"
              for name, row in ev["contamination"].items()]
    return lines + [""]
