"""The training loop shared by the smoke and train stages (same code path, same parallelism).

A Trainer holds what a run is made of: the model (kiln.model), readied for the ranks
(kiln.train.parallel), AdamW (kiln.train.optim), the LR schedule (kiln.train.schedule), the data
stream (kiln.data.loader) and the batch split (kiln.config.batch). `train_step` is one optimizer step:
grad_accum micro-batches of micro_batch rows on each of W ranks, gradients synced on the last one
only. `state_dict` (with model and optimizer, full or sharded: `save_checkpoint`) and
`load_state_dict` are what a checkpoint holds. `fit` runs the loop: resume, the steps, the log
record, the final weights, and the callbacks its caller hands it (logging, validation, checkpoints:
kiln.train.callbacks.default_callbacks for the train stage's).

fit's loop reads top to bottom, one step at a time: train it, decide what follows it
(kiln.train.step_actions), then read and build the log record, then hand the step to the callbacks
(kiln.train.callbacks), in the caller's order. The host waits on the device only
at log and checkpoint steps (kiln.train.step_reader): losses and gradient norms stay device tensors
in between, so on a GPU the host runs ahead queueing work; between them it reads one step-old stop
flag (one step of run-ahead kept) to learn of a preemption signal.

Faults (docs/operations.md, "When a run dies"): a step whose loss or gradient norm is not finite on any rank is
never applied (every rank hands the optimizer the same found_inf flag, agreed on the device) and is
read before any save (train.nonfinite: stop or skip); loss spikes are logged (kiln.train.health); a
preemption signal makes every rank save at the same step and exit 75 (kiln.train.preemption).
KILN_FAULT injects each of these, through the hooks of kiln.train.faults the loop calls.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from pathlib import Path
from typing import Protocol, Sequence

import torch

from kiln import layout
from kiln.config.batch import split_batch
from kiln.config.run_config import RunConfig
from kiln.data.loader import ShardRows, TrainBatches, eval_batches
from kiln.data.shards import row_model, tokens_per_byte
from kiln.errors import RunStopped
from kiln.model.build import build_model, save_model
from kiln.plan.steps import BudgetPlan
from kiln.train import checkpoint, device, faults, fingerprint, init_from, parallel, preemption, progress, resume
from kiln.train.budget import BudgetController
from kiln.train.callbacks import Callback, StepEnd
from kiln.train.distributed import (
    collective_deadline,
    gather_objects,
    init_distributed,
    max_across_ranks,
    mean_across_ranks,
    same_on_every_rank,
    set_collective_timeout,
    shutdown,
    sum_across_ranks,
)
from kiln.train.gc_control import GarbageCollection
from kiln.train.health import SpikeDetector
from kiln.train.init_from import InitSource
from kiln.train.metrics import (
    Throughput,
    flops_per_token,
    flops_per_token_torchtitan,
    memory_mb,
    peak_flops,
    reserved_mb,
)
from kiln.train.mirror import Mirror
from kiln.train.optim import build_optimizer
from kiln.train.result import RunResult
from kiln.train.samples import Sampler
from kiln.train.schedule import schedule_from_config
from kiln.train.seeds import seed_everything, seed_rank_stream
from kiln.train.step_actions import Cadence, StepActions
from kiln.train.step_reader import StepReader, StepRecord

log = logging.getLogger("kiln.train")


class BatchSource(Protocol):
    """Where train_step takes each micro-batch from: (micro_batch, seq_len + 1) token rows."""

    def next(self) -> torch.Tensor: ...


class Trainer:
    """One run's parts, built from the stage's typed config (its model, train and, when it logs there,
    wandb sections) and a shard folder."""

    def __init__(
        self,
        config: RunConfig,
        shard_dir: Path,
        *,
        max_steps: int | None = None,
        budget: BudgetPlan | None = None,
        injected_faults: faults.Faults = faults.NONE,
    ):
        train = config.train
        self.seed = train.seed  # the model seed: initial weights, data order, dropout
        self.config, self.train = config, train  # the config as given (checkpoints, wandb); train as it runs
        self.max_steps = max_steps or train.max_steps
        # Until this Trainer's first step is done, the first step's allowance (compilation, shard
        # checks, a resume's hash); then train.collective_timeout_s (train_step).
        first_step_s = max(train.first_step_timeout_s, train.collective_timeout_s)
        self.dist = init_distributed(train.device, first_step_s, group_of_one=train.fsdp_one_rank)
        set_collective_timeout(first_step_s)  # a group an earlier Trainer made (smoke)
        self._first_step_done = False
        device.configure(self.dist.device)
        seed_everything(self.seed)
        self.rows, self.val_rows = ShardRows(shard_dir, "train"), ShardRows(shard_dir, "val")
        manifest = self.rows.manifest
        self.model_config = row_model(config.model.as_dict(), manifest)
        # train.micro_batch / activation_checkpointing auto: picked for this device (the smoke stage
        # picked them already, and train runs its pick: kiln.plan.steps.TrainPlan)
        self.train = train = device.fit_auto(train, self.model_config, self.dist.world, self.dist.device)
        self.tokens_per_byte = {split: tokens_per_byte(manifest, split) for split in ("train", "val")}
        self.batch_split = split_batch(
            train.batch_tokens, train.micro_batch, self.model_config.seq_len, self.dist.world
        )
        with torch.device(self.dist.device):  # initialised where it trains: no host copy of a 1B model
            self.model = build_model(self.model_config)
        self.model.loss_rows = device.fit_loss(
            train, self.model_config, self.dist.world, self.batch_split.grad_accum, self.dist.device
        )
        seed_rank_stream(self.seed, self.dist.rank)  # same init on every rank; dropout from here differs
        self.bf16 = device.use_bf16(train.precision, self.dist.device)
        self.autocast = device.autocast(self.dist.device, self.bf16)
        self.wrapped = parallel.parallelize(
            self.model,
            self.dist,
            strategy=train.parallel,
            compile_model=device.use_compile(train.compile, self.dist.device),
            activation_checkpointing=train.activation_checkpointing,
            bf16=self.bf16,
            shard_one_rank=train.fsdp_one_rank,
        )
        self.optimizer = build_optimizer(self.model, train, self.dist.device.type, self.bf16)  # AdamW, or Muon + AdamW
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.batches = TrainBatches(
            self.rows, train.micro_batch, self.seed, self.dist.rank, self.dist.world, self.batch_split.grad_accum
        )
        self.lr_at = schedule_from_config(train, self.max_steps)
        # A budget re-plans max_steps from the measured speed (kiln.train.budget); the fingerprint keeps the plan's.
        self.planned_steps = self.max_steps
        self.budget = BudgetController.of(budget, train, self.max_steps, self.batch_split.tokens_per_step, self.dist)
        if self.budget is not None:
            self.lr_at = self.budget.schedule
        self.step, self.tokens_seen, self.data_wait_s = 0, 0, 0.0
        self.elapsed_s, self._loop_start = 0.0, None  # the training wall time of earlier attempts; this one's start
        self.spikes = SpikeDetector(train.spike_factor)
        # The steps the host has not read yet (fit): non-finite policy, spikes, the count of skipped steps.
        self.reader = StepReader(train.nonfinite, self.spikes, self.dist.world, self.dist.is_main)
        # KILN_FAULT's injections into train_step (kiln.train.faults): the smoke stage's probe passes them;
        # fit reads them from the environment itself. The preemption signal's handler: fit installs it.
        self.faults, self.stop = injected_faults, preemption.StopSignal()
        self.flags = torch.zeros(2, device=self.dist.device)  # the last step's [non-finite, stop signal]
        self.init_source: InitSource | None = None  # train.init_from, resolved by fit (which knows results/)
        self.init_sha256: str | None = None
        self.saver: checkpoint.Saver | None = None  # the writer of this trainer's newest checkpoint

    @property
    def skipped(self) -> int:
        """Batches whose update was not applied (non-finite loss or gradient), in this run and those it resumes."""
        return self.reader.skipped

    def train_on(self, batches: BatchSource) -> None:
        """Draw train_step's micro-batches from `batches` instead of the run's shuffled stream of the
        train split (the smoke stage's overfit check: a few fixed rows; gpu_check: another
        micro-batch). For train_step only: fit's checkpoints and batch hashes need TrainBatches."""
        self.batches = batches

    @property
    def fingerprint(self) -> dict:
        """What a checkpoint must share with the run resuming it (kiln.train.fingerprint): model,
        tokenizer, shards, seed and the train settings that shape the trajectory (steps included);
        not the rank layout, which may change on resume, nor logging and checkpoint cadence."""
        return fingerprint.of_run(
            self.model_config.to_dict(),
            self.rows.manifest,
            self.seed,
            fingerprint.trajectory(self.train.as_dict(), self.planned_steps, self.init_sha256),
        )

    def state_dict(self) -> dict:
        """Everything needed to continue exactly but model and optimizer (on rank 0; collective)."""
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "data": self.batches.state_dict(),
            "rng": gather_objects(checkpoint.rng_state(), self.dist.world),  # every rank's, by rank (collective)
            "fingerprint": self.fingerprint,
            "config": self.config.as_dict(),
            "skipped": self.skipped,
            "spikes": self.spikes.state_dict(),
            "elapsed_s": self.elapsed_s + self._since_start(),
            "budget": self.budget.state_dict() if self.budget is not None else None,
            "lr": self.lr_at(self.step - 1) if self.step else None,  # the last step's (init_from.warmup_from)
        }

    def save_checkpoint(self, saver: checkpoint.Saver) -> None:
        """A checkpoint of this step through `saver` (kiln.train.callbacks.Checkpoints'; the smoke
        stage times one of its own), in the saver's format. Collective."""
        self.saver = saver
        if saver.sharded:  # each rank's own part, nothing gathered
            saver.save(self.state_dict(), parallel.sharded_state(self.model, self.optimizer))
            return
        saver.save(
            self.state_dict()
            | {
                "model": parallel.full_model_state(self.model),
                "optimizer": parallel.full_optimizer_state(self.model, self.optimizer),
            }
        )

    def last_checkpoint(self, root: Path) -> str:
        """The newest checkpoint under `root`, once this trainer's save in flight, if any, is in place:
        where a rerun continues from."""
        if self.saver is not None:
            self.saver.wait()
        return checkpoint.last_checkpoint(root)

    def load_state_dict(self, state: dict) -> None:
        if checkpoint.SHARDS in state:
            read = functools.partial(checkpoint.read_shards, state[checkpoint.SHARDS])
            parallel.load_sharded_state(self.model, self.optimizer, read)
        else:
            parallel.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        self.batches.load_state_dict(state["data"])
        # Each rank's own RNG states (dropout draws), when the checkpoint has as many ranks as this run.
        ranks = state["rng"]
        checkpoint.set_rng_state(ranks[self.dist.rank] if len(ranks) == self.dist.world else ranks[0])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.reader.skipped, self.elapsed_s = state.get("skipped", 0), state.get("elapsed_s", 0.0)
        if "spikes" in state:
            self.spikes.load_state_dict(state["spikes"])
        if self.budget is not None and state.get("budget"):  # the decisions made up to this step, replayed
            self.budget.load_state_dict(state["budget"])
            self.max_steps = self.budget.max_steps

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step. Returns this rank's mean loss and the global gradient norm as device
        tensors (no host sync), and the LR used. The update is skipped, on the device, when the loss
        or gradient norm of any rank is not finite; self.flags holds [non-finite, stop signal],
        agreed by every rank, for the host to read when it next syncs."""
        lr = self.lr_at(self.step)
        self.optimizer.set_lr(lr)  # train.lr's schedule; each optimizer's groups scaled from their own base LR
        accum = self.batch_split.grad_accum
        loss_sum = torch.zeros((), device=self.dist.device)
        for micro in range(accum):
            t0 = time.perf_counter()
            batch = device.to_device(self.batches.next(), self.dist.device)  # (micro_batch, seq_len + 1)
            self.data_wait_s += time.perf_counter() - t0
            with parallel.grad_sync(self.wrapped, sync=micro == accum - 1):
                with self.autocast():
                    _, loss = self.wrapped(*_split(batch))
                loss = self.faults.on_loss(loss, self.step + 1, micro)  # KILN_FAULT nan_loss, spike
                (loss / accum).backward()  # the mean over micro-batches: one batch of accum x rows
            loss_sum += loss.detach()
        self.faults.on_grads(self.params, self.step + 1)  # KILN_FAULT inf_grad
        grad_norm = parallel.clip_grad_norm(self.params, self.train.grad_clip)
        mean_loss = loss_sum / accum
        flags = torch.zeros(2, device=self.dist.device)
        flags[0] = ~(torch.isfinite(mean_loss) & torch.isfinite(grad_norm))
        flags[1] = float(self.stop.received is not None)  # a fill from a Python number: no host sync
        self.flags = max_across_ranks(flags, self.dist.world)
        # Fused AdamW (kiln.train.optim) skips the whole update, moments and step count included, when
        # found_inf is nonzero: the GradScaler mechanism, without a host sync; Muon too (kiln.train.muon).
        self.optimizer.found_inf = self.flags[0]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.batch_split.tokens_per_step
        if not self._first_step_done:  # compiled, checked and in step: the running job's bound from here
            set_collective_timeout(self.train.collective_timeout_s)
            self._first_step_done = True
        return mean_loss, grad_norm, lr

    def evaluate(self, n_batches: int | None = None) -> float:
        """Mean validation loss over the first n_batches (default train.eval_batches) batches of
        every rank's share, read back to the host (validation_loss)."""
        return self.validation_loss(n_batches).item()

    @torch.no_grad()
    def validation_loss(self, n_batches: int | None = None) -> torch.Tensor:
        """evaluate's work on the device, the same on every rank: the mean loss as a device tensor
        (kiln.rehearse runs it on fake tensors, which have no value to read). The targets are shifted
        here, not by _split, so a shift bug in the training path cannot hide from this figure (the
        smoke gate relies on it)."""
        self.model.eval()
        total, count = torch.zeros((), device=self.dist.device), 0
        micro = self.train.micro_batch
        # The same number of batches on every rank (FSDP's gathers are collective).
        n = min(n_batches or self.train.eval_batches, -(-(len(self.val_rows) // self.dist.world) // micro))
        for batch in eval_batches(self.val_rows, micro, n, self.dist.rank, self.dist.world):
            batch = device.to_device(batch, self.dist.device)  # (B, T + 1)
            with self.autocast():  # with targets: training's chunked loss, never the (B, T, V) logits
                _, loss = self.model(batch[:, :-1], batch[:, 1:])
            total += loss
            count += 1
        self.model.train()
        return mean_across_ranks(total / max(count, 1), self.dist.world)

    def fit(self, out_dir: Path, *, callbacks: Sequence[Callback] = ()) -> RunResult:
        """Train to max_steps, resuming from the newest checkpoint under out_dir/checkpoints, and save
        the final model.safetensors + model_config.json. What runs around the steps (logging,
        validation, checkpoints: kiln.train.callbacks) is `callbacks`, in order; none trains the same
        weights. (The smoke stage drives train_step itself: kiln.gate.checks.) A preemption signal
        ends it with RunStopped(PREEMPTED) once every rank has saved the same step (the callbacks'
        Preemption); a non-finite step with RunStopped(NONFINITE) per train.nonfinite."""
        train, d = self.train, self.dist
        ckpt_root = out_dir / layout.CHECKPOINTS
        if d.is_main:
            resume.remove_dead_writers_files(out_dir)
        self.resume_or_start(out_dir)
        result = RunResult(
            n_params=self.model.num_params(non_embedding=False),
            is_main=d.is_main,
            tokens_per_step=self.batch_split.tokens_per_step,
            grad_accum=self.batch_split.grad_accum,
            init_from=self.init_source.describe() if self.init_source else None,
            start_step=self.step,
        )
        if d.is_main:
            progress.log_model(self.model_config, result.n_params, d.world, train.parallel, self.batch_split)
        meter = Throughput(
            flops_per_token(self.model), peak_flops(d.device), d.world, flops_per_token_torchtitan(self.model)
        )
        cadence = Cadence(train.log_every, train.eval_every, train.checkpoint_every)
        window_tokens = 0  # trained on since the last log line
        self.faults = faults.from_env(d.rank)
        self.mirror = Mirror.of(train, out_dir, rank=d.rank)  # rank 0 copies each checkpoint off the node
        self.mirror.catch_up(ckpt_root)
        hooks = list(callbacks)
        with meter.paused():  # opening files, a start validation: not training time
            for hook in hooks:
                hook.before_fit(self, out_dir)
        self.stop.install()  # restored when fit ends, and by run() whatever happens
        loop_start = self._loop_start = time.perf_counter()
        # One step: train it (the device runs ahead: nothing read back), decide what follows it, read
        # (host sync) and build the log record where it syncs, then the callbacks in order. self.max_steps
        # and self.lr_at are read afresh each step (the budget changes them).
        try:
            with GarbageCollection() as collector:  # collections only between steps, alike on every rank
                while self.step < self.max_steps:
                    self.faults.before_step(self.step + 1, self.stop)  # KILN_FAULT's signals and hold, if any
                    loss, grad_norm, lr = self.train_step()
                    collector.step(self.step)
                    self.reader.add(StepRecord(self.step, loss, grad_norm, self.flags))
                    window_tokens += self.batch_split.tokens_per_step
                    due = cadence.at(self.step, self.max_steps, self.reader.stop_requested)
                    if due.read:  # every unread step, before anything is saved: a non-finite one is never saved
                        stopped = self.reader.read(functools.partial(self.last_checkpoint, ckpt_root))
                        if stopped is not None:
                            raise stopped
                    record = None
                    if due.log:
                        record = self._log_record(due, lr, grad_norm, meter, window_tokens)
                        window_tokens = 0
                        result.losses.append(record["loss"])
                    end = StepEnd(due, record, result)
                    with meter.paused():  # validation and saving are not training time
                        for hook in hooks:
                            hook.after_step(self, end)
            for hook in hooks:
                hook.after_fit(self, result)
        except RunStopped:
            self._close(hooks)
            raise
        self._close(hooks)
        result.wall_s = time.perf_counter() - loop_start
        result.steps, result.tokens_seen = self.max_steps, self.tokens_seen
        result.cooldown_from = self.lr_at.cooldown_from
        result.set_rates(meter.rates(meter.steady_tokens_per_s))
        result.data_wait_fraction = self.data_wait_s / (time.perf_counter() - loop_start)
        result.peak_memory_mb, result.peak_reserved_mb = memory_mb(d.device), reserved_mb(d.device)
        weights = parallel.full_model_state(self.model)
        if d.is_main:
            save_model(self.model_config, weights, out_dir)
        return result

    def _close(self, hooks: list[Callback]) -> None:
        for hook in hooks:
            hook.close()
        self.stop.restore()

    def _log_record(self, due: StepActions, lr: float, grad_norm: torch.Tensor, meter: Throughput, tokens: int) -> dict:
        """The metrics.jsonl record of a log step, over the steps read since the last one (`tokens`
        trained on), printed as the progress line on rank 0. Collective (the batch hash)."""
        window = self.reader.take_window()
        mean_loss = window.mean_loss()
        rates = meter.window(tokens, last=due.last)
        record = {
            "step": due.step,
            "loss": mean_loss,
            "bpb": self.bits_per_byte(mean_loss, "train"),
            "lr": lr,
            "grad_norm": grad_norm.item(),
            "tokens": self.tokens_seen,
            "elapsed_s": self.elapsed_s + self._since_start(),
            **rates,
            "memory_mb": memory_mb(self.dist.device),
            **({"memory_reserved_mb": held} if (held := reserved_mb(self.dist.device)) is not None else {}),
            "batch_hash": self._batch_hash(),
        }
        record.update(window.events() | self.mirror.events())
        if self.dist.is_main:
            progress.log_progress(record, self.max_steps, self.batch_split.tokens_per_step, meter.steady_tokens_per_s)
        return record

    def resume_or_start(self, out_dir: Path) -> None:
        """Continue the newest checkpoint of this trajectory (or the one KILN_RESUME_FROM names); else
        start over, setting aside another trajectory's checkpoints, from train.init_from's weights
        or the random init (kiln.train.resume)."""
        if self.train.init_from:  # out_dir is results/<run>/train: a source run is named under results/
            self.init_source = InitSource.of(self.train.init_from.as_dict(), out_dir.parents[1])
            self.init_sha256 = self.init_source.identity()
        d = self.dist
        state = resume.state_to_resume(out_dir, self.fingerprint, rank=d.rank, world=d.world, is_main=d.is_main)
        if state is not None:
            self.load_state_dict(state)
            log.info("resumed from step %d (%d tokens seen)", self.step, self.tokens_seen)
        elif self.init_source is not None:
            self._start_from(self.init_source)

    def _start_from(self, source: InitSource) -> None:
        shards = [self.rows.manifest.get(k) for k in ("tokenizer_sha256", "source_tokenizer_sha256")]
        init_from.load_into(source, self.model, self.optimizer, *shards)
        if self.dist.is_main:
            log.info("train: starting from %s, not from a random init", source.describe())

    def _since_start(self) -> float:
        return 0.0 if self._loop_start is None else time.perf_counter() - self._loop_start

    def _batch_hash(self) -> str:
        """A hash of the rows trained on since the last log line: per step, the sum over ranks of
        their rows' hashes (kiln.data.loader.row_hash_sum), so it depends on the rows of each step and
        not on the rank layout; a resumed run's lines compare with an uninterrupted run's. Collective."""
        sums = torch.tensor(self.batches.drain_step_sums(), dtype=torch.int64, device=self.dist.device)
        sums = sum_across_ranks(sums, self.dist.world).cpu()
        return hashlib.sha256(sums.numpy().tobytes()).hexdigest()[:16]

    def sample(self, sampler: Sampler | None) -> list[dict]:
        """Completions of the sampler's prompts by the model as it is now, on every rank (an FSDP
        forward is collective), each rank decoding rank 0's tokens, so all stop at the same step.
        Eager, so a compiled model is not recompiled for the decoding shapes, under the step's autocast
        (the run's precision: bf16 on a GPU, as the eval stage decodes there)."""
        if sampler is None:
            return []
        self.model.eval()
        with torch.compiler.set_stance("force_eager"), self.autocast():
            rows = sampler(self.model, agree=functools.partial(same_on_every_rank, world=self.dist.world))
        self.model.train()
        return rows

    def bits_per_byte(self, loss: float, split: str) -> float | None:
        """loss (nats/token) in bits per byte of the split's documents; None without byte counts."""
        ratio = self.tokens_per_byte[split]
        return None if ratio is None else loss / math.log(2) * ratio


def _split(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row of seq_len + 1 tokens -> inputs (the first seq_len) and targets (the last seq_len)."""
    return batch[:, :-1], batch[:, 1:]


def run(
    config: RunConfig,
    shard_dir: Path,
    out_dir: Path,
    *,
    callbacks: Sequence[Callback] = (),
    max_steps: int | None = None,
    budget: BudgetPlan | None = None,
) -> RunResult:
    """Train per `config` (its seed, model, train[, wandb]) on shard_dir, writing into out_dir with
    `callbacks` (see Trainer.fit); the process group, if any, is shut down at the end."""
    trainer = Trainer(config, shard_dir, max_steps=max_steps, budget=budget)
    synced = False  # every rank finished, or stopped itself at the same step
    try:
        with collective_deadline(trainer.train.collective_timeout_s, trainer.train.first_step_timeout_s):
            result = trainer.fit(out_dir, callbacks=callbacks)
        synced = True
    except RunStopped:
        synced = True
        raise
    finally:
        trainer.stop.restore()
        shutdown(synced)
    # The final checkpoint's copy off the node (rank 0; at most kiln.train.mirror.FINAL_WAIT_S), once
    # every rank has left the process group: no rank waits for it in a collective, whose timeout
    # (train.collective_timeout_s) is shorter. The run counts as finished only after it: the train
    # script writes final-summary.json when this returns.
    trainer.mirror.close()
    result.mirror_failures = trainer.mirror.failures
    return result
