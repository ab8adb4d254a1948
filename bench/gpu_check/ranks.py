"""The GPU check's two-rank check, for a machine with two or more GPUs: the smoke stage's gate,
then a few DDP steps and a few FSDP2 steps, on 2 ranks under NCCL, started as the stages start them
(kiln.train.launch: torchrun --standalone). NCCL takes only CUDA tensors where gloo, which every CPU
test runs, takes host tensors too: a collective handed a host tensor passes the whole suite and
crashes here. Eager (compile off): the compiled blocks under DDP and FSDP are the same graphs on
gloo (tests/process/test_distributed.py) and a compile on two ranks would not fit the budget.

A llama-family model (GQA, RoPE tables as buffers, which DDP no longer broadcasts) of 4 x 512 at seq
256 on the words of shared.word_shards (learnable, so the gate's loss checks can pass).
Judged: every smoke check passes; DDP's ranks hold the same weights after their steps (the gradient
all-reduce works, and nothing needed the buffers broadcast); FSDP's losses are DDP's (same seed, rows
and bf16 autocast: within 2%). With --cpu-dry-run the same worker runs on gloo at tiny shapes.

    PYTHONPATH=bench torchrun --nproc_per_node 2 -m gpu_check.ranks PLAN.json   # what check_two_ranks runs
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import common  # bench/ is on sys.path (`python bench/gpu_check`, or the ranks' PYTHONPATH): src/ with it
import torch
import torch.distributed as dist

from gpu_check.shared import Ctx, word_shards  # under torchrun: `-m gpu_check.ranks`, bench/ on PYTHONPATH
from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.train import launch

RANKS = 2
LOSS_MATCH = 0.02  # FSDP's losses against DDP's, relative (bf16 autocast, reductions in another order)
# {dry: (model, seq, micro-batch, warm-up steps, timed steps)}
SHAPES = {
    False: ({"family": "llama", "n_layer": 4, "n_head": 8, "n_kv_head": 4, "d_model": 512}, 256, 16, 2, 8),
    True: ({"family": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 32}, 32, 4, 1, 2),
}


def sections(stage: str, dry: bool, parallel: str = "ddp") -> dict:
    """Validated stage sections for 2 ranks, bf16, eager, on word_shards' vocabulary."""
    model, seq, micro, _, _ = SHAPES[dry]
    train = {
        "nproc_per_node": RANKS,
        "parallel": parallel,
        "micro_batch": micro,
        "batch_tokens": RANKS * micro * seq,
        "max_steps": 1000,
        "warmup_steps": 2,
        "lr": 3e-3,
        "precision": "bf16",
        "compile": False,
        "device": "cpu" if dry else "cuda",
    }
    smoke = {"steps": 12, "warmup_steps": 2}
    return kiln_config.stage_sections(stage, seed=1337, shard={"seq_len": seq}, model=model, train=train, smoke=smoke)


def check_two_ranks(ctx: Ctx) -> list[tuple[str, str]]:
    """Rows: the two-rank smoke, DDP, FSDP (checks.CHECKS)."""
    model, seq, micro, _, _ = SHAPES[ctx.dry]
    shards = word_shards(ctx.folder("shards"), seq, rows=64 if ctx.dry else 256)
    plan, result = ctx.work / "plan.json", ctx.work / "result.json"
    plan.write_text(
        json.dumps(
            {"shards": str(shards), "out": str(ctx.work), "dry": ctx.dry, "result": str(result), "started": ctx.started}
        )
    )
    argv = launch.command(
        {"nproc_per_node": RANKS, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": ""},
        ["-m", "gpu_check.ranks", str(plan)],  # torchrun's --module: each rank runs `python -m gpu_check.ranks`
    )
    bench = str(Path(__file__).resolve().parents[1])  # where gpu_check.ranks is found, whatever the cwd; Kiln: src/
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join(p for p in (bench, common.SRC, os.environ.get("PYTHONPATH")) if p),
    )
    ctx.note("torchrun: 2 ranks")
    start = time.perf_counter()
    done = subprocess.run(argv, env=env)  # the ranks' output goes to this check's log
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(
            f"torchrun exit {done.returncode} after {time.perf_counter() - start:.0f} s; last: {_last_note(ctx)}"
        )
    r = json.loads(result.read_text())
    smoke, ddp, fsdp = r["smoke"], r["ddp"], r["fsdp"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(fsdp["losses"], ddp["losses"]))

    def run_figure(run: dict) -> str:
        return (
            f"{run['tokens_per_s']:,.0f} tok/s per device over {run['steps']} steps; loss "
            f"{run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}"
        )

    return [
        ctx.verdict(
            not smoke["failed"],
            f"{smoke['passed']} checks passed"
            + (f", FAILED: {', '.join(smoke['failed'])}" if smoke["failed"] else "")
            + f"; on {smoke['device']}",
        ),
        ctx.verdict(
            ddp["same_weights"],
            run_figure(ddp) + ("; ranks' weights equal" if ddp["same_weights"] else "; ranks' weights DIFFER"),
        ),
        ctx.verdict(worst <= LOSS_MATCH, run_figure(fsdp) + f"; losses within {worst:.1%} of DDP's"),
    ]


def _last_note(ctx: Ctx) -> str:
    notes = (ctx.work / Ctx.PROGRESS).read_text().splitlines() if (ctx.work / Ctx.PROGRESS).exists() else []
    return notes[-1].split("\t", 1)[-1] if notes else "nothing noted"


def _steps(parallel: str, plan: dict) -> dict:
    """A few train steps under `parallel`: losses, throughput, whether every rank holds the same weights."""
    from gpu_check.shared import timed_steps
    from kiln.train.trainer import Trainer

    _, _, _, warmup, steps = SHAPES[plan["dry"]]
    trainer = Trainer(RunConfig.of(sections("train", plan["dry"], parallel)), Path(plan["shards"]))
    losses = []
    real = trainer.train_step

    def train_step():  # every loss of the run, in order (timed_steps reads only the last)
        out = real()
        losses.append(out[0])
        return out

    trainer.train_step = train_step
    rates, _ = timed_steps(trainer, warmup=warmup, steps=steps)
    out = {"losses": [float(x) for x in losses], "tokens_per_s": rates["tokens_per_s"], "steps": rates["steps"]}
    if parallel == "ddp":  # FSDP's ranks hold different shards by design
        sums = [None] * trainer.dist.world
        dist.all_gather_object(sums, sum(p.detach().double().sum().item() for p in trainer.model.parameters()))
        out["same_weights"] = len(set(sums)) == 1
    return out


def main() -> None:
    """Under torchrun: the smoke gate, then DDP and FSDP steps, in one process group; rank 0 writes
    the result file the plan names."""
    import dataclasses

    from kiln.gate.checks import run_checks
    from kiln.train.distributed import init_distributed, shutdown

    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed("cpu" if plan["dry"] else "cuda")
    # rank 0 notes its progress in the check's file (time.monotonic is the machine's clock, not the process's)
    ctx = Ctx(plan["dry"], Path(plan["out"]), started=plan["started"]) if d.is_main else None
    note = ctx.note if ctx else (lambda what: None)
    note(f"{d.world} ranks joined; the smoke gate")
    report = run_checks(RunConfig.of(sections("smoke", plan["dry"])), Path(plan["shards"]), Path(plan["out"]) / "smoke")
    checks = [dataclasses.asdict(c) for c in report["checks"]]
    smoke = {
        "passed": sum(c["passed"] for c in checks),
        "failed": [c["name"] for c in checks if not c["passed"]],
        "device": report.get("device", str(d.device)),
    }
    note(f"smoke: {smoke['passed']} checks passed, failed: {smoke['failed'] or 'none'}; DDP steps")
    result = {"smoke": smoke, "ddp": _steps("ddp", plan)}
    note(f"DDP: {result['ddp']['tokens_per_s']:,.0f} tok/s per device; FSDP steps")
    result["fsdp"] = _steps("fsdp", plan)
    if d.is_main:
        Path(plan["result"]).write_text(json.dumps(result))
    shutdown(synced=True)


if __name__ == "__main__":
    main()
