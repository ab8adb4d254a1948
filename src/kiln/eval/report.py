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
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train loss", lw=1.2)
    val = [r for r in records if "val_loss" in r]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss", lw=1.2)
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls="--", lw=1, label="unigram baseline (val)")
    ax.set_xlabel("optimizer step")
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
        f"| perplexity | {ev['val_perplexity']:.2f} | |",
        f"| FIM single-line exact match | {ev['infill_exact_match'] if ev['infill_exact_match'] is not None else 'n/a'} "
        f"({ev['infill_problems']} problems) | |", "",
        "## Samples", "",
    ]
    for row in data["samples"]["completions"]:
        lines += [f"Prompt `{row['prompt']!r}`, greedy:", "", _fence(row["prompt"] + row["greedy"]), "",
                  "sampled:", "", _fence(row["prompt"] + row["sampled"]), ""]
    lines += ["## Infilling examples", ""]
    for ex in data["samples"]["infill"][:5]:
        mark = "exact" if ex["exact_match"] else "miss"
        lines += [f"`{ex['doc_id']}` ({mark}): expected {ex['expected'].rstrip()!r}, got {ex['completion'].rstrip()!r}", ""]
    return "\n".join(lines) + "\n"
