"""The smoke section: the gate's thresholds and the probe's length, each declared once (kiln.config.declare)."""

from __future__ import annotations

from typing import ClassVar

from kiln.config.declare import DOLLARS, GATE, OUTPUT, RUN, Number, Section, group, reads, setting


class Overfit(Section):
    """overfit: a fresh model trained on a few fixed rows (FIM rows first) must memorise them."""

    KEY: ClassVar[str] = "smoke.overfit"
    rows: int = setting(4, "Fixed rows the fresh model trains on.", GATE, ge=1)
    max_steps: int = setting(150, "Steps it may take to reach max_loss.", GATE, ge=1)
    max_loss: Number = setting(1.0, "Loss (nats) the rows must reach within max_steps.", GATE, gt=0)


class SmokeSection(Section):
    """The gate before the full run (kiln.gate.checks): checks that each pass or fail against a
    threshold here, and the measurements the plan (smoke/plan.md) is made from."""

    KEY: ClassVar[str] = "smoke"
    steps: int = setting(
        30, ("Optimizer steps of the probe run, on the full run's model, batch and parallelism."), GATE, ge=2
    )
    warmup_steps: int = setting(
        3, ("Probe steps left out of the throughput (compilation, allocator warm-up); below steps."), GATE, ge=0
    )
    min_loss_drop: Number = setting(
        0.05,
        "health: the probe's last-quarter mean loss must sit this far (nats) below the first quarter's.",
        GATE,
        ge=0,
    )
    val_batches: int = setting(4, "Held-out batches for the init-loss and generalisation checks.", GATE, ge=1)
    min_val_drop: Number = setting(
        0.05, ("generalisation: the held-out loss must fall this far (nats) over the probe."), GATE
    )
    init_loss_tolerance: Number = setting(
        1.0, ("init loss: the untrained model's held-out loss must lie this close (nats) to ln(vocab)."), GATE, gt=0
    )
    causal_tolerance: Number = setting(
        0.0001, ("causality: largest change allowed in earlier logits when later tokens change."), GATE, gt=0
    )
    max_data_wait: Number = setting(
        0.25, "data: the largest share of step time spent waiting for batches.", GATE, ge=0, le=1
    )
    min_token_entropy: Number = setting(
        3.0,
        "tokens: the least unigram entropy (bits/token) of the training tokens; BPE on text gives ~9-11.",
        GATE,
        ge=0,
    )
    overfit: Overfit = group(Overfit)
    gate: bool = setting(
        True,
        (
            "false runs and reports every check but lets train start even when some fail (the report says the"
            " gate was skipped)."
        ),
        GATE,
    )
    precision_steps: int = setting(
        6,
        (
            "With train.precision auto on a CPU, timed steps of bf16 and of fp32 each (after warmup_steps) "
            "before the probe; the faster is the run's precision."
        ),
        reads("the steps that pick train.precision auto's precision", smoke=OUTPUT),
        ge=1,
    )
    price_per_gpu_hour: Number | None = setting(
        None,
        "Price of one device for one hour, for the plan's cost (null leaves the cost out).",
        reads("the plan's cost; a budget in dollars buys steps at it", plan=OUTPUT, train=DOLLARS),
        ge=0,
    )
    profile_step: int | None = setting(
        None,
        (
            "A probe step to trace with torch.profiler (smoke/trace.json, for Perfetto) and, on CUDA, "
            "snapshot memory (smoke/memory_snapshot.pickle, for pytorch.org/memory_viz); null: none."
        ),
        reads("a trace beside the report, not part of it", smoke=RUN),
        ge=1,
    )
