"""The training loop shared by the smoke and train stages (same code path, same parallelism).

One optimizer step = grad_accum micro-batches of micro_batch rows on each of W ranks, so a step
consumes W * grad_accum * micro_batch * seq_len tokens. Gradients sync only on the last micro-batch
(DDP no_sync). Losses stay on the device between log steps: the host waits on the device only when
it has something to print.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_model
from torch.nn.parallel import DistributedDataParallel

from kiln.data.loader import ShardRows, TrainBatches, eval_batches
from kiln.errors import KilnError
from kiln.io import write_json
from kiln.model.gpt import GPT, GPTConfig
from kiln.train import checkpoint
from kiln.train.distributed import Dist, init_distributed, mean_across_ranks, shutdown
from kiln.train.metrics import MetricsSink, flops_per_token, peak_flops
from kiln.train.optim import build_adamw
from kiln.train.schedule import lr_at

log = logging.getLogger("kiln.train")


@dataclass
class RunResult:
    """What a run reports back: per-log-step losses, throughput and memory."""

    losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_s: float = 0.0
    step_time_s: float = 0.0
    data_wait_fraction: float = 0.0
    peak_memory_mb: float = 0.0
    mfu: float | None = None
    n_params: int = 0
    steps: int = 0
    tokens_seen: int = 0
    is_main: bool = True  # rank 0, the rank that writes reports


def model_config(model_section: dict, shard_manifest: dict) -> GPTConfig:
    return GPTConfig(
        vocab_size=shard_manifest["padded_vocab_size"], seq_len=shard_manifest["seq_len"], **model_section
    )


def _fingerprint(cfg: GPTConfig, manifest: dict, seed: int, train: dict, world: int) -> str:
    shards = [s["sha256"] for e in manifest["splits"].values() for s in e["shards"]]
    key = {"model": cfg.to_dict(), "shards": shards, "seed": seed, "world": world,
           "micro_batch": train["micro_batch"], "grad_accum": train["grad_accum"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _format_eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


@torch.no_grad()
def val_loss(model: torch.nn.Module, rows: ShardRows, micro_batch: int, max_batches: int, d: Dist,
             autocast) -> float:
    model.eval()
    total = torch.zeros((), device=d.device)
    count = 0
    for batch in eval_batches(rows, micro_batch, max_batches, d.rank, d.world):
        batch = batch.to(d.device)
        with autocast():
            _, loss = model(batch[:, :-1], batch[:, 1:])
        total += loss.float()
        count += 1
    model.train()
    return mean_across_ranks(total / max(count, 1), d.world).item()


def run(sections: dict, shard_dir: Path, out_dir: Path, *, max_steps: int | None = None,
        smoke: bool = False) -> RunResult:
    """Train per `sections` (seed, model, train[, wandb]) on shard_dir; write into out_dir.

    The full run (smoke=False) logs metrics.jsonl, keeps checkpoints under out_dir/checkpoints (and
    resumes from the newest one) and saves the final model.safetensors + model_config.json. The smoke
    run logs every step and writes nothing but what its caller writes from the result.
    """
    train, seed = sections["train"], sections["seed"]
    d = init_distributed()
    max_steps = max_steps or train["max_steps"]
    torch.manual_seed(seed)
    rows, val_rows = ShardRows(shard_dir, "train"), ShardRows(shard_dir, "val")
    cfg = model_config(sections["model"], rows.manifest)
    raw_model = GPT(cfg).to(d.device)
    model = DistributedDataParallel(raw_model) if d.world > 1 else raw_model
    if train["compile"]:
        model = torch.compile(model)
    optimizer = build_adamw(raw_model, train, d.device.type)
    batches = TrainBatches(rows, train["micro_batch"], seed, d.rank, d.world)
    use_bf16 = train["precision"] == "bf16" and (d.device.type == "cpu" or torch.cuda.is_bf16_supported())

    def autocast():
        return torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=use_bf16)

    accum = train["grad_accum"]
    step_tokens = d.world * accum * train["micro_batch"] * cfg.seq_len
    log_every = 1 if smoke else train["log_every"]
    fingerprint = _fingerprint(cfg, rows.manifest, seed, train, d.world)
    ckpt_root = out_dir / "checkpoints"
    start_step, tokens_seen = 0, 0
    if not smoke:
        state = checkpoint.load_latest(ckpt_root, fingerprint)
        if state is not None:
            raw_model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            batches.load_state_dict(state["data"])
            checkpoint.set_rng_state(state["rng"])
            start_step, tokens_seen = state["step"], state["tokens_seen"]
            log.info("resumed from step %d (%d tokens seen)", start_step, tokens_seen)
    result = RunResult(n_params=raw_model.num_params(non_embedding=False), is_main=d.is_main)
    if d.is_main:
        log.info("model: %s, %.2fM parameters; %d ranks x %d micro-batches x %d rows x %d tokens = %d tokens/step",
                 cfg.to_dict(), result.n_params / 1e6, d.world, accum, train["micro_batch"], cfg.seq_len, step_tokens)
    sink = MetricsSink(out_dir / "metrics.jsonl", sections.get("wandb", {"mode": "disabled"}),
                       sections, enabled=d.is_main and not smoke, resume_step=start_step)
    flops_token, peak = flops_per_token(raw_model), peak_flops(d.device)
    params = [p for p in raw_model.parameters()]
    clip = train["grad_clip"] if train["grad_clip"] > 0 else math.inf

    # Throughput is timed per log window; the first window pays one-off costs (allocator warm-up,
    # compilation) and is left out of the steady-state figure unless it is the only one.
    loop_start = window_start = time.perf_counter()
    window_tokens = window_steps = timed_tokens = 0
    data_wait = timed_time = 0.0
    first_window = True
    loss_sum = torch.zeros((), device=d.device)
    for step in range(start_step, max_steps):
        lr = lr_at(step, lr=train["lr"], min_lr=train["min_lr"], warmup_steps=train["warmup_steps"],
                   max_steps=max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(accum):
            t0 = time.perf_counter()
            batch = batches.next().to(d.device, non_blocking=True)
            data_wait += time.perf_counter() - t0
            last = micro == accum - 1
            sync = contextlib.nullcontext() if (last or d.world == 1) else model.no_sync()
            with sync, autocast():
                _, loss = model(batch[:, :-1], batch[:, 1:])
            (loss / accum).backward()
            loss_sum += loss.detach() / accum
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += step_tokens
        window_tokens += step_tokens
        window_steps += 1
        done = step + 1
        if done % log_every == 0 or done == max_steps:
            mean_loss = mean_across_ranks(loss_sum, d.world).item() / window_steps
            loss_sum.zero_()
            elapsed = time.perf_counter() - window_start
            if not first_window or done == max_steps:
                timed_time += elapsed
                timed_tokens += window_tokens
            first_window = False
            tok_s = window_tokens / elapsed
            record = {"step": done, "loss": mean_loss, "lr": lr, "grad_norm": grad_norm.item(),
                      "tokens": tokens_seen, "tokens_per_s": tok_s,
                      "mfu": flops_token * tok_s / (peak * d.world) if peak else None}
            result.losses.append(mean_loss)
            if not math.isfinite(mean_loss):
                sink.log(record)
                sink.close()
                raise KilnError(f"train: step {done}: loss is {mean_loss}; lower train.lr, raise "
                                "train.warmup_steps or check the data (see the smoke stage)")
            if d.is_main:
                rate = timed_tokens / timed_time if timed_tokens else tok_s
                eta = (max_steps - done) * step_tokens / rate
                log.info("step %d/%d | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | ETA %s",
                         done, max_steps, mean_loss, lr, record["grad_norm"], tok_s, _format_eta(eta))
            if not smoke and (done % train["eval_every"] == 0 or done == max_steps):
                record["val_loss"] = val_loss(model, val_rows, train["micro_batch"], train["eval_batches"], d, autocast)
                result.val_losses.append((done, record["val_loss"]))
                if d.is_main:
                    log.info("step %d | val loss %.4f", done, record["val_loss"])
            sink.log(record)
            window_start, window_tokens, window_steps = time.perf_counter(), 0, 0
        if not smoke and d.is_main and (done % train["checkpoint_every"] == 0 or done == max_steps):
            checkpoint.save(ckpt_root, {
                "step": done, "tokens_seen": tokens_seen, "model": raw_model.state_dict(),
                "optimizer": optimizer.state_dict(), "data": batches.state_dict(),
                "rng": checkpoint.rng_state(), "fingerprint": fingerprint, "config": sections,
            }, keep=train["keep_checkpoints"])
    sink.close()
    result.steps, result.tokens_seen = max_steps, tokens_seen
    result.tokens_per_s = timed_tokens / timed_time if timed_time else 0.0
    result.step_time_s = step_tokens / result.tokens_per_s if result.tokens_per_s else 0.0
    result.data_wait_fraction = data_wait / (time.perf_counter() - loop_start)
    result.mfu = flops_token * result.tokens_per_s / (peak * d.world) if peak else None
    result.peak_memory_mb = _peak_memory_mb(d.device)
    if not smoke and d.is_main:
        save_final(raw_model, out_dir)
    shutdown(d.world)
    return result


def save_final(model: GPT, out_dir: Path) -> None:
    write_json(out_dir / "model_config.json", model.cfg.to_dict())
    tmp = out_dir / ".model.safetensors.tmp"
    save_model(model, str(tmp))  # handles the tied embedding/head weight
    tmp.replace(out_dir / "model.safetensors")


def load_model(out_dir: Path, device: torch.device | str = "cpu") -> GPT:
    """The final model a train stage saved."""
    from safetensors.torch import load_model as load_into

    cfg = GPTConfig(**json.loads((out_dir / "model_config.json").read_text()))
    model = GPT(cfg)
    load_into(model, str(out_dir / "model.safetensors"))
    return model.to(device).eval()
