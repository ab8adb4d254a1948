"""The training loop shared by the smoke and train stages (same code path, same parallelism).

A Trainer holds what a run is made of: the model (kiln.model), readied for the ranks
(kiln.train.parallel), AdamW (kiln.train.optim), the LR schedule (kiln.train.schedule), the data
stream (kiln.data.loader) and the batch plan (kiln.plan.steps). `train_step` is one optimizer step:
grad_accum micro-batches of micro_batch rows on each of W ranks, gradients synced on the last one
only. `state_dict` (with model and optimizer, full or sharded: `_save_checkpoint`) and
`load_state_dict` are what a checkpoint holds. `fit` runs the loop: logging, validation,
checkpoints, resume.

The host waits on the device only at log and checkpoint steps: losses and gradient norms stay
device tensors in between, so on a GPU the host runs ahead queueing work; between them it reads one
step-old pair of flags (one step of run-ahead kept) to learn of a preemption signal.

Faults (README, "When a run dies"): a step whose loss or gradient norm is not finite on any rank is
never applied (every rank hands the optimizer the same found_inf flag, agreed on the device) and is
read before any save (train.nonfinite: stop or skip); loss spikes are logged (kiln.train.health); a
preemption signal makes every rank save at the same step and exit 75 (kiln.train.preemption).
KILN_FAULT injects each of these (kiln.train.faults).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from kiln import layout
from kiln.config import checkpoint_format
from kiln.data.loader import ShardRows, TrainBatches, eval_batches
from kiln.data.shards import tokens_per_byte
from kiln.errors import ExitCode, RunStopped
from kiln.io import remove_dead_temps
from kiln.model.build import build_model, save_model
from kiln.model.registry import resolve
from kiln.plan.steps import plan_batch
from kiln.plan.tables import format_eta
from kiln.train import checkpoint, device, faults, fingerprint, init_from, parallel
from kiln.train.distributed import (
    barrier,
    collective_deadline,
    gather_objects,
    init_distributed,
    max_across_ranks,
    mean_across_ranks,
    shutdown,
    sum_across_ranks,
)
from kiln.train.health import SpikeDetector
from kiln.train.init_from import InitSource
from kiln.train.metrics import (
    MetricsSink,
    Throughput,
    flops_per_token,
    flops_per_token_torchtitan,
    memory_mb,
    peak_flops,
)
from kiln.train.mirror import Mirror
from kiln.train.optim import build_adamw
from kiln.train.preemption import StopSignal
from kiln.train.schedule import schedule_from_config

log = logging.getLogger("kiln.train")
Sampler = Callable[[torch.nn.Module], list[dict]]  # model -> [{"prompt", "completion"}] (kiln.train.samples)


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
    mfu: float | None = None
    mfu_torchtitan: float | None = (
        None  # the same under torchtitan's transformers-backend FLOP count (kiln.train.metrics)
    )
    n_params: int = 0
    tokens_per_step: int = 0
    grad_accum: int = 1
    steps: int = 0
    tokens_seen: int = 0
    wall_s: float = 0.0  # the loop's wall time in this process, validation and checkpoints included
    is_main: bool = True  # rank 0, the rank that writes reports
    init_from: str | None = None  # where the initial weights came from (train.init_from), None: a random init
    mirror_failures: int = 0  # checkpoint copies to train.checkpoint_mirror that failed in this job (kiln.train.mirror)


def seed_rank_stream(seed: int, rank: int) -> None:
    """After init, which every rank draws alike from `seed` (FSDP2 shards without broadcasting),
    give each rank its own torch stream (CPU and its GPU) so dropout masks differ between ranks;
    rank 0 of W and the only rank of 1 draw alike. Resume restores each rank's own state."""
    if rank:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))


def seed_everything(seed: int) -> None:
    """One seed for Python, NumPy and torch (every device): initial weights, dropout, sampling."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """One run's parts, built from the stage sections (seed, model, train) and a shard folder."""

    def __init__(self, sections: dict, shard_dir: Path, *, max_steps: int | None = None):
        train, self.seed = sections["train"], sections["seed"]
        self.sections, self.train_cfg = sections, train
        self.max_steps = max_steps or train["max_steps"]
        self.d = init_distributed(train["device"], train["collective_timeout_s"])
        device.configure(self.d.device)
        seed_everything(self.seed)
        self.rows, self.val_rows = ShardRows(shard_dir, "train"), ShardRows(shard_dir, "val")
        manifest = self.rows.manifest
        self.cfg = resolve(sections["model"], manifest["padded_vocab_size"], manifest["seq_len"])
        self.tokens_per_byte = {split: tokens_per_byte(manifest, split) for split in ("train", "val")}
        self.plan = plan_batch(train["batch_tokens"], train["micro_batch"], self.cfg.seq_len, self.d.world)
        with torch.device(self.d.device):  # initialised where it trains: no host copy of a 1B model
            self.model = build_model(self.cfg)
        seed_rank_stream(self.seed, self.d.rank)  # same init on every rank; dropout from here differs
        self.bf16 = device.use_bf16(train["precision"], self.d.device)
        self.autocast = device.autocast(self.d.device, self.bf16)
        self.wrapped = parallel.parallelize(
            self.model,
            self.d,
            strategy=train["parallel"],
            compile_model=device.use_compile(train["compile"], self.d.device),
            activation_checkpointing=train["activation_checkpointing"],
            bf16=self.bf16,
        )
        self.optimizer = build_adamw(self.model, train, self.d.device.type)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.batches = TrainBatches(
            self.rows, train["micro_batch"], self.seed, self.d.rank, self.d.world, self.plan.grad_accum
        )
        self.lr_at = schedule_from_config(train, self.max_steps)
        self.step, self.tokens_seen, self.data_wait_s = 0, 0, 0.0
        self.elapsed_s, self._loop_start = 0.0, None  # the training wall time of earlier attempts; this one's start
        self.skipped = 0  # batches whose update was not applied (non-finite loss or gradient)
        self.spikes = SpikeDetector(train["spike_factor"])
        self.faults, self.stop = faults.NONE, StopSignal()  # fit() sets both; the smoke stage has neither
        self.flags = torch.zeros(2, device=self.d.device)  # the last step's [non-finite, stop signal]
        self.init_source: InitSource | None = None  # train.init_from, resolved by fit (which knows results/)
        self.init_sha256: str | None = None

    @property
    def fingerprint(self) -> dict:
        """What a checkpoint must share with the run resuming it (kiln.train.fingerprint): model,
        tokenizer, shards, seed and the train settings that shape the trajectory (steps included);
        not the rank layout, which may change on resume, nor logging and checkpoint cadence."""
        return fingerprint.of_run(
            self.cfg.to_dict(),
            self.rows.manifest,
            self.seed,
            fingerprint.trajectory(self.train_cfg, self.max_steps, self.init_sha256),
        )

    def state_dict(self) -> dict:
        """Everything needed to continue exactly but model and optimizer (on rank 0; collective)."""
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "data": self.batches.state_dict(),
            "rng": self._rng_states(),
            "fingerprint": self.fingerprint,
            "config": self.sections,
            "skipped": self.skipped,
            "spikes": self.spikes.state_dict(),
            "elapsed_s": self.elapsed_s + self._since_start(),
        }

    def _save_checkpoint(self) -> None:
        """A checkpoint of this step in train.checkpoint_format (fit's saver). Collective."""
        if self.saver.sharded:  # each rank's own part, nothing gathered
            self.saver.save(self.state_dict(), parallel.sharded_state(self.model, self.optimizer))
            return
        self.saver.save(
            self.state_dict()
            | {
                "model": parallel.full_model_state(self.model),
                "optimizer": parallel.full_optimizer_state(self.model, self.optimizer),
            }
        )

    def load_state_dict(self, state: dict) -> None:
        if checkpoint.SHARDS in state:
            read = functools.partial(checkpoint.read_shards, state[checkpoint.SHARDS])
            parallel.load_sharded_state(self.model, self.optimizer, read)
        else:
            parallel.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        self.batches.load_state_dict(state["data"])
        # Each rank's own RNG states (dropout draws), when the checkpoint has as many ranks as this run.
        ranks = state["rng"]
        checkpoint.set_rng_state(ranks[self.d.rank] if len(ranks) == self.d.world else ranks[0])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.skipped = state.get("skipped", 0)
        self.elapsed_s = state.get("elapsed_s", 0.0)
        if "spikes" in state:
            self.spikes.load_state_dict(state["spikes"])

    def _rng_states(self) -> list[dict]:
        """Every rank's RNG states, by rank (a collective when there are several ranks)."""
        return gather_objects(checkpoint.rng_state(), self.d.world)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step. Returns this rank's mean loss and the global gradient norm as device
        tensors (no host sync), and the LR used. The update is skipped, on the device, when the loss
        or gradient norm of any rank is not finite; self.flags holds [non-finite, stop signal],
        agreed by every rank, for the host to read when it next syncs."""
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum = self.plan.grad_accum
        loss_sum = torch.zeros((), device=self.d.device)
        for micro in range(accum):
            t0 = time.perf_counter()
            batch = device.to_device(self.batches.next(), self.d.device)  # (micro_batch, seq_len + 1)
            self.data_wait_s += time.perf_counter() - t0
            with parallel.grad_sync(self.wrapped, sync=micro == accum - 1):
                with self.autocast():
                    _, loss = self.wrapped(*_split(batch))
                if self.faults:
                    loss = self._loss_faults(loss, micro)
                (loss / accum).backward()  # the mean over micro-batches: one batch of accum x rows
            loss_sum += loss.detach()
        if self.faults and self.faults.at("inf_grad", self.step + 1):
            grad = self.params[0].grad
            getattr(grad, "_local_tensor", grad).view(-1)[0] = math.inf  # this rank's shard under FSDP
        grad_norm = parallel.clip_grad_norm(self.params, self.train_cfg["grad_clip"])
        mean_loss = loss_sum / accum
        flags = torch.zeros(2, device=self.d.device)
        flags[0] = ~(torch.isfinite(mean_loss) & torch.isfinite(grad_norm))
        flags[1] = float(self.stop.received is not None)  # a fill from a Python number: no host sync
        self.flags = max_across_ranks(flags, self.d.world)
        # Fused AdamW (kiln.train.optim) skips the whole update, moments and step count included, when
        # found_inf is nonzero: the GradScaler mechanism, without a host sync.
        self.optimizer.found_inf = self.flags[0]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.plan.tokens_per_step
        return mean_loss, grad_norm, lr

    def _loss_faults(self, loss: torch.Tensor, micro: int) -> torch.Tensor:
        step = self.step + 1
        if self.faults.at("nan_loss", step) and micro == 0:
            loss = loss * math.nan
        if self.faults.at("spike", step):
            loss = loss * faults.SPIKE_FACTOR
        return loss

    @torch.no_grad()
    def evaluate(self, n_batches: int | None = None) -> float:
        """Mean validation loss over the first n_batches (default train.eval_batches) batches of
        every rank's share. The targets are shifted here, not by _split, so a shift bug in the
        training path cannot hide from this figure (the smoke gate relies on it)."""
        self.model.eval()
        total, count = torch.zeros((), device=self.d.device), 0
        micro = self.train_cfg["micro_batch"]
        # The same number of batches on every rank (FSDP's gathers are collective).
        n = min(n_batches or self.train_cfg["eval_batches"], -(-(len(self.val_rows) // self.d.world) // micro))
        for batch in eval_batches(self.val_rows, micro, n, self.d.rank, self.d.world):
            batch = device.to_device(batch, self.d.device)  # (B, T + 1)
            with self.autocast():  # with targets: training's chunked loss, never the (B, T, V) logits
                _, loss = self.model(batch[:, :-1], batch[:, 1:])
            total += loss
            count += 1
        self.model.train()
        return mean_across_ranks(total / max(count, 1), self.d.world).item()

    def fit(self, out_dir: Path, *, sampler: Sampler | None = None) -> RunResult:
        """Train to max_steps: log metrics.jsonl (and wandb), keep checkpoints under
        out_dir/checkpoints and resume from the newest, validate every eval_every steps (with
        `sampler`'s greedy completions, logged to samples.jsonl), and save the final
        model.safetensors + model_config.json. (The smoke stage drives train_step itself:
        kiln.train.smoke.) A preemption signal ends it with RunStopped(PREEMPTED) once every rank
        has saved the same step; a non-finite step with RunStopped(NONFINITE) per train.nonfinite."""
        train, d = self.train_cfg, self.d
        ckpt_root = out_dir / layout.CHECKPOINTS
        if d.is_main:  # what a killed run's writers left; a live writer's temps are left alone
            checkpoint.remove_dead_temps(ckpt_root)
            for path in remove_dead_temps(out_dir):
                log.info("removed %s, left by a writer that died", path)
        self._resume_or_start(out_dir)
        result = RunResult(
            n_params=self.model.num_params(non_embedding=False),
            is_main=d.is_main,
            tokens_per_step=self.plan.tokens_per_step,
            grad_accum=self.plan.grad_accum,
            init_from=self.init_source.describe() if self.init_source else None,
        )
        if d.is_main:
            log.info(
                "model: %s, %s parameters; %d ranks (%s) x %d micro-batches x %d rows x %d tokens = %d tokens/step",
                self.cfg.to_dict(),
                f"{result.n_params:,}",
                d.world,
                train["parallel"],
                self.plan.grad_accum,
                self.plan.micro_batch,
                self.cfg.seq_len,
                self.plan.tokens_per_step,
            )
        sink = MetricsSink(
            out_dir / layout.METRICS,
            self.sections.get("wandb", {"mode": "disabled"}),
            self.sections,
            enabled=d.is_main,
            resume_step=self.step,
        )
        meter = Throughput(
            flops_per_token(self.model), peak_flops(d.device), d.world, flops_per_token_torchtitan(self.model)
        )
        if self.step == 0 and self.init_source is not None:  # where the source left off, before any step
            self._log_start_validation(sink, sampler)
        log_every = train["log_every"]
        unread, window, window_tokens = [], _Window(), 0
        self.faults = faults.from_env(d.rank)
        self.mirror = Mirror.of(train, out_dir, rank=d.rank)  # rank 0 copies each checkpoint off the node
        self.saver = checkpoint.Saver(
            ckpt_root,
            checkpoint_format(train),
            train["keep_checkpoints"],
            rank=d.rank,
            world=d.world,
            async_save=train["async_checkpoint"],
            faults=self.faults,
            on_saved=self.mirror.submit,
            milestone_every=train["keep_checkpoint_every"],
        )
        self.mirror.catch_up(ckpt_root)
        self.stop.install()  # restored when fit ends, and by run() whatever happens
        loop_start = self._loop_start = time.perf_counter()
        while self.step < self.max_steps:
            self.faults.signal_self(self.step + 1)
            self.faults.hold_until_signalled(self.step + 1, self.stop)
            loss, grad_norm, lr = self.train_step()
            unread.append((self.step, loss, grad_norm, self.flags))
            window_tokens += self.plan.tokens_per_step
            done = self.step
            saving = done % train["checkpoint_every"] == 0 or done == self.max_steps
            preempted = self._preempted(unread, synced=saving or done % log_every == 0)
            if saving or preempted or done % log_every == 0:
                stopped = self._read_steps(unread, window, ckpt_root)  # host sync, before any save
                unread = []
                if stopped is not None:
                    self._stop_fit(sink, stopped)
            if done % log_every == 0 or done == self.max_steps or preempted:
                mean_loss = window.mean_loss()
                rates = meter.window(window_tokens, last=done == self.max_steps)
                record = {
                    "step": done,
                    "loss": mean_loss,
                    "bpb": self._bits_per_byte(mean_loss, "train"),
                    "lr": lr,
                    "grad_norm": grad_norm.item(),
                    "tokens": self.tokens_seen,
                    "elapsed_s": self.elapsed_s + self._since_start(),
                    **rates,
                    "memory_mb": memory_mb(d.device),
                    "batch_hash": self._batch_hash(),
                }
                record.update(window.events() | self.mirror.events())
                window, window_tokens = _Window(), 0
                result.losses.append(mean_loss)
                if d.is_main:
                    self._print_progress(record, meter)
                if done % train["eval_every"] == 0 or done == self.max_steps:
                    record["val_loss"] = self.evaluate()
                    record["val_bpb"] = self._bits_per_byte(record["val_loss"], "val")
                    result.val_losses.append((done, record["val_loss"]))
                    samples = self._sample(sampler)
                    if d.is_main:
                        log.info(
                            "step %d | val loss %.4f%s",
                            done,
                            record["val_loss"],
                            "" if record["val_bpb"] is None else f" | {record['val_bpb']:.4f} bits/byte",
                        )
                        for row in samples:
                            log.info("step %d | sample %r -> %r", done, row["prompt"], row["completion"])
                        sink.log_samples(done, samples)
                sink.log(record)
                meter.restart()  # validation is not training time
            if saving or preempted:
                with meter.paused():  # not training time: left out of tokens/s (an async save's writing
                    self._save_checkpoint()  # overlaps the steps after it, and counts as theirs)
            if preempted:
                self._stop_fit(sink, self._preemption_stop(ckpt_root))
        self.saver.wait()
        sink.close()
        self.stop.restore()
        result.wall_s = time.perf_counter() - loop_start
        result.steps, result.tokens_seen = self.max_steps, self.tokens_seen
        rates = meter.rates(meter.steady_tokens_per_s)
        result.tokens_per_s, result.tflops, result.mfu = rates["tokens_per_s"], rates["tflops"], rates["mfu"]
        result.mfu_torchtitan = rates["mfu_torchtitan"]
        result.step_time_s = self.plan.tokens_per_step / result.tokens_per_s if result.tokens_per_s else 0.0
        result.data_wait_fraction = self.data_wait_s / (time.perf_counter() - loop_start)
        result.peak_memory_mb = memory_mb(d.device)
        weights = parallel.full_model_state(self.model)
        if d.is_main:
            save_model(self.cfg, weights, out_dir)
            checkpoint.mark_finished(ckpt_root, self.step)
        self.mirror.close()  # the final checkpoint's copy, bounded (kiln.train.mirror.FINAL_WAIT_S)
        result.mirror_failures = self.mirror.failures
        return result

    def _resume_or_start(self, out_dir: Path) -> None:
        """Continue the newest checkpoint of this trajectory (or the one KILN_RESUME_FROM names); else
        start over, setting aside another trajectory's checkpoints, from train.init_from's weights
        or the random init."""
        ckpt_root = out_dir / layout.CHECKPOINTS
        if self.train_cfg["init_from"]:  # out_dir is results/<run>/train: a source run is named under results/
            self.init_source = InitSource.of(self.train_cfg["init_from"], out_dir.parents[1])
            self.init_sha256 = self.init_source.identity()
        requested = os.environ.get(checkpoint.RESUME_ENV)
        if requested and self.d.is_main:  # resumed on purpose: an error if it is another run's; not finished now
            checkpoint.clear_finished(ckpt_root)
        superseded = not requested and self._superseded(out_dir)
        # Rank 0 reads the checkpoint's hashes and picks it for every rank (its superseded verdict
        # counts); every rank memory-maps it: one copy in the node's page cache, not one per rank.
        state = checkpoint.resume_state(
            ckpt_root, self.fingerprint, requested, rank=self.d.rank, world=self.d.world, start_over=superseded
        )
        if state is not None:
            self.load_state_dict(state)
            log.info("resumed from step %d (%d tokens seen)", self.step, self.tokens_seen)
        elif self.init_source is not None:
            self._start_from(self.init_source)

    def _start_from(self, source: InitSource) -> None:
        init_from.load_into(source, self.model, self.optimizer, self.rows.manifest.get("tokenizer_sha256"))
        if self.d.is_main:
            log.info("train: starting from %s, not from a random init", source.describe())

    def _log_start_validation(self, sink: MetricsSink, sampler: Sampler | None) -> None:
        """A validation at step 0 of a run that starts from another model's weights, in metrics.jsonl
        (step 0, tokens 0, no training figures): the source's last validation, on this run's data."""
        record = {"step": 0, "tokens": 0, "val_loss": self.evaluate(), "init_from": self.init_source.describe()}
        record["val_bpb"] = self._bits_per_byte(record["val_loss"], "val")
        samples = self._sample(sampler)
        if self.d.is_main:
            log.info("step 0 | val loss %.4f (the weights of %s)", record["val_loss"], self.init_source.describe())
            sink.log_samples(0, samples)
        sink.log(record)

    def _since_start(self) -> float:
        return 0.0 if self._loop_start is None else time.perf_counter() - self._loop_start

    def _superseded(self, out_dir: Path) -> bool:
        """Whether the checkpoints in out_dir are another trajectory's (settings changed) or a
        finished run's (asked to train again): then the run starts over, and rank 0 moves that
        trajectory's files to train/superseded/<time>/ (kiln.layout.set_aside), never deleting them.
        No collective: rank 0's answer is the one every rank acts on (checkpoint.resume_state); a rank
        that looks after rank 0 has moved the files would answer otherwise."""
        why = checkpoint.superseded_by(out_dir / layout.CHECKPOINTS, self.fingerprint)
        if why is not None and self.d.is_main:
            moved = layout.set_aside(out_dir)
            log.warning(
                "train: starting from step 0: %s; the earlier run's checkpoints and metrics are in %s", why, moved
            )
        return why is not None

    def _preempted(self, unread: list, synced: bool) -> bool:
        """Whether a rank got a preemption signal, decided alike on every rank: from the flags of this
        step where the host syncs anyway (log and checkpoint steps), else from the previous step's
        (reading them waits only for that step: the host stays one step ahead). The last step is
        never a preemption: the run ends normally."""
        if self.step == self.max_steps:
            return False
        if synced:
            return unread[-1][3][1].item() > 0
        # Unread, the previous step is the one before this; read, its flags were read then.
        return len(unread) > 1 and unread[-2][3][1].item() > 0

    def _read_steps(self, unread: list, window: "_Window", ckpt_root: Path) -> RunStopped | None:
        """Read the steps the host has not read yet (one sync): a step that was not applied is logged
        and ends the run (train.nonfinite: stop, or skip past max_skips); loss spikes are logged.
        Returns the RunStopped to raise, if any."""
        if not unread:
            return None
        policy = self.train_cfg["nonfinite"]
        losses = mean_across_ranks(torch.stack([u[1] for u in unread]), self.d.world)
        rows = torch.stack(
            [losses, torch.stack([u[2] for u in unread]).float(), torch.stack([u[3][0] for u in unread])]
        ).tolist()
        for step, loss, norm, bad in zip([u[0] for u in unread], *rows):
            if bad:
                self.skipped += 1
                window.skipped.append(step)
                if self.d.is_main:
                    log.warning(
                        "step %d: loss %s, gradient norm %s: not finite on some rank; update not applied "
                        "(%d skipped in this run)",
                        step,
                        loss,
                        norm,
                        self.skipped,
                    )
                if policy["action"] == "stop" or self.skipped > policy["max_skips"]:
                    why = (
                        "train.nonfinite.action is stop"
                        if policy["action"] == "stop"
                        else f"{self.skipped} batches skipped, more than train.nonfinite.max_skips {policy['max_skips']}"
                    )
                    return RunStopped(
                        f"train: step {step}: loss {loss}, gradient norm {norm}: not finite, so not applied, and "
                        f"the run stopped ({why}); nothing after it was saved. Last good checkpoint: "
                        f"{self._last_checkpoint(ckpt_root)}, where a rerun resumes. Lower train.lr, raise "
                        "train.warmup_steps or check the data; train.nonfinite.action: skip drops such batches",
                        ExitCode.NONFINITE,
                    )
                continue
            window.losses.append(loss)
            ratio = self.spikes.update(loss)
            if ratio is not None:
                window.spikes.append(step)
                if self.d.is_main:
                    log.warning(
                        "step %d: loss spike: %.4f is %.1fx the running average %.4f (train.spike_factor %g)",
                        step,
                        loss,
                        ratio,
                        loss / ratio,
                        self.spikes.factor,
                    )
        return None

    def _preemption_stop(self, ckpt_root: Path) -> RunStopped:
        self.saver.wait()  # an async save: this rank's shards written (rank 0: the checkpoint in place)
        barrier(self.d.world)  # rank 0 has written the checkpoint before any rank exits
        signal = self.stop.received or "a preemption signal on another rank"
        return RunStopped(
            f"train: {signal}: every rank saved step {self.step} "
            f"({self._last_checkpoint(ckpt_root)}); rerun the same command to continue from "
            f"step {self.step + 1}",
            ExitCode.PREEMPTED,
        )

    def _last_checkpoint(self, ckpt_root: Path) -> str:
        self.saver.wait()  # an async save in flight is the last one once it is in place
        found = checkpoint.kept(ckpt_root)
        return str(found[-1][1]) if found else "none (a rerun starts from step 0)"

    def _stop_fit(self, sink: MetricsSink, stopped: RunStopped) -> None:
        sink.close()
        self.stop.restore()
        raise stopped

    def _batch_hash(self) -> str:
        """A hash of the rows trained on since the last log line: per step, the sum over ranks of
        their rows' hashes (kiln.data.loader.row_hash_sum), so it depends on the rows of each step and
        not on the rank layout; a resumed run's lines compare with an uninterrupted run's. Collective."""
        sums = torch.tensor(self.batches.drain_step_sums(), dtype=torch.int64, device=self.d.device)
        sums = sum_across_ranks(sums, self.d.world).cpu()
        return hashlib.sha256(sums.numpy().tobytes()).hexdigest()[:16]

    def _sample(self, sampler: Sampler | None) -> list[dict]:
        """Completions of the sampler's prompts by the model as it is now, on every rank (an FSDP
        forward is collective; greedy decoding gives every rank the same tokens). Eager, so a
        compiled model is not recompiled for the decoding shapes."""
        if sampler is None:
            return []
        self.model.eval()
        with torch.compiler.set_stance("force_eager"):
            rows = sampler(self.model)
        self.model.train()
        return rows

    def _bits_per_byte(self, loss: float, split: str) -> float | None:
        """loss (nats/token) in bits per byte of the split's documents; None without byte counts."""
        ratio = self.tokens_per_byte[split]
        return None if ratio is None else loss / math.log(2) * ratio

    def _print_progress(self, record: dict, meter: Throughput) -> None:
        rate = meter.steady_tokens_per_s or record["tokens_per_s"]
        eta = (self.max_steps - record["step"]) * self.plan.tokens_per_step / rate
        mfu = (
            f" | MFU {record['mfu']:.1%} (torchtitan transformers-backend count {record['mfu_torchtitan']:.1%})"
            if record["mfu"] is not None
            else ""
        )
        bpb = "" if record["bpb"] is None else f" ({record['bpb']:.3f} bits/byte)"
        log.info(
            "step %d/%d | loss %.4f%s | lr %.2e | grad %.3f | %s tok/s | %.2f TFLOP/s%s | %.0f MB | ETA %s",
            record["step"],
            self.max_steps,
            record["loss"],
            bpb,
            record["lr"],
            record["grad_norm"],
            f"{record['tokens_per_s']:,.0f}",
            record["tflops"],
            mfu,
            record["memory_mb"],
            format_eta(eta),
        )


@dataclass
class _Window:
    """What the host has read of the steps since the last log line."""

    losses: list[float] = field(default_factory=list)  # the applied steps' losses (mean over ranks)
    skipped: list[int] = field(default_factory=list)  # steps not applied (non-finite)
    spikes: list[int] = field(default_factory=list)

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan

    def events(self) -> dict:
        return {k: v for k, v in (("skipped_steps", self.skipped), ("spike_steps", self.spikes)) if v}


def _split(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row of seq_len + 1 tokens -> inputs (the first seq_len) and targets (the last seq_len)."""
    return batch[:, :-1], batch[:, 1:]


def run(
    sections: dict, shard_dir: Path, out_dir: Path, *, max_steps: int | None = None, sampler: Sampler | None = None
) -> RunResult:
    """Train per `sections` (seed, model, train[, wandb]) on shard_dir, writing into out_dir (see
    Trainer.fit); the process group, if any, is shut down at the end."""
    trainer = Trainer(sections, shard_dir, max_steps=max_steps)
    synced = False  # every rank finished, or stopped itself at the same step
    try:
        with collective_deadline(trainer.train_cfg["collective_timeout_s"]):
            result = trainer.fit(out_dir, sampler=sampler)
        synced = True
        return result
    except RunStopped:
        synced = True
        raise
    finally:
        trainer.stop.restore()
        shutdown(trainer.d.world, synced)
