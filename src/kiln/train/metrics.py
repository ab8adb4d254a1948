"""Throughput accounting and the metrics sink shared by console, metrics.jsonl and wandb.

FLOPs per token, two conventions, both reported (log records, the smoke report, the report stage):
- Kiln's (PaLM appendix B; nanoGPT's estimate_mfu), `mfu`: 6N + 12*L*H*Q*T. N is the parameter count
  without the tables that are only looked up (GPT-2's positions; the token table unless it is tied
  to the head), so 6N is the forward (2N) and backward (4N) matmul work; 12*L*H*Q*T adds the
  attention scores and the weighted sum of values (L layers, H heads, Q head dim, T sequence
  length), with no discount for the causal mask.
- torchtitan's transformers-backend count, `mfu_torchtitan`: 6*(N - embedding parameters) +
  6*L*H*Q*T: the attention term halved for causality, and a tied embedding left out of N (it is
  counted as the head here). That backend (torchtitan/experiments/transformers_modeling_backend)
  passes head_dims = Q to get_dense_model_nparams_and_flops; torchtitan's native llama3 passes
  2*Q, so its own count is 6*(N - embeddings) + 12*L*H*Q*T: Kiln's attention term, and lower than
  Kiln's only by the tied embedding. Seed 000 ran the transformers backend, so this column is the
  one to hold against its log; it is not "torchtitan's MFU" for a native torchtitan model.
The same run reads higher MFU under Kiln's: seed 000's Llama-3.2-1B at seq 8192, 55.8k tokens/s per
H100 (kiln.plan.anchors.SEED_000), is 53.4% here and 42.0% under the transformers-backend count; its
log line at 55,314 tokens/s printed "mfu: 41.66%", which this count reproduces (tests/unit/plan/test_anchors.py).

MFU divides achieved FLOP/s per device by the device's dense bf16 peak (kiln.plan.peaks). CPUs have
no entry: MFU is reported on known GPUs only (nanoGPT's hard-coded A100 figure reports >100% on an H100).

Throughput counts training time only: a checkpoint save or a validation inside a window is run
under `paused()` and its time left out of that window's tokens/s and of the steady-state rate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import secrets
import string
import time
from pathlib import Path
from typing import Callable

import psutil
import torch

from kiln import layout
from kiln.errors import KilnError
from kiln.io import atomic_file
from kiln.plan.peaks import peak_flops_of

log = logging.getLogger("kiln.train")


def flops_per_token(model: torch.nn.Module) -> float:
    """From the model's shape (ModelConfig.flops_per_token), so a sharded model counts whole."""
    return model.config.flops_per_token()


def flops_per_token_torchtitan(model: torch.nn.Module) -> float:
    """torchtitan transformers-backend count for the same shape (ModelConfig.flops_per_token_torchtitan)."""
    return model.config.flops_per_token_torchtitan()


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 FLOP/s of one device, or None where unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    peak = peak_flops_of(torch.cuda.get_device_name(device))
    if peak is None:
        log.warning("no bf16 peak known for %s: MFU not reported", torch.cuda.get_device_name(device))
    return peak


def memory_mb(device: torch.device) -> float:
    """Peak memory so far: allocated by tensors on a GPU, resident set of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def host_memory_mb() -> float:
    """The host memory this rank holds: its own peak resident set, plus what its child processes hold
    now (inductor's compile workers, TORCHINDUCTOR_COMPILE_THREADS of them, which live as long as the
    rank does). What the train job asks of a node per rank (kiln.plan.verdict.Measurements.node_memory_mb)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    children = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that ended meanwhile
            children += child.memory_info().rss
    return own + children / 2**20


def reserved_mb(device: torch.device) -> float | None:
    """Peak memory the CUDA caching allocator held so far (what an OOM is measured against: tensors
    plus the allocator's cached and fragmented blocks); None on a CPU, where memory_mb is the figure."""
    return torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None


class Throughput:
    """Tokens/s, TFLOP/s per device and MFU over each log window. The first window pays one-off
    costs (allocator warm-up, compilation) and is left out of the steady-state rate unless it is the
    only one. Call `window` right after a host sync (the loss .item()), so the time is the device's."""

    def __init__(
        self,
        flops_token: float,
        peak: float | None,
        world: int,
        flops_token_torchtitan: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.flops_token, self.peak, self.world = flops_token, peak, world
        self.flops_token_torchtitan = flops_token_torchtitan
        self.clock = clock
        self.window_start = clock()
        self.paused_s = 0.0  # time inside paused() since window_start
        self.timed_tokens, self.timed_s, self.first = 0, 0.0, True

    def window(self, tokens: int, last: bool = False) -> dict:
        now = self.clock()
        elapsed, self.window_start = now - self.window_start - self.paused_s, now
        self.paused_s = 0.0
        if not self.first or last:
            self.timed_tokens += tokens
            self.timed_s += elapsed
        self.first = False
        return self.rates(tokens / elapsed)

    def rates(self, tokens_per_s: float) -> dict:
        flops = self.flops_token * tokens_per_s / self.world  # per device
        out = {"tokens_per_s": tokens_per_s, "tflops": flops / 1e12, "mfu": flops / self.peak if self.peak else None}
        if self.flops_token_torchtitan is not None:
            tt = self.flops_token_torchtitan * tokens_per_s / self.world
            out["mfu_torchtitan"] = tt / self.peak if self.peak else None
        return out

    @contextlib.contextmanager
    def paused(self):
        """Leave what runs inside (a checkpoint save, a validation) out of the current window."""
        start = self.clock()
        try:
            yield
        finally:
            self.paused_s += self.clock() - start

    def restart(self) -> None:
        """Start the next window now, leaving out what ran since the last one (validation)."""
        self.window_start = self.clock()
        self.paused_s = 0.0

    @property
    def steady_tokens_per_s(self) -> float:
        return self.timed_tokens / self.timed_s if self.timed_s else 0.0


def wandb_run_id(train_dir: Path) -> str:
    """The W&B run id of the trajectory in train_dir: the one in wandb/run_id, or a new one written
    there (8 characters of [0-9a-z], as wandb makes them)."""
    path = Path(train_dir) / layout.WANDB / layout.WANDB_ID
    if path.is_file():
        run_id = path.read_text(encoding="utf-8").strip()
        if run_id:
            return run_id
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        tmp.write_text(run_id + "\n", encoding="utf-8")
    return run_id


class MetricsSink:
    """One JSON object per line in metrics.jsonl, and one per generated sample in samples.jsonl
    beside it, mirrored to wandb when enabled (rank 0 only).

    wandb's mode is decided before wandb.init: online without a network stalls for ~90 s, offline
    writes the run under the metrics folder (wandb/offline-run-*, `wandb sync` uploads it later).

    The W&B run id is kept in wandb/run_id (kiln.layout.WANDB_ID) and handed to wandb.init with
    resume="allow": a job resumed after a preemption or a time limit continues the same W&B run
    rather than open a new one, and a trajectory started over takes a new id (the wandb/ folder
    is set aside with its checkpoints, kiln.layout.TRAJECTORY)."""

    def __init__(self, path: Path, wandb_cfg: dict, run_config: dict, enabled: bool = True, resume_step: int = 0):
        self.enabled = enabled
        self.file = self._open(path, resume_step) if enabled else None
        self.samples_file = self._open(path.with_name(layout.SAMPLES), resume_step) if enabled else None
        self.wandb = None
        if enabled and wandb_cfg["mode"] != "disabled":
            import wandb

            self.wandb = wandb.init(
                project=wandb_cfg["project"],
                mode=wandb_cfg["mode"],
                dir=str(path.parent),
                id=wandb_run_id(path.parent),
                resume="allow",
                config=run_config,
                settings=wandb.Settings(silent=True, console="off"),
            )

    @staticmethod
    def _open(path: Path, resume_step: int):
        """Open for appending, first dropping records past the step a resumed run restarts from
        (a run killed after its last checkpoint logged steps that will now be redone) and a last
        line torn by a kill mid-write."""
        kept = []
        if resume_step and path.exists():
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            records = []
            for number, line in enumerate(lines, 1):
                try:
                    records.append((line, json.loads(line)))
                except ValueError:
                    if number < len(lines):  # only the last line can be torn by a kill: this is damage
                        raise KilnError(f"{path}: line {number} is not JSON: {line[:80]!r}") from None
                    log.warning("%s: dropped its last line, torn by a kill mid-write: %r", path, line[:80])
            kept = [line for line, record in records if record["step"] <= resume_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        return open(path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=record["step"])

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Generated text at `step`: rows of {"prompt", "completion"} and how it was decoded ("decoding")."""
        if not self.enabled or not rows:
            return
        for row in rows:
            self.samples_file.write(json.dumps({"step": step, **row}) + "\n")
        self.samples_file.flush()
        if self.wandb is not None:
            import wandb

            table = wandb.Table(
                columns=["step", "prompt", "completion", "decoding"],
                data=[[step, r["prompt"], r["completion"], r.get("decoding", "")] for r in rows],
            )
            self.wandb.log({"samples": table}, step=step)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.samples_file.close()
        if self.wandb is not None:
            self.wandb.finish()
