"""The CUDA paths no CPU test reaches, run on one H100/H200 in at most 8 minutes, as one table.

    python bench/gpu_check.py                  # one GPU: ~6 minutes, 8 at most (the budgets below)
    python bench/gpu_check.py --only flash,eval --budget-scale 2
    python bench/gpu_check.py --cpu-dry-run    # no GPU: what runs on the CPU, tiny shapes (CI: tests/test_gpu_check.py)

Each check runs in a process forked from this one (torch imported once, CUDA first touched in the
child) under its own time budget: a hang, a crash or an OOM ends that check alone, as a FAIL, and the
next one starts on a free GPU. A check's output goes to <out>/<check>.log; stdout gets one table,
check | result | figure | expected, and the exit status is 1 when any result is FAIL. A result is
pass, FAIL, "measured" (a figure with no pass mark: llm.c's tokens/s is a reference, not a Kiln
target) or "skipped: <why>". With --cpu-dry-run CUDA is hidden and every check runs its CPU-capable
part at tiny shapes: it FAILs if that part breaks, else reads "skipped: no CUDA" with what the CPU
part measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import pickle
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gpu_check_common import NO_CUDA, Ctx, pct, profiled, sections, timed_steps  # bench/ is sys.path[0]
from gpu_check_llama import (ESTIMATE_TOLERANCE, LOSS_PEAK_RATIO, MFU_TARGET, MFU_TARGET_TORCHTITAN, check_llama_mfu,
                             check_loss)
from torch.nn.attention import SDPBackend, sdpa_kernel
from train_throughput import synthetic_shards

from kiln.data.loader import ShardRows
from kiln.data.shards import shard_split
from kiln.eval.generate import generate
from kiln.eval.perplexity import val_rows_loss
from kiln.eval.suite import BATCH
from kiln.io import write_json
from kiln.model.build import build_model, load_model, save_model
from kiln.model.registry import resolve
from kiln.train.device import autocast, eval_autocast, to_device
from kiln.train.optim import build_adamw
from kiln.train.smoke import probe
from kiln.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
# Kiln's attention at gpt2-124m's and llama3.2-1b's head shapes (head dim 64; 32 query heads over 8
# key/value heads), then a dry run's: {family: (GPU shape, dry-run shape)}
ATTENTION = {"gpt2": ({"n_head": 12, "d_model": 768}, {"n_head": 2, "d_model": 128}),
             "llama": ({"n_head": 32, "n_kv_head": 8, "d_model": 2048}, {"n_head": 2, "n_kv_head": 1, "d_model": 128})}
LLM_C_GPT2_TOKENS_PER_S = 470_000  # llm.c GPT-2 124M on one H100 (~3.7M tok/s on 8, 140 ms per 0.5M-token step)


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
            model = build_model(resolve({"family": family, "n_layer": 1, **shapes[ctx.dry]}, 512, T)).eval()
        idx = torch.randint(0, 512, (B, T), device=dev)
        with torch.no_grad(), autocast(dev, bf16=True)():  # as train and a GPU eval run it
            ops, _ = profiled(lambda: model(idx))
        kernels = sorted(op.removeprefix("aten::_scaled_dot_product_") for op in ops
                         if op.startswith("aten::_scaled_dot_product_"))
        # unforced, SDPA may prefer cuDNN's fused attention on Hopper (as fast); efficient or math is a slow path
        ok &= any("flash" in op or "cudnn" in op for op in kernels)
        parts.append(f"{family}: {', '.join(kernels) or 'math (no fused kernel)'}")
    return [ctx.verdict(ok, "; ".join(parts))]


def check_fused_adamw(ctx: Ctx) -> list[tuple[str, str]]:
    """kiln.train.optim.build_adamw asks for fused=True on CUDA and CPU: did the fused kernel run?"""
    train = sections(ctx, "gpt2-124m", 128, 2)
    with torch.device(ctx.device):
        model = build_model(resolve(train["model"], 512 if ctx.dry else 50304, 128))
    optimizer = build_adamw(model, train["train"], ctx.device.type)
    idx = torch.randint(0, 512, (2, 128), device=ctx.device)
    model(idx, idx)[1].backward()
    ops, _ = profiled(optimizer.step)
    adam = sorted(op for op in ops if "adam" in op.lower())
    ok = optimizer.defaults.get("fused") is True and any("_fused_adamw" in op for op in adam)
    return [ctx.verdict(ok, f"fused={optimizer.defaults.get('fused')}; the step ran {', '.join(adam) or 'no Adam op'}")]


def _grad_norm(model: torch.nn.Module) -> float:
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]).item()


def check_compile_and_gpt2(ctx: Ctx) -> list[tuple[str, str]]:
    """gpt2-124m, seq 1024, micro-batch 16, as the train stage builds it (compile auto: on for CUDA).
    One batch through the eager and the compiled model (loss, gradient norm, compile time); then
    Kiln's Throughput over timed train steps of the compiled model."""
    seq, micro = (64, 4) if ctx.dry else (1024, 16)
    shards = synthetic_shards(ctx.folder("shards"), 512 if ctx.dry else 50257, seq, rows=4 * micro, seed=1337)
    trainer = Trainer(sections(ctx, "gpt2-124m", seq, micro), shards)
    if ctx.dry:  # inductor's C++ build takes ~20 s on 2 cores; dynamo and AOT autograd still trace Kiln's model
        trainer.model.compile(backend="aot_eager")
    batch = to_device(trainer.batches.next(), trainer.d.device)  # (B, T + 1), split as train_step splits it
    x, y = batch[:, :-1], batch[:, 1:]

    def loss_and_norm() -> tuple[float, float]:
        with trainer.autocast():
            _, loss = trainer.wrapped(x, y)
        loss.backward()
        norm = _grad_norm(trainer.model)
        trainer.optimizer.zero_grad(set_to_none=True)
        return loss.item(), norm

    with torch.compiler.set_stance("force_eager"):
        eager = loss_and_norm()
    start = time.perf_counter()
    compiled = loss_and_norm()  # compiles the forward, then the backward
    compile_s = time.perf_counter() - start
    close = abs(compiled[0] - eager[0]) <= 5e-3 * abs(eager[0]) and abs(compiled[1] - eager[1]) <= 5e-2 * eager[1]
    rows = [ctx.verdict(close, f"compile {compile_s:.1f} s; loss {compiled[0]:.4f} vs eager {eager[0]:.4f}, "
                               f"grad norm {compiled[1]:.3f} vs {eager[1]:.3f}")]
    rates, mem = timed_steps(trainer, warmup=1 if ctx.dry else 3, steps=2 if ctx.dry else 30)
    figure = (f"{rates['tokens_per_s']:,.0f} tok/s per device, MFU {pct(rates['mfu'])} "
              f"(torchtitan's count {pct(rates['mfu_torchtitan'])}), peak {mem / 1024:.1f} GiB")
    if ctx.dry:
        return rows + [ctx.verdict(True, figure)]
    return rows + [("measured", f"{figure}; {rates['tokens_per_s'] / LLM_C_GPT2_TOKENS_PER_S:.2f}x llm.c")]


def check_smoke_snapshot(ctx: Ctx) -> list[tuple[str, str]]:
    """The smoke stage's probe with smoke.profile_step: trace.json, and on CUDA memory_snapshot.pickle.
    Eager (compile is the compile check's), the default config's 4x256 GPT."""
    shards = synthetic_shards(ctx.folder("shards"), 512, 64, rows=64, seed=1337)
    trainer = Trainer(sections(ctx, None, 64, 8, compile_model=False), shards)
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
    return [ctx.verdict(ok, f"{figure}; memory_snapshot.pickle {snap.stat().st_size / 2**20:.1f} MiB, "
                            f"{len(data.get('segments', []))} segments, {traces:,} allocation events")]


def word_shards(out: Path, seq: int, rows: int) -> Path:
    """Shards of EOS-separated words from a fixed lexicon (within a word the next id is certain), so a
    few steps train a model worth evaluating; synthetic_shards' manifest layout."""
    rng = np.random.default_rng(0)
    words = [rng.integers(1, 500, size=int(rng.integers(3, 8))) for _ in range(40)]
    # ~6 tokens a word (EOS included): rows * seq / 2 words fill both splits' rows * (seq + 1) tokens
    stream = np.concatenate([np.append(words[i], 0) for i in rng.integers(0, len(words), size=rows * seq // 2)])
    splits = {s: shard_split(stream[i * rows * (seq + 1):(i + 1) * rows * (seq + 1)].astype(np.uint16), out, s,
                             seq + 1, rows, 512) for i, s in enumerate(("train", "val"))}
    write_json(out / "manifest.json", {"seq_len": seq, "row_len": seq + 1, "dtype": "uint16", "vocab_size": 500,
                                       "padded_vocab_size": 512, "splits": splits})
    return out


def check_eval(ctx: Ctx) -> list[tuple[str, str]]:
    """A 4x256 GPT trained 60 steps on learnable tokens, saved as the train stage saves it, then the
    eval stage's held-out loss (val_rows_loss, as HeldOut.overall calls it) on the GPU under bf16
    autocast against the CPU in fp32; and greedy KV-cached decoding on both."""
    seq = 64 if ctx.dry else 256
    shards = word_shards(ctx.folder("shards"), seq, rows=128)
    trainer = Trainer(sections(ctx, None, seq, 16, compile_model=False), shards)
    for _ in range(10 if ctx.dry else 60):
        trainer.train_step()
    model_dir = ctx.folder("train")
    save_model(trainer.cfg, trainer.model.state_dict(), model_dir)
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
    return [ctx.verdict(ok, f"val loss GPU bf16 {gpu_loss:.4f} vs CPU fp32 {cpu_loss:.4f} "
                            f"(diff {gpu_loss - cpu_loss:+.4f}); greedy decodes equal {same}/{len(prompts)}")]


def check_pipeline(ctx: Ctx) -> list[tuple[str, str]]:
    """tests/configs/tiny.yaml end to end through Snakemake with --config train={device: cuda}, which
    Snakemake merges into the file's train section key by key (the dry run checks that it did)."""
    run = ctx.work / "run"
    cmd = [str(Path(sys.executable).with_name("snakemake")), "--cores", "all", "-s", str(REPO / "Snakefile"),
           "--directory", str(run), "--configfile", str(REPO / "tests" / "configs" / "tiny.yaml"),
           "--config", "train={device: cuda}"] + (["-n", "-p"] if ctx.dry else [])
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    print(done.stdout, done.stderr, sep="\n")
    if ctx.dry:
        merged = '"device":"cuda"' in done.stdout and '"micro_batch":16' in done.stdout  # tiny.yaml's, kept
        return [ctx.verdict(done.returncode == 0 and merged, "snakemake -n: " + (
            "train.device cuda merged into tiny.yaml's train section" if merged else "the override did not merge"))]
    if done.returncode != 0:
        return [("FAIL", f"snakemake exit {done.returncode} after {wall:.0f} s (see the log)")]
    results = run / "results" / "tiny"
    smoke = json.loads((results / "smoke" / "report.json").read_text())
    metrics = json.loads((results / "eval" / "metrics.json").read_text())
    eval_on_cuda = "eval on cuda" in (results / "logs" / "eval.log").read_text()
    ok = (results / "report.md").exists() and str(smoke.get("device", "")).startswith("cuda") and eval_on_cuda
    return [ctx.verdict(ok, f"{wall:.0f} s; smoke on {smoke.get('device')}, eval on "
                            f"{'cuda' if eval_on_cuda else 'NOT cuda'}, val loss {metrics['val_loss']:.3f}")]


def _bench(script: str, argv: list[str]) -> str:
    """A bench script run in this process (no second interpreter start), its stdout returned."""
    out, argv_before = io.StringIO(), sys.argv
    sys.argv = [script, *argv]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(REPO / "bench" / script), run_name="__main__")
    finally:
        sys.argv = argv_before
    print(out.getvalue())
    return out.getvalue()


def check_train_bench(ctx: Ctx) -> list[tuple[str, str]]:
    shape = (["--vocab", "512", "--seq-len", "64", "--micro-batch", "4"] if ctx.dry else
             ["--flavour", "gpt2-124m", "--vocab", "50257", "--seq-len", "1024", "--micro-batch", "16"])
    rounds = ["--steps", "1", "--rounds", "1", "--warmup", "1"] if ctx.dry else ["--steps", "10", "--rounds", "2",
                                                                                  "--warmup", "3"]
    text = _bench("train_throughput.py", shape + rounds)
    rates = [line.split("|")[2].strip() for line in text.splitlines()
             if line.startswith("| ") and "tokens/s" not in line]  # the loops' rows: baseline, then ours
    ratio = float(text.split("ours / baseline: ")[1].split("x")[0])
    return [ctx.verdict(ctx.dry or ratio >= 1.0, f"nanoGPT {rates[0]} vs Kiln {rates[1]} tok/s: {ratio:.2f}x")]


def check_generate_bench(ctx: Ctx) -> list[tuple[str, str]]:
    argv = ["--rounds", "1"] + (["--prompts", "4", "--prompt-len", "16", "--new-tokens", "4", "--seq-len", "32"]
                                if ctx.dry else [])
    text = _bench("generate.py", argv)
    ratio = float(text.split("cached batched / uncached one by one: ")[1].split("x")[0])
    same = [line.split("|")[4].strip() for line in text.splitlines() if line.startswith("| cached")]
    return [ctx.verdict(ctx.dry or ratio >= 5.0, f"cached+batched {ratio:.1f}x the uncached loop; "
                                                 f"same tokens {' / '.join(same)}")]


@dataclass(frozen=True)
class Check:
    slug: str
    rows: tuple[str, ...]  # the table rows it fills
    expected: tuple[str, ...]
    budget_s: float  # on the GPU; the budgets sum to under 8 minutes
    run: Callable[[Ctx], list[tuple[str, str]]]


CHECKS = (
    Check("flash", ("flash SDPA",), ("flash kernel forced at D 64/128 (max err vs math <= 2e-2); flash or cuDNN "
                                     "picked in Kiln's gpt2 and llama (GQA) attention",), 15, check_flash),
    Check("adamw", ("fused AdamW",), ("fused=True and aten::_fused_adamw_ in the step",), 15, check_fused_adamw),
    Check("gpt2", ("torch.compile gpt2-124m", "MFU gpt2-124m seq 1024"),
          ("compiles; loss within 0.5%, grad norm within 5% of eager (bf16)",
           f"~{LLM_C_GPT2_TOKENS_PER_S // 1000}k tok/s/GPU (llm.c, one H100)"), 90, check_compile_and_gpt2),
    Check("train-bench", ("bench/train_throughput.py gpt2-124m",), ("Kiln >= 1.0x the nanoGPT eager loop",), 55,
          check_train_bench),
    Check("loss", ("chunked loss memory, flagship logits",),
          (f"chunked peak <= {LOSS_PEAK_RATIO:g}x the plain loss's; loss within 1e-3, gradients 2e-2 (bf16)",), 15,
          check_loss),
    Check("llama", ("MFU llama3.2-1b seq 8192", "MFU llama3.2-1b, torchtitan's count",
                    "memory estimate llama3.2-1b seq 8192"),
          (f"MFU >= {MFU_TARGET:.0%} (Kiln's FLOP count)", f"MFU >= {MFU_TARGET_TORCHTITAN:.1%} (the same target)",
           f"kiln.train.memory within {ESTIMATE_TOLERANCE:.0%} of max_memory_allocated, eager and compiled"), 120,
          check_llama_mfu),
    Check("snapshot", ("smoke memory snapshot",), ("memory_snapshot.pickle with segments and events; trace.json",), 25,
          check_smoke_snapshot),
    Check("eval", ("eval on GPU vs CPU",), ("val loss within 1% (bf16 vs fp32)",), 25, check_eval),
    Check("pipeline", ("tiny pipeline, train.device=cuda",), ("report.md; smoke and eval on cuda",), 95,
          check_pipeline),
    Check("generate-bench", ("bench/generate.py",), (">= 5x the uncached loop",), 15, check_generate_bench),
)


# --- running them --------------------------------------------------------------------------------

def environment() -> dict:
    """Whether CUDA sees a GPU, and the machine in words (asked in a child: this process never
    touches CUDA, so that it can fork children that do)."""
    versions = f"torch {torch.__version__}"
    if not torch.cuda.is_available():
        return {"cuda": False, "about": f"CPU, {versions}"}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "about": f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {versions}, "
                                   f"CUDA {torch.version.cuda}"}


def _child(check: Check | None, ctx: Ctx, result: Path, log: Path) -> None:
    """In the forked process: own process group (so a timeout kills what it started too), output
    to its log, its rows (or the environment) as JSON in `result`."""
    os.setsid()
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    sys.stderr = sys.stdout
    try:
        ctx.work.mkdir(parents=True, exist_ok=True)
        result.write_text(json.dumps(check.run(ctx) if check else environment()))
    except BaseException as exc:  # noqa: BLE001 -- reported as the check's FAIL
        traceback.print_exc()
        first_line = (str(exc).splitlines() or [""])[0][:160]
        result.write_text(json.dumps({"error": f"{type(exc).__name__}: {first_line}"}))


def isolated(check: Check | None, ctx: Ctx, out: Path, budget_s: float) -> tuple[object, str | None]:
    """(what the child wrote, None) or (None, why it failed)."""
    slug = check.slug if check else "environment"
    result, log = out / f"{slug}.json", out / f"{slug}.log"
    result.unlink(missing_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(check, ctx, result, log))
    proc.start()
    try:
        proc.join(budget_s)
    finally:
        over = proc.is_alive()
        if over:  # over budget, or this process interrupted: end the check and everything it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.join()
    if over:
        return None, f"over its {budget_s:.3g} s budget (log: {log})"
    if not result.exists():
        return None, f"crashed, exit code {proc.exitcode} (log: {log})"
    data = json.loads(result.read_text())
    if isinstance(data, dict) and "error" in data:
        return None, f"{data['error']} (log: {log})"
    return data, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="hide CUDA; run the CPU-capable parts at tiny shapes")
    parser.add_argument("--only", help=f"comma-separated checks: {', '.join(c.slug for c in CHECKS)}")
    parser.add_argument("--out", type=Path, help="logs and scratch files (default: a new temporary folder)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every check's time budget")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else {c.slug for c in CHECKS}
    if only - {c.slug for c in CHECKS}:
        parser.error(f"--only: unknown checks {', '.join(sorted(only - {c.slug for c in CHECKS}))}")
    chosen = [c for c in CHECKS if c.slug in only]
    if args.cpu_dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before any child touches CUDA (this process never does)
    out = args.out or Path(tempfile.mkdtemp(prefix="kiln-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    env, why = isolated(None, Ctx(args.cpu_dry_run, out), out, 30)
    if env is None:
        sys.exit(f"gpu_check: could not read the environment: {why}")
    table = []
    for check in chosen:
        start = time.perf_counter()
        if env["cuda"] or args.cpu_dry_run:
            ctx = Ctx(args.cpu_dry_run, out / check.slug)
            rows, why = isolated(check, ctx, out, check.budget_s * args.budget_scale)
            rows = rows or [("FAIL", why)] * len(check.rows)
        else:
            rows = [(NO_CUDA, "")] * len(check.rows)
        table += [(name, result, figure, expected)
                  for name, (result, figure), expected in zip(check.rows, rows, check.expected)]
        print(f"gpu_check: {check.slug}: {', '.join(r for r, _ in rows)} ({time.perf_counter() - start:.0f} s)",
              file=sys.stderr)
    print(f"{env['about']}{' (--cpu-dry-run: CUDA hidden)' if args.cpu_dry_run else ''}; logs in {out}\n")
    print("| check | result | figure | expected |\n|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    sys.exit(1 if any(result == "FAIL" for _, result, _, _ in table) else 0)


if __name__ == "__main__":
    main()
