"""The smoke stage: a short probe on the full run's code path that stops a broken run before it
costs money, and measures what the full run will take.

Seed 000 spent $150 on a run whose model produced noise; its lesson was to overfit a tiny set and
check the model before any long run. The checks, each against a threshold in the `smoke` section:

  preflight       building the model and one optimizer step at the full run's micro-batch and
                  sequence length fit in memory (an OOM is caught and answered with what to change)
  causality       logits before position p do not change when the tokens from p on do (a wrong
                  attention mask lets the model read the token it predicts); eager, as are the
                  validations, so the probe compiles and times the graph train compiles
  init loss       the held-out loss of the untrained model is near ln(vocab), as a uniform guess is
  health          the probe's loss and gradient norm are finite and the loss falls
  generalisation  the held-out loss falls too (Trainer.evaluate shifts its targets apart from the
                  training path): labels equal to the inputs make the training loss fall and this one rise
  data            the loader's share of step time stays below a bound
  tokens          the training tokens are not degenerate: their unigram entropy is above a floor
                  (a broken tokenizer that maps most text to a few ids passes every other check)
  overfit         a fresh model memorises a handful of rows (FIM rows first) within a step budget:
                  lr 0, a broken schedule or broken data fail here

Before the probe, train.precision auto on a CPU is settled from its flags where they are certain (no
AVX-512 BF16 or AMX: fp32), else by timing a few steps in fp32 and in bf16 (pick_precision). The
probe's steady-state figures (kiln.gate.probe: warm-up and compile steps left out, the median of a
few spans) feed the plan (kiln.plan.steps.build_plan), and with the
stage's start-up, one validation and one checkpoint, timed here too (StageTimes), they turn a
train.budget into steps (kiln.plan.steps.budget_steps). The stage script turns what run_checks finds
into the gate's verdict (kiln.plan.verdict.SmokeReport), which train and the report read.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from kiln.config import checkpoint_format
from kiln.config.run_config import RunConfig
from kiln.config.smoke_section import Overfit, SmokeSection
from kiln.config.train_sections import TrainSection
from kiln.data.shards import row_model
from kiln.gate import oom
from kiln.gate.probe import probe, sync
from kiln.io import read_json
from kiln.model.sdpa import kernel_name
from kiln.plan.memory import Estimate, estimate
from kiln.plan.steps import StageTimes
from kiln.plan.verdict import Check
from kiln.train import checkpoint, device, faults
from kiln.train.distributed import barrier, broadcast_object, max_across_ranks, mean_across_ranks
from kiln.train.launch import LAUNCH_START_ENV
from kiln.train.metrics import host_memory_mb
from kiln.train.trainer import Trainer

log = logging.getLogger("kiln.smoke")
PROCESS_START = time.time()  # at import, for a stage started without kiln.train.launch


def oom_advice(train: TrainSection, seq_len: int) -> str:
    """What to change when the full run's step does not fit."""
    micro = train.micro_batch
    tips = []
    if micro > 1:
        tips.append(f"train.micro_batch: {micro // 2} (train.batch_tokens unchanged doubles the gradient accumulation)")
    if train.activation_checkpointing == "none":
        tips.append(
            "train.activation_checkpointing: selective (every other block recomputed in backward: "
            "~1/6 more compute, about half the activation memory), or full"
        )
    elif train.activation_checkpointing == "selective":
        tips.append(
            "train.activation_checkpointing: full (every block recomputed: ~1/3 more compute, "
            "the least activation memory)"
        )
    if train.parallel == "ddp":
        tips.append("train.parallel: fsdp (shard weights, gradients and optimizer state across ranks)")
    tips.append(f"a shorter shard.seq_len than {seq_len}")
    return "out of memory at micro-batch %d x %d tokens; try: %s" % (micro, seq_len, "; ".join(tips))


def causality_leak(model: torch.nn.Module, vocab: int, seq_len: int, dev: torch.device, seed: int) -> float:
    """Largest change of any logit before position p when every token from p on is replaced (fp32,
    eval mode, no autocast). A causal model gives 0 up to rounding."""
    gen = torch.Generator().manual_seed(seed)
    t = min(seq_len, 64)
    p = t // 2
    x = torch.randint(0, vocab, (2, t), generator=gen)
    y = x.clone()
    y[:, p:] = (x[:, p:] + 1 + torch.randint(0, vocab - 1, (2, t - p), generator=gen)) % vocab
    was_training = model.training
    model.eval()
    with torch.no_grad():
        a, _ = model(x.to(dev))
        b, _ = model(y.to(dev))
    model.train(was_training)
    return (a[:, :p].float() - b[:, :p].float()).abs().max().item()


def pick_overfit_rows(trainer: Trainer, n: int, marker_id: int | None, scan: int = 4096) -> torch.Tensor:
    """n train rows in stored order, those holding marker_id (a FIM sentinel) first."""
    rows = trainer.rows
    idx = np.arange(min(len(rows), scan))
    if marker_id is not None:
        first = rows.take(idx)
        has = (first == marker_id).any(dim=1).numpy()
        idx = np.concatenate([idx[has], idx[~has]])
    return rows.take(idx[:n])


def token_entropy_bits(trainer: Trainer, scan: int = 4096) -> float:
    """Unigram entropy (bits per token) of the first `scan` train rows: ~9-11 for BPE on text or
    code, ~5 for raw bytes, near 0 when a tokenizer maps most text to one id."""
    rows = trainer.rows.take(np.arange(min(len(trainer.rows), scan))).numpy().ravel()
    counts = np.bincount(rows)
    p = counts[counts > 0] / rows.size
    return float(-(p * np.log2(p)).sum())


class FixedRows:
    """The loader interface (next, state_dict) over the same rows every step."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def next(self) -> torch.Tensor:
        return self.rows

    def state_dict(self) -> dict:
        return {}


def overfit(
    config: RunConfig, train: TrainSection, shard_dir: Path, cfg: Overfit, marker_id: int | None
) -> tuple[float, int, float]:
    """Train a fresh model on cfg.rows fixed rows, at train.lr held constant after a short warmup,
    until its loss is below cfg.max_loss or cfg.max_steps run out. Returns (loss at the start,
    steps taken, final loss). `config` gives the rest of the stage's sections (seed, model)."""
    # A correctness check, not a speed one: eager, one micro-batch of the chosen rows per step.
    train = train.replace(
        micro_batch=cfg.rows,
        batch_tokens=None,
        schedule="constant",
        warmup_steps=max(1, cfg.max_steps // 10),
        compile=False,
    )
    trainer = Trainer(config.replace(train=train), shard_dir, max_steps=cfg.max_steps)
    trainer.train_on(FixedRows(pick_overfit_rows(trainer, cfg.rows, marker_id)))
    first = last = float("nan")
    for step in range(1, cfg.max_steps + 1):
        loss, _, _ = trainer.train_step()
        last = mean_across_ranks(loss, trainer.dist.world).item()
        first = last if step == 1 else first
        if last < cfg.max_loss or not math.isfinite(last):
            break
    return first, step, last


def _recompiles(graphs: int, steps: int) -> Check:
    """A compiled model compiles in the warm-up steps and never again: every timed step runs the same
    shapes, so a graph compiled then is a recompile, which a long run would pay again and again (and
    past dynamo's cache limit, fall back to eager)."""
    log.info("dynamo: %d graph(s) compiled during the %d timed probe steps", graphs, steps)
    return Check(
        "recompiles",
        graphs == 0,
        f"{graphs} graph(s) compiled during the {steps} timed steps",
        "0 after the warm-up steps",
        "" if graphs == 0 else "the compiled step recompiles: run with TORCH_LOGS=recompiles to see which guard fails",
    )


def _health(losses: list[float], norms: list[float], min_drop: float) -> Check:
    threshold = f"finite; last-quarter mean loss >= {min_drop} nats below the first quarter's"
    if not all(math.isfinite(x) for x in losses + norms):
        bad = next(i for i, (a, b) in enumerate(zip(losses, norms), 1) if not (math.isfinite(a) and math.isfinite(b)))
        return Check(
            "health",
            False,
            f"step {bad}: loss {losses[bad - 1]}, grad norm {norms[bad - 1]}",
            threshold,
            "not finite: lower train.lr, raise train.warmup_steps, check the data",
        )
    q = max(1, len(losses) // 4)
    first, last = sum(losses[:q]) / q, sum(losses[-q:]) / q
    drop = first - last
    return Check(
        "health",
        drop >= min_drop,
        f"loss {first:.4f} -> {last:.4f} (drop {drop:.4f})",
        threshold,
        "" if drop >= min_drop else "the loss did not fall: is the learning rate 0 or the data constant?",
    )


def run_checks(config: RunConfig, shard_dir: Path, out_dir: Path, marker_id: int | None = None) -> dict:
    """Every check and measurement, in the order that fails fastest. Returns, on every rank,
    {"checks": [Check, ...]} plus the measurements in the plain form of
    kiln.plan.verdict.Measurements (absent when the probe did not run). `config` is the stage's
    (seed, model, train, smoke), typed."""
    smoke, train = config.smoke, config.train
    checks: list[Check] = []
    report: dict = {"checks": checks}
    trainer = None
    manifest = read_json(Path(shard_dir) / "manifest.json")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    out_dir.mkdir(parents=True, exist_ok=True)
    oom.clear(out_dir, rank)  # an earlier attempt's record of an OOM
    oom.watch(out_dir, world)  # another rank's OOM ends this one with the same check (kiln.gate.oom)
    # train.micro_batch / activation_checkpointing auto: picked here for this GPU, so the probe times the
    # pick, and the plan hands it to train (kiln.plan.autofit)
    model = row_model(config.model.as_dict(), manifest)
    train = device.fit_auto(train, model, world, device.select_device(train.device))
    memory = _estimate_note(
        estimate_for(config.model.as_dict(), train, manifest, world),
        device.select_device(train.device).type == "cuda",
    )
    extra_s = 0.0  # time spent here on what train does not do (precision timing, the checks)
    try:
        # The probe reaches the full run's peak lr (warmup at most a third of the probe) and holds
        # it: an lr that diverges is caught here, not hours into the run.
        probe_train = train.replace(schedule="constant", warmup_steps=min(train.warmup_steps, smoke.steps // 3))
        started = time.perf_counter()
        precision, candidates, precision_why = pick_precision(config, probe_train, shard_dir, smoke)
        extra_s += time.perf_counter() - started
        probe_train = probe_train.replace(precision=precision)
        train = train.replace(precision=precision)  # the overfit check's too
        # KILN_FAULT's oom, which the probe's steps raise (no train_step runs before the probe)
        trainer = Trainer(
            config.replace(train=probe_train),
            shard_dir,
            max_steps=smoke.steps,
            injected_faults=faults.from_env(rank),
        )
        seq_len, vocab = trainer.model_config.seq_len, trainer.model_config.vocab_size
        # The checks before the probe run eager, so the probe measures the graph train will run. The
        # causality check's 2 rows and a short last validation batch are other shapes: through the
        # compiled model they would be compiled first, and dynamo, seeing a second shape, marks batch
        # and length dynamic for every graph after it, the probe's training step included; train
        # compiles its static training step first (tests/unit/gate/test_smoke.py counts the graphs).
        started = time.perf_counter()
        with torch.compiler.set_stance("force_eager"):
            leak = causality_leak(trainer.model, vocab, seq_len, trainer.dist.device, trainer.seed)
        init = validate_eagerly(trainer, smoke.val_batches).item()
        extra_s += time.perf_counter() - started
        checks.append(
            Check(
                "causality",
                leak <= smoke.causal_tolerance,
                f"max logit change {leak:.2e}",
                f"<= {smoke.causal_tolerance:g}",
                "" if leak <= smoke.causal_tolerance else "the attention mask lets positions see later tokens",
            )
        )
        uniform = math.log(vocab)
        checks.append(
            Check(
                "init loss",
                abs(init - uniform) <= smoke.init_loss_tolerance,
                f"{init:.4f} nats",
                f"within {smoke.init_loss_tolerance:g} of ln({vocab}) = {uniform:.4f}",
                "" if abs(init - uniform) <= smoke.init_loss_tolerance else "check the initialisation scale",
            )
        )
        # train's start-up: this stage's so far, less what train does not do, plus the warm-up steps
        startup_s = time.time() - launch_start() - extra_s
        losses, norms, measured = probe(trainer, smoke.steps, smoke.warmup_steps, out_dir, smoke.profile_step)
        startup_s += measured.warmup_s
    except Exception as exc:  # noqa: BLE001 -- only an out-of-memory error (any rank's) is turned into a check
        where = "building the model" if trainer is None else "the probe steps"
        failure = oom.agree(exc, where, out_dir, rank, world)
        advice = oom_advice(train, manifest["seq_len"])
        checks.insert(
            0,
            Check(
                "preflight",
                False,
                f"{failure.describe(world)}; {memory}",
                "fits in memory",
                f"{advice}. ({failure.error})",
            ),
        )
        return report
    checks.insert(
        0,
        Check(
            "preflight",
            True,
            f"peak memory {measured.peak_memory_mb:,.0f} MB"
            + (f" ({measured.peak_reserved_mb:,.0f} MB reserved)" if measured.peak_reserved_mb is not None else "")
            + f"; {memory}",
            "fits in memory",
        ),
    )
    checks.append(_health(losses, norms, smoke.min_loss_drop))
    if device.use_compile(train.compile, trainer.dist.device):
        checks.append(_recompiles(measured.graphs_in_timed_steps, measured.measured_steps))
    started = time.perf_counter()
    after = validate_eagerly(trainer, smoke.val_batches).item()
    validation_s = (time.perf_counter() - started) * train.eval_batches / smoke.val_batches
    val_drop = init - after
    train_drop = losses[0] - losses[-1]
    checks.append(
        Check(
            "generalisation",
            val_drop >= smoke.min_val_drop,
            f"held-out loss {init:.4f} -> {after:.4f} (drop {val_drop:.4f}; train loss drop {train_drop:.4f})",
            f"drop >= {smoke.min_val_drop:g}",
            ""
            if val_drop >= smoke.min_val_drop
            else "the held-out next-token loss did not fall: are the targets the inputs shifted by one?",
        )
    )
    checks.append(
        Check(
            "data",
            measured.data_wait_fraction <= smoke.max_data_wait,
            f"data wait {measured.data_wait_fraction:.1%} of step time",
            f"<= {smoke.max_data_wait:.0%}",
            ""
            if measured.data_wait_fraction <= smoke.max_data_wait
            else "the loader is a bottleneck: faster disk, or fewer ranks per node reading",
        )
    )
    entropy = token_entropy_bits(trainer)
    checks.append(
        Check(
            "tokens",
            entropy >= smoke.min_token_entropy,
            f"unigram entropy {entropy:.2f} bits/token",
            f">= {smoke.min_token_entropy:g}",
            ""
            if entropy >= smoke.min_token_entropy
            else "the training tokens are nearly constant: check the tokenizer (unknown-token ids?) and the data",
        )
    )
    checkpoint_s, checkpoint_written = _time_checkpoint(trainer, probe_train, out_dir)
    # compiled, stepped and saved: the most a rank's host memory holds (the train job's request)
    host_mb = max_across_ranks(torch.tensor(host_memory_mb()), trainer.dist.world).item()
    report.update(
        probe=asdict(measured),
        losses=losses,
        grad_norms=norms,
        val_loss_init=init,
        val_loss_after=after,
        n_params=trainer.model.num_params(non_embedding=False),
        checkpoint_bytes=_checkpoint_bytes(trainer),
        checkpoint_written_bytes=checkpoint_written,
        model_bytes=_param_bytes(trainer.model),
        train_tokens=trainer.rows.manifest["splits"]["train"]["tokens"],
        batch=asdict(trainer.batch_split),
        device=str(trainer.dist.device),
        world=trainer.dist.world,
        precision=precision,
        precision_tokens_per_s=candidates,
        precision_why=precision_why,
        activation_checkpointing=probe_train.activation_checkpointing,
        host_mb_per_rank=host_mb,
        attention_kernel=kernel_name(
            trainer.model_config,
            trainer.dist.device,
            torch.bfloat16 if precision == "bf16" else torch.float32,
            compiled=device.use_compile(probe_train.compile, trainer.dist.device),
        ),
        times=asdict(
            StageTimes(
                step_s=measured.step_time_s, startup_s=startup_s, validation_s=validation_s, checkpoint_s=checkpoint_s
            )
        ),
    )
    del trainer
    _free_memory()
    start, steps, final = overfit(config, train, shard_dir, smoke.overfit, marker_id)
    ok = final < smoke.overfit.max_loss
    checks.append(
        Check(
            "overfit",
            ok,
            f"loss {start:.4f} -> {final:.4f} in {steps} steps on {smoke.overfit.rows} rows",
            f"< {smoke.overfit.max_loss:g} within {smoke.overfit.max_steps} steps",
            "" if ok else "a fresh model could not memorise a few rows: check lr, schedule, labels and data",
        )
    )
    return report


def validate_eagerly(trainer: Trainer, n_batches: int) -> torch.Tensor:
    """The gate's held-out loss (a device tensor), eager: a correctness figure, for which no graph is
    compiled (the validation's shapes would make dynamo mark the training step's dynamic). Only the
    document mask's flex kernel stays compiled (kiln.model.documents.compiled_flex). kiln.rehearse
    runs this on fake tensors at the full run's shapes."""
    with torch.compiler.set_stance("force_eager"):
        return trainer.validation_loss(n_batches)


def launch_start() -> float:
    """When kiln.train.launch started this stage (epoch seconds), or this process when it did not."""
    return float(os.environ.get(LAUNCH_START_ENV) or PROCESS_START)


CLEARLY_SLOWER = 2.0  # auto's second candidate is dropped once its steps' median is this much the first's


def pick_precision(
    config: RunConfig, probe_train: TrainSection, shard_dir: Path, smoke: SmokeSection
) -> tuple[str, dict[str, float], str]:
    """train.precision, or for auto its pick, the tokens/s of each candidate timed, and why, in words
    ("" for a precision the config names).
    auto: bf16 on a GPU that has it; fp32 on a CPU whose flags say bf16 is emulated there
    (device.cpu_bf16_emulated: timing it would cost minutes at ~34x fp32's step); elsewhere on a CPU
    the faster of fp32 and bf16 over smoke.precision_steps timed steps each (after
    smoke.warmup_steps), bf16 dropped as soon as its steps so far are CLEARLY_SLOWER than fp32's. Each
    step's time is the slowest rank's, so every rank picks alike."""
    if probe_train.precision != "auto":
        return probe_train.precision, {}, ""
    dev = device.select_device(probe_train.device)
    if dev.type == "cuda":
        bf16 = device.use_bf16("bf16", dev)
        return ("bf16" if bf16 else "fp32"), {}, "a GPU " + ("with bf16" if bf16 else "without bf16")
    if device.cpu_bf16_emulated():
        why = "this CPU has neither AVX-512 BF16 nor AMX, so bf16 matmuls would be emulated"
        log.info("precision auto: fp32 (%s)", why)
        return "fp32", {}, why
    rates: dict[str, float] = {}
    fp32_step_s = None
    for candidate in ("fp32", "bf16"):
        steps = smoke.warmup_steps + smoke.precision_steps
        trainer = Trainer(config.replace(train=probe_train.replace(precision=candidate)), shard_dir, max_steps=steps)
        give_up = None if fp32_step_s is None else CLEARLY_SLOWER * fp32_step_s
        step_s, finished = _median_step_s(trainer, smoke.warmup_steps, smoke.precision_steps, give_up)
        rates[candidate] = trainer.batch_split.tokens_per_step / step_s
        fp32_step_s = fp32_step_s or step_s
        del trainer
        _free_memory()
    pick = max(rates, key=rates.get)
    why = "the faster here" if finished else f"bf16 dropped after its first steps, over {CLEARLY_SLOWER:g}x fp32's time"
    log.info("precision auto: %s (%s; %s)", pick, why, ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in rates.items()))
    return pick, rates, why


def _median_step_s(trainer: Trainer, warmup: int, steps: int, give_up_s: float | None) -> tuple[float, bool]:
    """The median seconds of `steps` train steps after `warmup` (the slowest rank's each), and whether
    they all ran: they stop once the median so far exceeds give_up_s. Each step is synced and its
    stop agreed on every rank (max_across_ranks), so the ranks run the same steps."""
    times: list[float] = []
    for i in range(warmup + steps):
        started = time.perf_counter()
        trainer.train_step()
        sync(trainer.dist.device)
        elapsed = max_across_ranks(torch.tensor(time.perf_counter() - started), trainer.dist.world).item()
        if i < warmup:
            continue
        times.append(elapsed)
        if give_up_s is not None and statistics.median(times) > give_up_s and len(times) < steps:
            return statistics.median(times), False
    return statistics.median(times), True


def _time_checkpoint(trainer: Trainer, train: TrainSection, out_dir: Path) -> tuple[float, int]:
    """(seconds, bytes) of one checkpoint written as train writes it, into a scratch folder removed
    after: Trainer.save_checkpoint through a checkpoint.Saver in train.checkpoint_format (async too),
    on every rank, so the model and the optimizer's moments (allocated by the probe's steps) are in it,
    gathered onto rank 0 or written by every rank as its shards. The seconds are the training loop's
    pause, the slowest rank's (train goes on when every rank has; an async save's writing overlaps
    the steps after it, as in train); the bytes are what landed on disk, every rank's files."""
    d = trainer.dist
    scratch = None
    if d.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=".checkpoint-timing-"))
    scratch = broadcast_object(scratch, d.world)
    saver = checkpoint.Saver(
        scratch,
        checkpoint_format(train.checkpoint_format, train.parallel),
        1,
        rank=d.rank,
        world=d.world,
        collective=d.grouped,
        async_save=train.async_checkpoint,
    )
    try:
        sync(d.device)
        barrier(d.world)
        started = time.perf_counter()
        trainer.save_checkpoint(saver)
        took = time.perf_counter() - started
        saver.wait()
        barrier(d.world)  # every rank's files are in before rank 0 counts them
        written = sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file()) if d.is_main else 0
    finally:
        if d.is_main:
            shutil.rmtree(scratch, ignore_errors=True)
    return max_across_ranks(torch.tensor(took), d.world).item(), broadcast_object(written, d.world)


def estimate_for(model: dict, train: TrainSection, manifest: dict, world: int) -> Estimate:
    """kiln.plan.memory's estimate of the run's step as this machine will run it (train.device,
    precision, compile, ranks): printed beside the measured peak, or with an out-of-memory error."""
    dev = device.select_device(train.device)
    cfg = row_model(model, manifest)
    return estimate(cfg, device.step_setting(train, cfg, world, dev))


def _estimate_note(est: Estimate, cuda: bool) -> str:
    measured = (
        "torch.cuda.max_memory_allocated" if cuda else "the process's resident set, interpreter and libraries included"
    )
    return f"tensors estimated per device {est.summary()} (the measured peak is {measured})"


def _param_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights, a tied one once. Under FSDP a parameter is a DTensor whose numel is the
    whole tensor's, not this rank's shard."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _checkpoint_bytes(trainer: Trainer) -> int:
    """Bytes of a checkpoint: the weights and the optimizer state (AdamW: two moments per weight)."""
    opt = sum(
        t.numel() * t.element_size()
        for state in trainer.optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    return _param_bytes(trainer.model) + opt


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
