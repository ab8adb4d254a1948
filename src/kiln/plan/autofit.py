"""train.micro_batch: auto and train.activation_checkpointing: auto, decided from the memory estimate.

A step's speed and memory both grow with the micro-batch, and activation checkpointing trades
compute for memory. A hand-picked pair tends to leave memory idle (issue 29's ladder: the 774M arm
at micro-batch 8 with selective checkpointing used 80-85% of an H100), or not fit. With either
setting `auto`, the smoke stage picks it on the GPU it runs on, from kiln.plan.memory's estimate: of
every micro-batch that divides a rank's rows per step (so train.batch_tokens, and with it the
trajectory, stays what it was: only the gradient accumulation changes) and every checkpointing mode,
the pair predicted fastest among those whose step fits within FIT_FRACTION of the GPU's memory. The
plan records the pick and the train stage runs it (kiln.plan.steps.TrainPlan); `kiln plan` shows
what it would be on plan.gpu.

The speed model is deliberately simple, and the first GPU measurement should calibrate it: a
step's time per token is (1 + recompute) x (1 + HALF_SPEED_TOKENS / micro-batch tokens), where
recompute is the share of a step that checkpointing adds (a block's forward is about a third of its
forward and backward: full recomputes every block, selective every other one) and the second term is
what a micro-batch too small to fill the GPU's matmuls loses (a fixed cost per micro-batch).
"""

from __future__ import annotations

from dataclasses import replace

from kiln.config.models import ModelConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.plan.memory import AC_MODES, FIT_FRACTION, Estimate, estimate, fits, setting_of

AUTO = "auto"
RECOMPUTE = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}  # the step's extra compute, per mode
HALF_SPEED_TOKENS = 2048  # a micro-batch of this many tokens runs at half the speed of a large one (assumed)


def relative_step_time(micro_tokens: int, mode: str) -> float:
    """Time per token, up to a constant, of micro-batches of micro_tokens under checkpointing `mode`."""
    return (1 + RECOMPUTE[mode]) * (1 + HALF_SPEED_TOKENS / micro_tokens)


def resolve(
    train: TrainSection,
    model: ModelConfig,
    world: int,
    memory_gib: float,
    *,
    cuda: bool,
    bf16: bool | None = None,
    compiled: bool | None = None,
) -> tuple[TrainSection, str | None]:
    """`train` with micro_batch and activation_checkpointing concrete, and a line saying what auto
    picked and why (None when neither was auto). The step of `model` on `world` ranks of memory_gib
    each (a GPU; or a CPU's share of the host, cuda=False). A KilnError naming the settings when no
    pair fits."""
    micro_auto, ac_auto = train.micro_batch == AUTO, train.activation_checkpointing == AUTO
    if not (micro_auto or ac_auto):
        return train, None
    if train.batch_tokens is None:  # kiln.config.rules refuses it; a hand-built section may not have been checked
        raise KilnError("train.micro_batch: auto needs train.batch_tokens (the global batch the micro-batch divides)")
    rows = train.batch_tokens // (world * model.seq_len)  # one rank's rows per step
    micros = [m for m in range(rows, 0, -1) if rows % m == 0] if micro_auto else [train.micro_batch]
    modes = list(AC_MODES) if ac_auto else [train.activation_checkpointing]
    base = setting_of(
        train.replace(micro_batch=1, activation_checkpointing="none"),
        cuda=cuda,
        world=world,
        bf16=bf16,
        compiled=compiled,
    )
    fitting: list[tuple[float, int, str, Estimate]] = []
    for micro in micros:
        for mode in modes:
            s = replace(base, micro_batch=micro, grad_accum=rows // micro, activation_checkpointing=mode)
            if fits(est := estimate(model, s), memory_gib):
                fitting.append((relative_step_time(micro * model.seq_len, mode), -micro, mode, est))
    if not fitting:
        tried = f"micro-batches {micros[-1]}-{micros[0]}" if micro_auto else f"micro-batch {micros[0]}"
        raise KilnError(
            f"train.micro_batch / train.activation_checkpointing: auto: no step of {tried} with "
            f"{'any checkpointing' if ac_auto else train.activation_checkpointing + ' checkpointing'} fits in "
            f"{FIT_FRACTION:.0%} of {memory_gib:.1f} GiB per rank; try train.parallel: fsdp, more ranks or a "
            "shorter shard.seq_len (`kiln plan` shows the estimate)"
        )
    _, neg_micro, mode, est = min(fitting, key=lambda f: (f[0], f[1]))
    picked = train.replace(micro_batch=-neg_micro, activation_checkpointing=mode)
    why = (
        f"auto: micro-batch {picked.micro_batch} ({rows // picked.micro_batch} a step), activation checkpointing "
        f"{mode}: estimated {est.gib:.1f} GiB of {memory_gib:.1f} per rank, the fastest of {len(fitting)} that fit"
    )
    return picked, why
