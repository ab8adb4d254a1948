"""The held-out loss in the report: the model against the unigram baseline, where a continued run
started from, the reference figure measured elsewhere (eval.reference), per source and per kept
checkpoint."""

from __future__ import annotations

from kiln.eval.metrics.heldout.section import Reference
from kiln.eval.metrics.output import EvalOutput
from kiln.report.markdown import number


def tables(out: EvalOutput, data: dict) -> list[str]:
    ev = out.metrics
    return [
        "| metric | model | unigram baseline |",
        "|---|---:|---:|",
        f"| loss (nats/token) | {ev['val_loss']:.4f} | {ev['unigram_val_loss']:.4f} |",
        f"| bits per byte | {ev['val_bits_per_byte']:.4f} | {ev['unigram_bits_per_byte']:.4f} |",
        f"| perplexity | {ev['val_perplexity']:.2f} | |",
        "",
        *from_source(data.get("metrics", [])),
        *reference_line(data["config"].eval.reference),
        "### Per source",
        "",
        "| source | loss | perplexity | bits per byte | tokens evaluated |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {m['loss']:.4f} | {m['perplexity']:.2f} | {m['bits_per_byte']:.4f} | {m['tokens_evaluated']:,} |"
            for name, m in ev["val_by_source"].items()
        ),
        "",
        "### Checkpoints kept",
        "",
        "| step | tokens | val loss | bits per byte |",
        "|---:|---:|---:|---:|",
        *(
            f"| {number(c['step'])}{' (final)' if c['final'] else ''} | {number(c['tokens'])} | "
            f"{c['val_loss']:.4f} | {c['val_bits_per_byte']:.4f} |"
            for c in ev["checkpoints"]
        ),
        "",
    ]


def reference_line(reference: Reference | None) -> list[str]:
    """eval.reference as what it is, a figure measured on another machine or in a publication: its
    value, source, where and when, and no difference from this run's. The same plain loop scored 1.723
    bits per byte on a 2-core VM with AMX and 1.98 on one without (issue 60), so a gap between this
    run and a figure from elsewhere measures the machines as much as the runs."""
    if reference is None:
        return []
    name, figure = (
        ("val loss", reference.val_loss)
        if reference.val_loss is not None
        else ("bits per byte", reference.bits_per_byte)
    )
    return [
        f"Reference, measured elsewhere: {name} {figure:g} ({reference.source}), on {reference.measured_on}, "
        f"{reference.date}. Not measured in this run, so not compared with its figures.",
        "",
    ]


def from_source(metrics: list[dict]) -> list[str]:
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
