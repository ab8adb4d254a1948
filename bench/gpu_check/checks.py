"""The GPU check's checks (bench/gpu_check, run as `python bench/gpu_check`): each a function of its
context (shared.Ctx) returning its table rows' (result, figure), and CHECKS, the table: each check's
rows, what each row expects, and its time budget on the GPU (docs/benchmarks.md, "GPU check").
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import common  # bench/ is on sys.path (__main__): src/ with it
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from train_throughput import synthetic_shards  # bench/ is on sys.path (__main__)

from gpu_check import image
from gpu_check.benches import COMPILED_LOOP_MARK, check_generate_bench, check_train_bench
from gpu_check.fsdp_one_rank import check_fsdp_one_rank
from gpu_check.llama import (
    ESTIMATE_TOLERANCE,
    LOSS_PEAK_RATIO,
    MFU_TARGET,
    MFU_TARGET_TORCHTITAN,
    check_llama_mfu,
    check_loss,
)
from gpu_check.ranks import check_two_ranks
from gpu_check.seed_000 import STEPS as SEED_STEPS
from gpu_check.seed_000 import check_seed_000
from gpu_check.shared import (
    Ctx,
    host_copy_runs_ahead,
    pct,
    profiled,
    sections,
    stop_flag_reads,
    timed_steps,
    word_shards,
)
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import TrainSection
from kiln.data.loader import ShardRows
from kiln.eval.perplexity import BATCH, val_rows_loss
from kiln.gate.checks import probe
from kiln.generate.decode import generate
from kiln.layout import Layout
from kiln.model.build import build_model, load_model, save_model
from kiln.plan.anchors import LLM_C_GPT2, SEED_000
from kiln.train.device import autocast, eval_autocast, to_device
from kiln.train.optim import build_adamw
from kiln.train.parallel import compile_blocks
from kiln.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
# Kiln's attention at gpt2-124m's and llama3.2-1b's head shapes (head dim 64; 32 query heads over 8
# key/value heads), then a dry run's: {family: (GPU shape, dry-run shape)}
ATTENTION = {
    "gpt2": ({"n_head": 12, "d_model": 768}, {"n_head": 2, "d_model": 128}),
    "llama": ({"n_head": 32, "n_kv_head": 8, "d_model": 2048}, {"n_head": 2, "n_kv_head": 1, "d_model": 128}),
}
RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):", re.MULTILINE)  # Snakemake's line as it starts a job


# --- the checks: each returns its table rows' (result, figure) -------------------------------------


def check_flash(ctx: Ctx) -> list[tuple[str, str]]:
    """Flash forced (sdpa_kernel) on bf16 causal attention at head dims 64 and 128 against the math
    backend in fp32; then which kernel SDPA picks by itself inside Kiln's two families (GQA for llama)."""
    dev, (B, T) = ctx.device, ((2, 128) if ctx.dry else (4, 4096))
    ok, parts = True, []
    for head_dim in (64, 128):
        H = (256 if ctx.dry else 2048) // head_dim
        q, k, v = (torch.randn(B, H, T, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(3))  # (B, H, T, D)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot take these inputs
            ops, y = profiled(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        flash = any("flash" in op for op in ops)
        ok &= flash and torch.allclose(y.float(), ref, atol=2e-2, rtol=2e-2)
        parts.append(f"D{head_dim}: {'flash' if flash else 'NOT flash'}, max err {(y.float() - ref).abs().max():.1e}")
    for family, shapes in ATTENTION.items():
        with torch.device(dev):
            model = build_model(model_config({"family": family, "n_layer": 1, **shapes[ctx.dry]}, 512, T)).eval()
        idx = torch.randint(0, 512, (B, T), device=dev)
        with torch.no_grad(), autocast(dev, bf16=True)():  # as train and a GPU eval run it
            ops, _ = profiled(lambda: model(idx))
        kernels = sorted(
            op.removeprefix("aten::_scaled_dot_product_") for op in ops if op.startswith("aten::_scaled_dot_product_")
        )
        # unforced, SDPA may prefer cuDNN's fused attention on Hopper (as fast); efficient or math is a slow path
        ok &= any("flash" in op or "cudnn" in op for op in kernels)
        parts.append(f"{family}: {', '.join(kernels) or 'math (no fused kernel)'}")
    return [ctx.verdict(ok, "; ".join(parts))]


def check_fused_adamw(ctx: Ctx) -> list[tuple[str, str]]:
    """kiln.train.optim.build_adamw asks for fused=True on CUDA and CPU: did the fused kernel run?"""
    train = sections(ctx, "gpt2-124m", 128, 2)
    with torch.device(ctx.device):
        model = build_model(model_config(train["model"], 512 if ctx.dry else 50304, 128))
    optimizer = build_adamw(model, TrainSection.of(train["train"]), ctx.device.type)
    idx = torch.randint(0, 512, (2, 128), device=ctx.device)
    model(idx, idx)[1].backward()
    ops, _ = profiled(optimizer.step)
    adam = sorted(op for op in ops if "adam" in op.lower())
    ok = optimizer.defaults.get("fused") is True and any("_fused_adamw" in op for op in adam)
    return [ctx.verdict(ok, f"fused={optimizer.defaults.get('fused')}; the step ran {', '.join(adam) or 'no Adam op'}")]


def _grad_norm(model: torch.nn.Module) -> float:
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]).item()


def _loss_and_norm(trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """One forward and backward: the loss and the gradient norm, gradients cleared after."""
    with trainer.autocast():
        _, loss = trainer.wrapped(x, y)
    loss.backward()
    norm = _grad_norm(trainer.model)
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.item(), norm


def check_compile_and_gpt2(ctx: Ctx) -> Iterator[tuple[str, str]]:
    """gpt2-124m, seq 1024, as the train stage builds it (compile auto: on for CUDA, each block on its
    own, kiln.train.parallel.compile_blocks). At micro-batch 16: one batch through the eager and the
    compiled model (loss, gradient norm, compile time, dynamo's graph count: one for all the blocks) and
    the stop flag's two reads. At llm.c's micro-batch 64: Kiln's Throughput over timed train steps,
    against llm.c's tokens/s (kiln.plan.anchors). Each row is yielded as it is known."""
    seq, micro, llm_c_micro = (64, 4, 8) if ctx.dry else (1024, 16, 64)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    ctx.note("building gpt2-124m")
    shards = synthetic_shards(ctx.folder("shards"), 512 if ctx.dry else 50257, seq, rows=llm_c_micro, seed=1337)
    trainer = _gpt2_trainer(ctx, shards, seq, micro)
    batch = to_device(trainer.batches.next(), trainer.dist.device)  # (B, T + 1), split as train_step splits it
    x, y = batch[:, :-1], batch[:, 1:]

    with torch.compiler.set_stance("force_eager"):
        eager = _loss_and_norm(trainer, x, y)
    ctx.note(f"eager loss {eager[0]:.4f}; compiling")
    start = time.perf_counter()
    compiled = _loss_and_norm(trainer, x, y)  # compiles the blocks' forward, then their backward
    compile_s = time.perf_counter() - start
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    ctx.note(f"compiled in {compile_s:.0f} s ({graphs} graphs); loss {compiled[0]:.4f} vs eager {eager[0]:.4f}")
    close = abs(compiled[0] - eager[0]) <= 5e-3 * abs(eager[0]) and abs(compiled[1] - eager[1]) <= 5e-2 * eager[1]
    yield ctx.verdict(
        close,
        f"compile {compile_s:.1f} s, per block: {graphs} dynamo graph(s) for "
        f"{len(trainer.model.blocks)} blocks and the loss; loss {compiled[0]:.4f} vs eager {eager[0]:.4f}, "
        f"grad norm {compiled[1]:.3f} vs {eager[1]:.3f}",
    )
    ctx.note("the stop flag's read, two ways")
    reads = stop_flag_reads(trainer, 2 if ctx.dry else 10)
    ahead = host_copy_runs_ahead(ctx.device)
    yield ctx.verdict(
        ahead,
        f"{reads['host copy']:,.0f} tok/s reading the previous step's stop flag from its host copy vs "
        f"{reads['.item()']:,.0f} with .item() ({reads['host copy'] / reads['.item()']:.3f}x); "
        f"the read returns with later work still queued: {ahead}",
    )
    del trainer, x, y, batch
    _free()
    ctx.note(f"building it at micro-batch {llm_c_micro} (llm.c's)")
    trainer = _gpt2_trainer(ctx, shards, seq, llm_c_micro)
    rates, mem = timed_steps(trainer, warmup=1 if ctx.dry else 3, steps=2 if ctx.dry else 30, ctx=ctx, reserve_s=10)
    loss = "whole" if trainer.model.loss_rows else "in chunks"
    figure = (
        f"micro-batch {llm_c_micro}, the loss {loss}: {rates['tokens_per_s']:,.0f} tok/s per device over "
        f"{rates['steps']} steps, MFU {pct(rates['mfu'])} (torchtitan transformers-backend count "
        f"{pct(rates['mfu_torchtitan'])}), peak {mem / 1024:.1f} GiB"
    )
    ctx.note(figure)
    yield (
        ctx.verdict(True, figure)
        if ctx.dry
        else ("measured", f"{figure}; {rates['tokens_per_s'] / LLM_C_GPT2.tokens_per_s_per_gpu:.2f}x llm.c")
    )


def _gpt2_trainer(ctx: Ctx, shards: Path, seq: int, micro: int) -> Trainer:
    """gpt2-124m as train builds it; in the dry run two blocks (one graph for both shows dynamo reusing
    it), compiled per block with aot_eager (inductor's C++ build takes ~20 s on 2 cores)."""
    train = sections(ctx, "gpt2-124m", seq, micro)
    if ctx.dry:
        train["model"]["n_layer"] = 2
    trainer = Trainer(RunConfig.of(train), shards)
    if ctx.dry:
        compile_blocks(trainer.model, backend="aot_eager")  # train's own path (kiln.train.parallel), per block
    return trainer


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_smoke_snapshot(ctx: Ctx) -> list[tuple[str, str]]:
    """The smoke stage's probe with smoke.profile_step: trace.json, and on CUDA memory_snapshot.pickle.
    Eager (compile is the compile check's), the default config's 4x256 GPT."""
    shards = synthetic_shards(ctx.folder("shards"), 512, 64, rows=64, seed=1337)
    trainer = Trainer(RunConfig.of(sections(ctx, None, 64, 8, compile_model=False)), shards)
    out = ctx.work / "smoke"
    probe(trainer, steps=4, warmup=1, trace_dir=out, profile_step=2)
    trace, snap = out / "trace.json", out / "memory_snapshot.pickle"
    figure = f"trace.json {trace.stat().st_size / 2**20:.1f} MiB" if trace.exists() else "no trace.json"
    if ctx.dry:
        return [ctx.verdict(trace.exists(), figure + " (the snapshot is CUDA-only)")]
    if not snap.exists():
        return [("FAIL", figure + "; no memory_snapshot.pickle")]
    with open(snap, "rb") as f:  # written by torch a moment ago, in this folder
        data = pickle.load(f)
    traces = sum(len(t) for t in data.get("device_traces", []))
    ok = trace.exists() and bool(data.get("segments")) and traces > 0
    return [
        ctx.verdict(
            ok,
            f"{figure}; memory_snapshot.pickle {snap.stat().st_size / 2**20:.1f} MiB, "
            f"{len(data.get('segments', []))} segments, {traces:,} allocation events",
        )
    ]


def check_eval(ctx: Ctx) -> list[tuple[str, str]]:
    """A 4x256 GPT trained 60 steps on learnable tokens, saved as the train stage saves it, then the
    eval stage's held-out loss (val_rows_loss, as HeldOut.overall calls it) on the GPU under bf16
    autocast against the CPU in fp32; and greedy KV-cached decoding on both."""
    seq = 64 if ctx.dry else 256
    shards = word_shards(ctx.folder("shards"), seq, rows=128)
    trainer = Trainer(RunConfig.of(sections(ctx, None, seq, 16, compile_model=False)), shards)
    for _ in range(10 if ctx.dry else 60):
        trainer.train_step()
    model_dir = ctx.folder("train")
    save_model(trainer.model_config, trainer.model.state_dict(), model_dir)
    rows, batches = ShardRows(shards, "val"), 4
    prompts = [r[:16].tolist() for r in rows.take(np.arange(8))]
    cpu_model = load_model(model_dir, "cpu")
    cpu_loss, _ = val_rows_loss(cpu_model, rows, BATCH, batches)
    cpu_ids = generate(cpu_model, prompts, 16)
    if ctx.dry:
        return [ctx.verdict(True, f"val loss {cpu_loss:.4f} (fp32)")]
    gpu_model = load_model(model_dir, ctx.device)
    with eval_autocast(ctx.device, "bf16")():
        gpu_loss, _ = val_rows_loss(gpu_model, rows, BATCH, batches)
        gpu_ids = generate(gpu_model, prompts, 16)
    same = sum(a == b for a, b in zip(cpu_ids, gpu_ids))
    ok = abs(gpu_loss - cpu_loss) <= 1e-2 * cpu_loss
    return [
        ctx.verdict(
            ok,
            f"val loss GPU bf16 {gpu_loss:.4f} vs CPU fp32 {cpu_loss:.4f} "
            f"(diff {gpu_loss - cpu_loss:+.4f}); greedy decodes equal {same}/{len(prompts)}",
        )
    ]


def check_pipeline(ctx: Ctx) -> list[tuple[str, str]]:
    """tests/configs/tiny.yaml end to end through Snakemake with --config train={device: cuda}, which
    Snakemake merges into the file's train section key by key (the dry run checks that it did). Its
    200 steps of a 2-layer model take seconds on a GPU; the budget is for what does not shrink with
    steps: ~8 interpreter starts, the smoke stage's compile (train's hits inductor's cache) and
    lm-eval's import. Stopped over budget, the row names the rule Snakemake was at."""
    gone = image.missing(image.PIPELINE_MODULES)
    if gone:  # a node with torch and Kiln's train wheels only (gpu_check.image): every other row runs
        return [
            (
                f"skipped: no {', '.join(gone)} here",
                "the pipeline runs every stage, the data and eval stages' packages included",
            )
        ]
    run = ctx.work / "run"
    cmd = [
        str(Path(sys.executable).with_name("snakemake")),
        "--cores",
        "all",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(run),
        "--configfile",
        str(REPO / "tests" / "configs" / "tiny.yaml"),
        "--config",
        "train={device: cuda}",
    ] + (["-n", "-p"] if ctx.dry else [])
    env = dict(  # this clone's Kiln for the Snakefile and every stage, as for the check (common.SRC)
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join(p for p in (common.SRC, os.environ.get("PYTHONPATH")) if p),
    )
    start, log, rule = time.perf_counter(), ctx.work / "snakemake.log", None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:  # note the rule Snakemake is at, for the row of a run over budget
            time.sleep(0.5)
            rules = RULE.findall(log.read_text(errors="replace"))
            if rules and rules[-1] != rule:
                rule = rules[-1]
                ctx.note(f"snakemake at rule {rule} ({len(set(rules))} rules started)")
    wall, text = time.perf_counter() - start, log.read_text(errors="replace")
    print(text)
    if ctx.dry:
        merged = '"device":"cuda"' in text and '"micro_batch":16' in text  # tiny.yaml's, kept
        return [
            ctx.verdict(
                proc.returncode == 0 and merged,
                "snakemake -n: "
                + (
                    "train.device cuda merged into tiny.yaml's train section"
                    if merged
                    else "the override did not merge"
                ),
            )
        ]
    if proc.returncode != 0:
        return [("FAIL", f"snakemake exit {proc.returncode} after {wall:.0f} s at rule {rule} (log: {log})")]
    paths = Layout(run="tiny", root=run / "results", keys={})  # the run's own stages' paths need no data keys
    smoke = json.loads(Path(paths.output("smoke", "report.json")).read_text())
    metrics = json.loads(Path(paths.output("eval", "metrics.json")).read_text())
    eval_on_cuda = "eval on cuda" in Path(paths.log("eval")).read_text()
    ok = (
        Path(paths.output("report", "report.md")).exists()
        and str(smoke.get("device", "")).startswith("cuda")
        and eval_on_cuda
    )
    return [
        ctx.verdict(
            ok,
            f"{wall:.0f} s; smoke on {smoke.get('device')}, eval on "
            f"{'cuda' if eval_on_cuda else 'NOT cuda'}, val loss {metrics['val_loss']:.3f}; a rank's host memory "
            f"{smoke.get('host_mb_per_rank', 0):.0f} MB with its compile workers (train's Slurm request: that x 1.5 "
            "per rank + 1 GiB, issue 29's O2)",
        )
    ]


@dataclass(frozen=True)
class Check:
    slug: str
    rows: tuple[str, ...]  # the table rows it fills
    expected: tuple[str, ...]
    budget_s: float  # on the GPU: with ENVIRONMENT_S they sum to well under DEADLINE_S (docs/benchmarks.md)
    run: Callable[
        [Ctx], Iterable[tuple[str, str]]
    ]  # the rows, a generator yielding each as it is known where they come one by one
    gpus: int = 1  # GPUs it needs: with fewer its rows are skipped, saying so


CHECKS = (
    Check(
        "flash",
        ("flash SDPA",),
        (
            "flash kernel forced at D 64/128 (max err vs math <= 2e-2); flash or cuDNN "
            "picked in Kiln's gpt2 and llama (GQA) attention",
        ),
        8,  # 5 s on the H200
        check_flash,
    ),
    Check("adamw", ("fused AdamW",), ("fused=True and aten::_fused_adamw_ in the step",), 8, check_fused_adamw),
    Check(
        "gpt2",
        (
            "torch.compile gpt2-124m",
            "host run-ahead, stop flag read",
            "MFU gpt2-124m seq 1024",
        ),
        (
            "compiles per block; loss within 0.5%, grad norm within 5% of eager (bf16)",
            "host copy read before later work ends; tok/s >= .item()'s",
            f"~{LLM_C_GPT2.tokens_per_s_per_gpu / 1200:.0f}k tok/s/GPU (llm.c, one H100)",
        ),
        70,  # 33 s on the H200 before issue 46 added the build at micro-batch 64 and its timed steps
        check_compile_and_gpt2,
    ),
    Check(
        "gpt2-bench",
        ("bench/train_throughput.py gpt2-124m",),
        (f"Kiln >= {COMPILED_LOOP_MARK:g}x nanoGPT's loop compiled whole (0.85x measured on the H200)",),
        50,  # two builds of gpt2-124m, nanoGPT's loop compiled whole (Kiln's per-block compile: 14 s on the H200), 2 x 13 steps each
        check_train_bench,
    ),
    Check(
        "loss",
        ("chunked loss memory, flagship logits",),
        (f"chunked peak <= {LOSS_PEAK_RATIO:g}x the plain loss's; loss within 1e-3, gradients 2e-2 (bf16)",),
        8,  # 3 s on the H200
        check_loss,
    ),
    Check(
        "llama",
        (
            "MFU llama3.2-1b seq 8192",
            "MFU llama3.2-1b, torchtitan transformers-backend count",
            "memory estimate llama3.2-1b seq 8192",
        ),
        (
            f"MFU >= {MFU_TARGET:.1%} (seed 000's {SEED_000.tokens_per_s_per_gpu / 1000:.1f}k tok/s per H100, Kiln's FLOP count)",
            f"MFU >= {MFU_TARGET_TORCHTITAN:.1%} (the same throughput)",
            f"kiln.plan.memory within {ESTIMATE_TOLERANCE:.0%} of max_memory_allocated, eager and compiled",
        ),
        45,  # 27 s on the first H200 run (2026-12-04), its compile included
        check_llama_mfu,
    ),
    Check(
        "snapshot",
        ("smoke memory snapshot",),
        ("memory_snapshot.pickle with segments and events; trace.json",),
        10,
        check_smoke_snapshot,
    ),
    Check("eval", ("eval on GPU vs CPU",), ("val loss within 1% (bf16 vs fp32)",), 12, check_eval),  # 6 s on the H200
    Check(
        "pipeline", ("tiny pipeline, train.device=cuda",), ("report.md; smoke and eval on cuda",), 150, check_pipeline
    ),
    Check(
        "generate-bench",
        ("bench/generate.py",),
        (">= 5x the uncached loop, and >= the decode rate the eval's price assumes (kiln.plan.decode)",),
        12,  # 9 s on the H200
        check_generate_bench,
    ),
    Check(
        "fsdp-one-rank",
        ("FSDP2 on one rank, NCCL, compiled", "FSDP2 on one rank, DCP resume"),
        ("losses within 2% of the plain rank's", "resumed from DCP shards: losses within 0.5% of the run's own"),
        # the plain rank eager (~3 s); the mode: NCCL's init, a cold per-block compile (the gpt2 row's
        # took 14 s on the H200), the validation's compile, 12 steps, 2 DCP saves (~30 s); the resume:
        # NCCL again, the compile from inductor's cache, a DCP load, 6 steps (~12 s)
        50,
        check_fsdp_one_rank,
    ),
    Check(
        "seed-000",
        (
            "seed 000's path: 1B, flex document mask, compiled, FSDP2 one rank, Muon",
            "seed 000's path: the smoke gate's eager validation",
            "seed 000's path: the in-loop decode",
        ),
        (
            f"{SEED_STEPS} steps of finite loss, every parameter a DTensor, flex's block mask",
            "finite; peak <= the train step's (flex stays compiled under force_eager)",
            "every prompt decodes eval.in_loop.max_new_tokens; the model back in train mode",
        ),
        60,  # issue 59's bound on one H100: NCCL's init, the 1B build, a cold per-block compile with flex, a flex compile for the validation, the decode
        check_seed_000,
    ),
    Check(
        "two-ranks",
        ("two-rank smoke, NCCL", "DDP 2 ranks, NCCL", "FSDP 2 ranks, NCCL"),
        ("every smoke check passes", "ranks' weights equal after the steps", "losses within 2% of DDP's"),
        40,
        check_two_ranks,
        gpus=2,
    ),
)
ENVIRONMENT_S = 10  # the probe of CUDA and the GPUs
# The whole run, enforced: 9 minutes, a device command's 10-minute limit less a minute for the
# interpreter's start and the table (the budgets: 493 s with one GPU, 533 s with 2+)
DEADLINE_S = 540
MIN_START_S = 5  # a check is not started with less of the deadline left
