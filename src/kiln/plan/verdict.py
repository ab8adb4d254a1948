"""The smoke gate's verdict: the one object the smoke stage hands to train and to the report.

smoke/report.json is its only on-disk form, and this module its only reader and writer, so the
stages share a type rather than a string they agree on. Torch-free: the report stage reads it
without importing torch.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kiln.config.batch import BatchSplit
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.plan.steps import StageTimes, build_plan

# Bumped whenever the layout of report.json changes, so that a report written by another version
# of kiln is refused with a clear message instead of half-read.
VERSION = 2
# A train job's host memory per node (Measurements.node_memory_mb): the smoke stage measures a rank after
# its compile, probe steps and a timed checkpoint (rank 0 gathers a full-format one in host memory); the
# full run may recompile (a new shape at validation) and its data stream and logs grow, hence the headroom.
HOST_MEMORY_HEADROOM = 1.5
LAUNCHER_MB = 1024  # torchrun, and the Snakemake job around it
_HEADER = ("version", "gate", "checks")


@dataclass(frozen=True)
class Check:
    """One check of the gate (kiln.gate.checks lists them) against its threshold in the smoke section."""

    name: str
    passed: bool
    figure: str  # what was measured
    threshold: str  # what it had to meet
    detail: str = ""


@dataclass(frozen=True)
class Probe:
    """Steady-state measurements of the probe run."""

    tokens_per_s: float
    step_time_s: float
    data_wait_fraction: float
    peak_memory_mb: float
    mfu: float | None
    tflops: float
    measured_steps: int
    mfu_torchtitan: float | None = (
        None  # the same throughput under torchtitan's transformers-backend FLOP count (kiln.train.metrics)
    )
    warmup_s: float = 0.0  # the warm-up steps before the timed ones (compilation on a compiled run)
    peak_reserved_mb: float | None = None  # on a GPU, the caching allocator's peak hold beside peak_memory_mb
    graphs_in_timed_steps: int = 0  # dynamo graphs compiled after the warm-up: recompiles, which the gate fails


@dataclass(frozen=True)
class Measurements:
    """What the probe measured and the facts of the run that the plan needs."""

    probe: Probe
    losses: tuple[float, ...]
    grad_norms: tuple[float, ...]
    val_loss_init: float
    val_loss_after: float
    n_params: int
    checkpoint_bytes: int
    model_bytes: int
    train_tokens: int
    batch: BatchSplit
    device: str
    world: int
    times: StageTimes  # what train spends besides steps, for a budget's step count
    precision: str  # what the probe ran: train.precision, or auto's pick
    precision_tokens_per_s: dict[str, float] = field(default_factory=dict)  # auto's candidates, timed
    precision_why: str = (
        ""  # how auto picked it, in words (kiln.gate.checks.pick_precision; "": named, or an older report)
    )
    checkpoint_written_bytes: int = 0  # on disk, the checkpoint timed for times.checkpoint_s (0: an older report)
    activation_checkpointing: str = "none"  # what the probe ran: train's, or auto's pick (an older report: none)
    host_mb_per_rank: float = 0.0  # the most host memory a rank held, compile workers' included (0: an older report)
    attention_kernel: str = ""  # kiln.model.sdpa.kernel_name's for a training row ("": an older report)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurements:
        """From the plain form that kiln.gate.checks.run_checks returns and report.json holds."""
        return cls(
            **{
                **d,
                "probe": Probe(**d["probe"]),
                "batch": BatchSplit(**d["batch"]),
                "times": StageTimes(**d["times"]),
                "losses": tuple(d["losses"]),
                "grad_norms": tuple(d["grad_norms"]),
            }
        )

    def node_memory_mb(self, ranks_per_node: int) -> int | None:
        """Host memory a train job asks of each node: its ranks' measured host memory (kiln.train.metrics.
        host_memory_mb, after the probe's compile and steps) with HOST_MEMORY_HEADROOM for what the full run
        adds (validation, checkpoint buffers, a recompile) and LAUNCHER_MB for torchrun. None for a report
        without the figure."""
        if not self.host_mb_per_rank:
            return None
        return math.ceil(ranks_per_node * self.host_mb_per_rank * HOST_MEMORY_HEADROOM + LAUNCHER_MB)

    def plan(self, train: TrainSection, price_per_gpu_hour: float | None) -> dict:
        """smoke/plan.json: the full run's plan at the measured speed and stage times (build_plan,
        which `kiln plan` calls with its assumed ones), and the precision, micro-batch and activation
        checkpointing the probe ran (auto's picks among them), which train runs."""
        return build_plan(
            train,
            price_per_gpu_hour,
            batch=self.batch,
            times=self.times,
            tokens_per_s=self.probe.tokens_per_s,
            n_params=self.n_params,
            train_tokens=self.train_tokens,
            checkpoint_bytes=self.checkpoint_bytes,
            model_bytes=self.model_bytes,
        ) | {
            "precision": self.precision,
            "precision_tokens_per_s": self.precision_tokens_per_s,
            "precision_why": self.precision_why,
            "activation_checkpointing": self.activation_checkpointing,
        }


class Gate(enum.Enum):
    PASSED = "passed"  # every check passed
    SKIPPED = "skipped"  # a check failed but smoke.gate is false: train may start anyway
    FAILED = "failed"  # a check failed and the gate is on: train must not start


@dataclass(frozen=True)
class SmokeReport:
    """The gate's checks, its outcome, and the probe's measurements: smoke/report.json."""

    checks: tuple[Check, ...]
    gate: Gate
    measurements: Measurements | None  # None when the probe never ran (out of memory in preflight)

    def __post_init__(self) -> None:
        if (self.gate is Gate.PASSED) == bool(self.failed):
            raise ValueError(f"gate {self.gate.value!r} does not match the failed checks {list(self.failed)}")

    @classmethod
    def judge(cls, checks: Sequence[Check], measurements: Measurements | None, enforce: bool) -> SmokeReport:
        """The verdict on `checks`; `enforce` is smoke.gate (false lets a failed run through)."""
        failed = any(not c.passed for c in checks)
        gate = Gate.PASSED if not failed else Gate.FAILED if enforce else Gate.SKIPPED
        return cls(tuple(checks), gate, measurements)

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if not c.passed)

    @property
    def summary(self) -> str:
        """The gate in words, as the stage log, report.json and report.md show it."""
        if self.gate is Gate.PASSED:
            return "passed"
        names = ", ".join(self.failed)
        return f"skipped (smoke.gate is false; failed: {names})" if self.gate is Gate.SKIPPED else f"failed: {names}"

    def require_passed(self) -> None:
        """Raise unless train may start: every check passed, or smoke.gate is false."""
        if self.gate is Gate.FAILED:
            raise KilnError(
                f"smoke: FAILED: {', '.join(self.failed)} (thresholds are in the smoke section, "
                "and smoke.gate: false lets train start anyway)"
            )

    def save(self, path: str | Path) -> None:
        # The measurements sit beside the checks at the top level, as report.json has always had them.
        measured = asdict(self.measurements) if self.measurements is not None else {}
        write_json(
            path, {"version": VERSION, "gate": self.summary, "checks": [asdict(c) for c in self.checks], **measured}
        )

    @classmethod
    def load(cls, path: str | Path) -> SmokeReport:
        """The report at `path`; a KilnError naming the file when it is missing, torn or not this
        version's."""
        path = Path(path)
        rerun = "rerun the smoke stage"
        try:
            data = read_json(path)
        except FileNotFoundError:
            raise KilnError(f"{path}: no smoke report there; run the smoke stage first") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KilnError(f"{path}: not a complete smoke report (invalid JSON: {exc}); {rerun}") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            found = data.get("version", "none") if isinstance(data, dict) else "none"
            raise KilnError(
                f"{path}: a smoke report from another version of kiln (format version {found}, "
                f"this kiln reads {VERSION}); {rerun}"
            )
        try:
            gate = Gate(re.match(r"[a-z]*", data["gate"]).group())  # the summary's first word
            measured = {k: v for k, v in data.items() if k not in _HEADER}
            return cls(
                tuple(Check(**c) for c in data["checks"]), gate, Measurements.from_dict(measured) if measured else None
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KilnError(f"{path}: not a valid smoke report ({type(exc).__name__}: {exc}); {rerun}") from None
