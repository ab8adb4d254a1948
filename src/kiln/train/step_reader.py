"""The host's side of the GPU run-ahead: what the trainer has not read yet of the steps it queued, and
what it does once it reads them.

A step's loss, gradient norm and flags ([non-finite, stop signal], agreed by every rank) stay device
tensors (StepRecord) until the host syncs, at log and checkpoint steps (kiln.train.trainer): then one
transfer reads every unread step at once. Between syncs the only read is of the previous step's stop
flag (stop_requested), which waits for that step alone, so the host stays one step ahead: each step's
flags are copied to the host as the step is queued (HostCopy), and the read waits for that copy, not
for the work queued after it. (`.item()` on the device tensor would not do: on CUDA it waits for the
whole stream, the newest step's forward and backward included, and the device then idles while the
host queues the next step's first kernels.)

Reading applies train.nonfinite (a step that was not applied is logged, and ends the run on `stop`
or past max_skips) and the loss spike check (kiln.train.health), and keeps the window of losses the
next log line reports. The reads come before any save, so a checkpoint never holds a step past a
non-finite one the policy stops on.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from kiln.config.train_sections import NonFinite
from kiln.errors import ExitCode, RunStopped
from kiln.train.distributed import mean_across_ranks
from kiln.train.health import SpikeDetector

log = logging.getLogger("kiln.train")


class HostCopy:
    """A device tensor's values on the host, copied behind the work queued so far: reading them waits
    for that work alone, not for what is queued after the copy. On CUDA: a non-blocking copy into
    pinned memory and an event recorded after it; elsewhere the tensor is read when asked (a CPU
    tensor is on the host already, and computed: CPU ops run as they are called)."""

    def __init__(self, tensor: torch.Tensor):
        self._ready = None
        if tensor.device.type == "cuda":
            self._values = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._values.copy_(tensor, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._values = tensor

    def get(self) -> torch.Tensor:
        """The values, on the host: waits for the copy (and what was queued before it) to be done."""
        if self._ready is not None:
            self._ready.synchronize()
            return self._values
        return self._values.cpu()


@dataclass(frozen=True)
class StepRecord:
    """One step the host has not read: device tensors, reading them is a host sync; and the step's
    flags on their way to the host (host_flags, made as the record is: right after the step is queued)."""

    step: int  # the optimizer step just run (1-based, as metrics.jsonl counts)
    loss: torch.Tensor  # this rank's mean loss over the step's micro-batches
    grad_norm: torch.Tensor  # the global gradient norm (before clipping)
    flags: torch.Tensor  # [non-finite, stop signal], the max over ranks (Trainer.train_step)
    host_flags: HostCopy = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_flags", HostCopy(self.flags))

    @property
    def nonfinite(self) -> torch.Tensor:
        """Nonzero when the loss or gradient norm was not finite on some rank (the update was skipped)."""
        return self.flags[0]

    @property
    def stop_requested(self) -> torch.Tensor:
        """Nonzero when some rank had received a preemption signal by this step."""
        return self.flags[1]


@dataclass
class Window:
    """What the host has read of the steps since the last log line."""

    losses: list[float] = field(default_factory=list)  # the applied steps' losses (mean over ranks)
    skipped: list[int] = field(default_factory=list)  # steps not applied (non-finite)
    spikes: list[int] = field(default_factory=list)

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan

    def events(self) -> dict:
        return {k: v for k, v in (("skipped_steps", self.skipped), ("spike_steps", self.spikes)) if v}


class StepReader:
    """The unread steps of one rank, the window since the last log line, and the count of skipped
    steps (part of the trainer's state: a resumed run counts on from it)."""

    def __init__(self, nonfinite: NonFinite, spikes: SpikeDetector, world: int, is_main: bool):
        self.policy, self.spikes, self.world, self.is_main = nonfinite, spikes, world, is_main
        self.unread: list[StepRecord] = []
        self.window = Window()
        self.skipped = 0  # batches whose update was not applied (non-finite loss or gradient)

    def add(self, record: StepRecord) -> None:
        self.unread.append(record)

    def stop_requested(self, synced: bool) -> bool:
        """Whether a rank got a preemption signal, decided alike on every rank: from the newest step's
        flags where the host syncs anyway (`synced`: log and checkpoint steps), else from the step
        before it (its host copy: the read waits for that step alone, and the host stays one step ahead)."""
        if synced:
            return self.unread[-1].stop_requested.item() > 0
        # Unread, the previous step is the one before the newest; read, its flags were read then.
        return len(self.unread) > 1 and self.unread[-2].host_flags.get()[1].item() > 0

    def take_window(self) -> Window:
        """The window since the last log line; the next one starts empty."""
        window, self.window = self.window, Window()
        return window

    def read(self, last_checkpoint: Callable[[], str]) -> RunStopped | None:
        """Read every unread step (one host sync): a step that was not applied is logged and ends the
        run (train.nonfinite: stop, or skip past max_skips); loss spikes are logged. Returns the
        RunStopped to raise, if any, its message naming `last_checkpoint()`."""
        unread, self.unread = self.unread, []
        if not unread:
            return None
        losses = mean_across_ranks(torch.stack([u.loss for u in unread]), self.world)
        norms = torch.stack([u.grad_norm for u in unread]).float()
        rows = torch.stack([losses, norms, torch.stack([u.nonfinite for u in unread])]).tolist()
        for step, loss, norm, bad in zip([u.step for u in unread], *rows):
            if bad:
                stopped = self._not_applied(step, loss, norm, last_checkpoint)
                if stopped is not None:
                    return stopped
                continue
            self.window.losses.append(loss)
            ratio = self.spikes.update(loss)
            if ratio is not None:
                self.window.spikes.append(step)
                if self.is_main:
                    log.warning(
                        "step %d: loss spike: %.4f is %.1fx the running average %.4f (train.spike_factor %g)",
                        step,
                        loss,
                        ratio,
                        loss / ratio,
                        self.spikes.factor,
                    )
        return None

    def _not_applied(
        self, step: int, loss: float, norm: float, last_checkpoint: Callable[[], str]
    ) -> RunStopped | None:
        policy = self.policy
        self.skipped += 1
        self.window.skipped.append(step)
        if self.is_main:
            log.warning(
                "step %d: loss %s, gradient norm %s: not finite on some rank; update not applied "
                "(%d skipped in this run)",
                step,
                loss,
                norm,
                self.skipped,
            )
        if policy.action != "stop" and self.skipped <= policy.max_skips:
            return None
        why = (
            "train.nonfinite.action is stop"
            if policy.action == "stop"
            else f"{self.skipped} batches skipped, more than train.nonfinite.max_skips {policy.max_skips}"
        )
        return RunStopped(
            f"train: step {step}: loss {loss}, gradient norm {norm}: not finite, so not applied, and "
            f"the run stopped ({why}); nothing after it was saved. Last good checkpoint: "
            f"{last_checkpoint()}, where a rerun resumes. Lower train.lr, raise "
            "train.warmup_steps or check the data; train.nonfinite.action: skip drops such batches",
            ExitCode.NONFINITE,
        )
