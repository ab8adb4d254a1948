"""Fault injection: KILN_FAULT makes a named fault happen at a given step of the train stage, so the
tests (and a drill on a real cluster) exercise the code that handles it, not a patched copy.

    KILN_FAULT="kind@step[:rank][,kind@step[:rank]...]"     e.g. KILN_FAULT="nan_loss@7,sigterm@13:1"
    KILN_FAULT="stall@step[:seconds[:rank]]"                e.g. KILN_FAULT="stall@120:30" (every rank)

`step` is the optimizer step being run (1-based, as metrics.jsonl counts); without `:rank` every
rank has the fault. Kinds:

    nan_loss        the step's loss (and so its gradients) is NaN
    inf_grad        one gradient entry is +inf after the backward pass (the loss stays finite)
    spike           the step's loss is 10x what it was (a loss spike; the gradient is clipped as usual)
    sigterm         the rank sends itself SIGTERM as the step starts (what Slurm sends)
    sigusr1         ... SIGUSR1 (what `sbatch --signal=USR1@<s>` sends)
    sigterm_parent  the rank sends SIGTERM to its parent process (torchrun, which passes it on)
    sigusr1_parent  ... SIGUSR1 (torchrun passes it on when kiln.train.launch started it)
    sigkill         the rank SIGKILLs itself as the step starts (a node lost, the OOM killer)
    kill_in_save    the checkpoint of this step is SIGKILLed half-written (its file written, not renamed)
    enospc          writing the checkpoint of this step fails with ENOSPC (a full disk)
    stall           the rank sleeps `seconds` (STALL_S when not given) as the step starts: a slow
                    compilation, a slow node, a process taken off the CPU by its neighbours
    oom             the rank runs out of memory as the step starts (torch.OutOfMemoryError), in the
                    smoke stage's probe as in train: an OOM on some ranks only
    hold            the rank waits as the step starts (sleeping, not spinning) until it has itself
                    received a preemption signal (SIGTERM or SIGUSR1), then runs the step; the ranks
                    then save the same step and exit 75 as for any preemption: a job that runs until it
                    is signalled, e.g. Slurm's time-limit warning, however fast the machine trains

Trainer.fit (the train stage) reads it at its start, and the smoke stage before its probe (whose steps
call `before_step` too, so an injected oom is met where a real one is). The training loop reaches the faults through three hooks, so it carries no fault branches of its own:
`before_step` (signals, hold) at the top of each step, `on_loss` on each micro-batch's loss and
`on_grads` once the gradients are in; with nothing planned (NONE) each is a set lookup and no more.
"""

from __future__ import annotations

import errno
import math
import os
import re
import signal
import time
from dataclasses import dataclass

import torch

from kiln.errors import KilnError

ENV = "KILN_FAULT"
KINDS = (
    "nan_loss",
    "inf_grad",
    "spike",
    "sigterm",
    "sigusr1",
    "sigterm_parent",
    "sigusr1_parent",
    "sigkill",
    "kill_in_save",
    "enospc",
    "hold",
    "oom",
    "stall",
)
SPIKE_FACTOR = 10.0
_SIGNALS = {"sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1, "sigkill": signal.SIGKILL}
HOLD_POLL_S = 0.2  # how often a held rank looks for the signal
STALL_S = 5.0  # how long a stalled rank sleeps, unless its item says
_ITEM = re.compile(r"(?P<kind>\w+)@(?P<step>\d+)(?::(?P<rank>\d+))?")
_STALL = re.compile(r"stall@(?P<step>\d+)(?::(?P<seconds>\d+(?:\.\d*)?)(?::(?P<rank>\d+))?)?")


@dataclass(frozen=True)
class Faults:
    """The faults of one process (one rank): {(kind, step)}, and each stalled step's seconds."""

    planned: frozenset[tuple[str, int]] = frozenset()
    stall_s: tuple[tuple[int, float], ...] = ()  # (step, seconds) of each stall

    def __bool__(self) -> bool:
        return bool(self.planned)

    def at(self, kind: str, step: int) -> bool:
        return (kind, step) in self.planned

    def before_step(self, step: int, stop) -> None:
        """At the start of `step`: send the signals planned for it; then, if hold is planned for it,
        wait until `stop` (the trainer's kiln.train.preemption.StopSignal) has received a preemption
        signal, in short sleeps: the signal handler runs between them."""
        for kind, sig in _SIGNALS.items():
            if self.at(kind, step):
                os.kill(os.getpid(), sig)
        for kind, sig in (("sigterm_parent", signal.SIGTERM), ("sigusr1_parent", signal.SIGUSR1)):
            if self.at(kind, step):
                os.kill(os.getppid(), sig)
        if self.at("stall", step):
            time.sleep(dict(self.stall_s)[step])
        if self.at("oom", step):
            raise torch.OutOfMemoryError(f"out of memory ({ENV}=oom@{step})")
        if self.at("hold", step):
            while stop.received is None:
                time.sleep(HOLD_POLL_S)

    def on_loss(self, loss, step: int, micro: int):
        """Micro-batch `micro`'s loss at `step`, as nan_loss (the first micro-batch) and spike make it."""
        if self.at("nan_loss", step) and micro == 0:
            loss = loss * math.nan
        if self.at("spike", step):
            loss = loss * SPIKE_FACTOR
        return loss

    def on_grads(self, params: list, step: int) -> None:
        """After the backward pass of `step`: inf_grad sets one entry of the first parameter's gradient
        to +inf (this rank's shard under FSDP: a DTensor's local tensor)."""
        if self.at("inf_grad", step):
            grad = params[0].grad
            getattr(grad, "_local_tensor", grad).view(-1)[0] = math.inf

    def during_save(self, step: int) -> None:
        """Called by kiln.train.checkpoint.save with the checkpoint's files written, not yet renamed."""
        if self.at("enospc", step):
            raise OSError(errno.ENOSPC, f"No space left on device ({ENV}=enospc@{step})")
        if self.at("kill_in_save", step):
            os.kill(os.getpid(), signal.SIGKILL)


NONE = Faults()


def parse(spec: str, rank: int) -> Faults:
    """The faults `spec` plans for `rank`; a malformed spec is an error naming KILN_FAULT."""
    planned, stalls = set(), {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = _STALL.fullmatch(item) if item.startswith("stall@") else _ITEM.fullmatch(item)
        if not match or item.partition("@")[0] not in KINDS:
            raise KilnError(
                f"{ENV}: {item!r} is not kind@step[:rank] (stall@step[:seconds[:rank]]) with kind one of {', '.join(KINDS)}"
            )
        if match["rank"] is None or int(match["rank"]) == rank:
            kind, step = item.partition("@")[0], int(match["step"])
            planned.add((kind, step))
            if kind == "stall":
                stalls[step] = float(match["seconds"] or STALL_S)
    return Faults(frozenset(planned), tuple(sorted(stalls.items())))


def from_env(rank: int) -> Faults:
    return parse(os.environ.get(ENV, ""), rank)
