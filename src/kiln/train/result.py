"""What a training run reports back to its caller (the train stage's script, the benches, the tests):
losses at log and validation steps, throughput, memory and where the run started from. The figures
come from kiln.train.metrics.Throughput; Trainer.fit fills one per run (kiln.train.trainer)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunResult:
    """What a run reports back: per-log-step losses, throughput and memory."""

    losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_s: float = 0.0
    tflops: float = 0.0  # achieved, per device
    step_time_s: float = 0.0
    data_wait_fraction: float = 0.0
    peak_memory_mb: float = 0.0
    peak_reserved_mb: float | None = None  # the CUDA allocator's peak hold (kiln.train.metrics.reserved_mb)
    mfu: float | None = None
    mfu_torchtitan: float | None = (
        None  # the same under torchtitan's transformers-backend FLOP count (kiln.train.metrics)
    )
    n_params: int = 0
    tokens_per_step: int = 0
    grad_accum: int = 1
    steps: int = 0
    start_step: int = 0  # the step this job resumed from: equal to steps when it had nothing left to train
    tokens_seen: int = 0
    wall_s: float = 0.0  # the loop's wall time in this process, validation and checkpoints included
    is_main: bool = True  # rank 0, the rank that writes reports
    init_from: str | None = None  # where the initial weights came from (train.init_from), None: a random init
    mirror_failures: int = 0  # checkpoint copies to train.checkpoint_mirror that failed in this job (kiln.train.mirror)
    cooldown_from: int | None = None  # the step wsd's cooldown began at (kiln.train.schedule), None for the others
    budget: dict | None = None  # a budgeted run's budget, spent seconds, planned and final steps (kiln.train.budget)

    def set_rates(self, rates: dict) -> None:
        """The run's rates (kiln.train.metrics.Throughput.rates: tokens/s, TFLOP/s, MFU), and the step
        time they imply."""
        self.tokens_per_s, self.tflops, self.mfu = rates["tokens_per_s"], rates["tflops"], rates["mfu"]
        self.mfu_torchtitan = rates["mfu_torchtitan"]
        self.step_time_s = self.tokens_per_step / self.tokens_per_s if self.tokens_per_s else 0.0
