"""Bits per byte at equal wall time: Kiln's default train stage against a plain nanoGPT loop, on the
same machine, tokenizer, training documents and held-out documents, in one run.

    python bench/quality.py                               # the embedded default, both arms
    python bench/quality.py --config 'train={budget: {minutes: 3}}'   # any --config override
    python bench/quality.py --skip-plain --config 'model={n_layer: 6}'   # one recipe, Kiln's arm only
    python bench/quality.py --skip-plain --cores 1 --run-name a --config 'train={budget: null, max_steps: 1325}'
        # one thread, so that two recipes at equal steps train side by side (each from its own clone)
    python bench/quality.py --plain-shapes 4x64x2 4x128x4 --plain-lrs 2e-3 4e-3 8e-3   # tune the baseline
    python bench/quality.py --quick     # a tiny run without Snakemake (quick_run): what tests/bench/test_bench.py runs
    python bench/quality.py --stall 318:40     # Kiln's arm quiet and again stalled 40 s at step 318, one plain loop
    python bench/quality.py --stall 15%:40     # ... the stall at 15% of the steps the quiet arm trained
    python bench/quality.py --skip-plain --direct --threads 1 --run-name quality-qk \
        --config "train={budget: null, max_steps: 500}" "model={family: llama, n_layer: 4, n_head: 2, d_model: 64, qk_norm: true}"
        # a recipe arm in this process on the default's shards (direct_run), one thread: the arms' screen

Ours: `snakemake --until train` on the config (run name quality-bench, so results/<default run> is left
alone): download, tokenizer, pretokenize, shard, the smoke gate (which turns a budget into steps and
picks the precision) and the train stage, then the model read back through its Hugging Face export
(transformers' AutoModelForCausalLM). Its wall time is the train stage's (benchmarks/train.tsv:
process start, validation, checkpoints and export included).

The baseline gets exactly that wall time: nanoGPT's loop, a 4-layer, d_model 128, 4-head GPT-2
model (NanoGPT below, no biases; nanoGPT's recipe in the issue was d_model 256 at 1e-3, which the
search below beat) at seq 256, batch 8, AdamW 2e-3 (betas 0.9/0.95, weight decay 0.1 on matrices),
linear warmup over the first 2% of its time then cosine to a tenth of the peak by the end, gradient clip 1, bf16 autocast (--plain-precision), eager, random
windows of the training documents tokenized whole (no FIM). --plain-shapes and --plain-lrs search
the baseline's shape and peak learning rate (min_lr a tenth of it), every trial given the same wall
time; the best on the held-out split is the plain arm, so the ratio is Kiln against the best plain
loop found, not an arbitrary one. PLAIN holds the recorded winner (docs/benchmarks.md).

Both are scored by one function: every document's tokens followed by EOS, back to back, cut into
windows of seq_len + 1 that overlap by one token, so every token after the first is predicted once;
bits per byte = total nats / ln 2 / the documents' UTF-8 bytes. The documents: the run's held-out
split (tokens/val_ids.txt, the same files Kiln's eval reports on) and pip's own source
(pip/_internal, which no run trains on).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np
import pyarrow.parquet as pq
import torch
import yaml

from kiln import config as kiln_config
from kiln.config import settings
from kiln.config.run_config import RunConfig
from kiln.data.encoders import Encoder
from kiln.data.tokenizer import EOS, load_tokenizer, special_ids
from kiln.eval.perplexity import bits_per_byte
from kiln.layout import Layout
from kiln.train import device

ROOT = Path(__file__).resolve().parent.parent
# The tuned anchor: the best of a search over shape and learning rate at the default's 7 minutes
# (docs/benchmarks.md, 2026-12-02: 4x128x4 at 2e-3 ahead of 1e-3, 4e-3, 8e-3 and of 4x64x2 at each).
PLAIN = dict(n_layer=4, n_head=4, d_model=128, seq_len=256, batch=8, lr=2e-3, min_lr=2e-4, warmup=0.02)
# --quick: tests/configs/tiny.yaml on two stdlib packages, 8 steps of a 1-layer model; a 1-layer
# plain loop for 0.5 s; pip scored on its first QUICK_PIP_FILES files
QUICK_CONFIG = {
    "download": {"sources": [{"name": "stdlib", "kind": "stdlib", "include": ["json/*.py", "http/*.py"]}]},
    "tokenizer": {"vocab_size": 512, "heldout_docs": 2},
    "pretokenize": {"val_tokens": 2000},
    "shard": {"seq_len": 32, "rows_per_shard": 2000},
    "model": {"n_layer": 1, "n_head": 2, "d_model": 32},
    "train": {"micro_batch": 4, "batch_tokens": 128, "max_steps": 8, "warmup_steps": 1, "eval_every": 8},
}
QUICK_PLAIN = dict(n_layer=1, n_head=2, d_model=32, seq_len=32, batch=2)
QUICK_PIP_FILES = 2


def layout_of(args) -> Layout:
    """Where the bench's run lands (kiln.layout): its own run folder, the default's data folders."""
    overrides = dict(text.split("=", 1) for text in args.config) | {"run_name": args.run_name}
    return Layout(kiln_config.resolve([args.configfile], overrides), root=args.results)


def quick_run(args) -> Layout:
    """--quick: Kiln's arm without Snakemake, whose DAG takes over a minute on 2 cores even for the
    tiny run (a process and its imports per job, torchrun for smoke and train): the stages' own
    functions in this process, on QUICK_CONFIG, each output where kiln.layout puts it under a scratch
    results folder; the train stage's benchmark file holds its measured wall time. What follows
    (the scores through the Hugging Face export, the plain loop, the table) runs as after a real run."""
    from kiln import hf
    from kiln.data.pretokenize import pretokenize
    from kiln.data.raw import write_raw
    from kiln.data.shards import write_shards
    from kiln.data.tokenizer_build import build_tokenizer
    from kiln.io import write_json
    from kiln.model.build import load_model
    from kiln.train.callbacks import default_callbacks
    from kiln.train.trainer import run

    tiny = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    cfg = kiln_config.validate(tiny | QUICK_CONFIG | {"run_name": args.run_name})
    typed = kiln_config.RunConfig.of(cfg)
    paths = Layout(cfg, root=args.results)
    paths.write()
    write_raw(typed.download, paths.folder("download"))
    tokenizer = Path(paths.output("tokenizer", "tokenizer.json"))
    tokenizer.parent.mkdir(parents=True)
    build_tokenizer(paths.folder("download"), typed.tokenizer, typed.seed)[0].save(str(tokenizer))
    tokens, shards, train = paths.folder("pretokenize"), paths.folder("shard"), paths.folder("train")
    tokens.mkdir()
    pretokenize(paths.folder("download"), tokenizer, tokens, typed.seed, typed.pretokenize, 1)
    shards.mkdir()
    write_shards(tokens, shards, typed.shard.seq_len, typed.shard.rows_per_shard)
    start = time.perf_counter()
    result = run(RunConfig.of(settings.stage_config(cfg, "train")), shards, train, callbacks=default_callbacks())
    hf.export(load_model(train), train / "hf", tokenizer)
    write_json(train / "summary.json", dataclasses.asdict(result))
    benchmark = Path(paths.benchmark("train"))
    benchmark.parent.mkdir(parents=True)
    benchmark.write_text(f"s\tcpu_time\n{time.perf_counter() - start:.2f}\t0\n")
    return paths


def direct_run(args) -> Layout:
    """--direct: Kiln's arm in this process, without Snakemake: the train stage's function
    (kiln.train.trainer.run) for train.max_steps on the shards an earlier run of the same data settings
    built (results/data/...), precision auto as bf16 (what the smoke stage picks on this CPU). Its model
    is scored as it is (kiln.model.build.load_model), not through the Hugging Face export (the options
    the export could not represent were screened this way: docs/benchmarks.md, "Recipe arms"). With
    --threads 1 two arms train side by side at equal steps, each at one core's speed whatever the other
    does (docs/benchmarks.md, "OpenMP's spin-wait beside a neighbour")."""
    from kiln.io import write_json
    from kiln.train.callbacks import default_callbacks
    from kiln.train.trainer import run

    overrides = dict(text.split("=", 1) for text in args.config) | {"run_name": args.run_name}
    cfg = kiln_config.resolve([args.configfile], overrides)
    paths = Layout(cfg, root=args.results)
    shards = paths.folder("shard")
    if not (shards / "manifest.json").is_file():
        raise SystemExit(f"--direct: no shards at {shards}; build them first (snakemake --until shard)")
    typed = RunConfig.of(settings.stage_config(cfg, "train"))
    if typed.train.budget is not None or typed.train.max_steps is None:
        raise SystemExit(
            "--direct trains train.max_steps, with no budget: --config 'train={budget: null, max_steps: N}'"
        )
    train = paths.folder("train")
    shutil.rmtree(train, ignore_errors=True)
    train.mkdir(parents=True)
    start = time.perf_counter()
    result = run(typed, shards, train, callbacks=default_callbacks())
    seconds = time.perf_counter() - start
    write_json(train / "summary.json", dataclasses.asdict(result))
    benchmark = Path(paths.benchmark("train"))
    benchmark.parent.mkdir(parents=True, exist_ok=True)
    benchmark.write_text(f"s\tcpu_time\n{seconds:.2f}\t0\n")
    return paths


def kiln_arm(args, stall: str | None = None) -> Layout:
    """Kiln's arm as --quick, --direct or Snakemake runs it (or, --skip-kiln, as an earlier run left it).
    With `stall` (STEP:SECONDS), the same run under KILN_FAULT=stall@STEP:SECONDS as run <run-name>-stall
    (a --quick one under its own results folder): the quiet and the stalled run side by side."""
    if stall is None:
        if args.quick or args.direct:
            return quick_run(args) if args.quick else direct_run(args)
        return layout_of(args) if args.skip_kiln else run_kiln(args)
    stalled = argparse.Namespace(**vars(args) | {"run_name": f"{args.run_name}-stall"})
    if args.quick:
        stalled.results = args.results / "stall"
    before = os.environ.get("KILN_FAULT")
    os.environ["KILN_FAULT"] = f"stall@{stall}"  # read by the train stage's Trainer.fit, in or out of this process
    try:
        return kiln_arm(stalled)
    finally:
        os.environ.pop("KILN_FAULT") if before is None else os.environ.update(KILN_FAULT=before)


def stall_at(stall: str, quiet: Layout) -> str:
    """--stall's STEP:SECONDS as KILN_FAULT takes it: a STEP written as a share ("15%") is that share
    of the steps the quiet arm trained (its train/summary.json), so the stall falls at the same point
    of the run whatever this machine's speed made of the budget."""
    step, sep, seconds = stall.partition(":")
    if not step.endswith("%"):
        return stall
    try:
        share = float(step[:-1]) / 100
    except ValueError:
        raise SystemExit(f"--stall: {step!r} is not a step or a share of the steps, e.g. 318 or 15%") from None
    steps = json.loads((quiet.folder("train") / "summary.json").read_text())["steps"]
    return f"{max(1, round(share * steps))}{sep}{seconds}"


def kiln_row(paths: Layout, sets: dict, direct: bool) -> dict:
    """An arm's train stage (its wall time, tokens) and its bits per byte on each set: through its
    Hugging Face export, or (direct) its own model."""
    train_dir = paths.folder("train")
    if direct:
        from kiln.model.build import load_model

        ours = load_model(train_dir)
        logits_of = lambda x: ours(x)[0]  # noqa: E731
    else:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(train_dir / "hf").eval()
        logits_of = lambda x: hf(x).logits  # noqa: E731
    summary = json.loads((train_dir / "summary.json").read_text())
    seq_len = json.loads((train_dir / "model_config.json").read_text())["seq_len"]
    return {
        "wall_s": stage_seconds(paths, "train"),
        "tokens": summary["tokens_seen"],
        "tokens_per_s": summary["tokens_per_s"],
        **{name: stream_bits_per_byte(logits_of, ids, nb, seq_len) for name, (ids, nb) in sets.items()},
    }


def run_kiln(args) -> Layout:
    """The train stage through Snakemake, afresh: the smoke stage forced to run again (so the budget is
    planned on this machine now), and with it train, which sets the previous bench run's checkpoints
    aside rather than resume them (a finished run's train job trains again)."""
    cmd = [
        "snakemake",
        "--cores",
        args.cores,
        "--until",
        "train",
        "--forcerun",
        "smoke",
        "--configfile",
        str(args.configfile),
        "--config",
        f"run_name={args.run_name}",
        *args.config,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return layout_of(args)


def stage_seconds(paths: Layout, stage: str) -> float:
    with open(paths.benchmark(stage), newline="") as f:
        return float(next(csv.DictReader(f, delimiter="\t"))["s"])


def split_texts(paths: Layout) -> tuple[list[str], list[str]]:
    """(train texts, held-out texts) of the run's raw documents, split as its pretokenize stage did."""
    held_ids = set((paths.folder("pretokenize") / "val_ids.txt").read_text(encoding="utf-8").split("\n")) - {""}
    train, held = [], []
    for part in sorted(paths.folder("download").glob("*/part-*.parquet")):
        table = pq.read_table(part, columns=["id", "text"]).to_pydict()
        for doc_id, text in zip(table["id"], table["text"]):
            (held if doc_id in held_ids else train).append(text)
    return train, held


def pip_texts(limit: int | None = None) -> list[str]:
    import pip

    files = sorted(Path(pip.__file__).parent.joinpath("_internal").rglob("*.py"))[:limit]
    return [f.read_text(encoding="utf-8") for f in files]


def token_stream(encoder: Encoder, texts: list[str]) -> tuple[np.ndarray, int]:
    """(every text's ids then EOS, back to back; the texts' UTF-8 bytes)."""
    eos = special_ids(encoder.tokenizer)[EOS]
    ids = []
    for doc in encoder.encode(texts):
        ids += [doc, np.array([eos], dtype=doc.dtype)]
    return np.concatenate(ids).astype(np.int64), sum(len(t.encode("utf-8")) for t in texts)


@torch.no_grad()
def stream_bits_per_byte(logits_of, ids: np.ndarray, n_bytes: int, seq_len: int, batch: int = 16) -> float:
    """Next-token loss over the stream, in windows of seq_len + 1 overlapping by one (every token
    after the first predicted once), in bits per byte of the texts (kiln.eval.perplexity's formula)."""
    starts = list(range(0, len(ids) - 1, seq_len))
    total = 0.0
    for i in range(0, len(starts), batch):
        rows = [torch.from_numpy(ids[s : s + seq_len + 1]) for s in starts[i : i + batch]]
        same = [r for r in rows if len(r) == seq_len + 1]
        for group in ([torch.stack(same)] if same else []) + [r[None] for r in rows if len(r) != seq_len + 1]:
            logits = logits_of(group[:, :-1]).float()
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), group[:, 1:].flatten(), reduction="sum"
            ).item()
    return bits_per_byte(total / (len(ids) - 1), len(ids) - 1, n_bytes)


class NanoGPT(torch.nn.Module):
    """nanoGPT's model.py as the plain loop runs it: pre-norm GPT-2 blocks (LayerNorm without
    biases, exact GELU as nn.GELU, causal SDPA), learned positions, tied head, GPT-2's init (0.02,
    residual projections over sqrt(2L)). Kiln's own GPT uses GPT-2's tanh GELU for checkpoint
    parity, which is ~3x slower on a CPU: the baseline gets nanoGPT's."""

    def __init__(self, vocab: int, seq_len: int, n_layer: int, n_head: int, d: int):
        super().__init__()
        nn = torch.nn
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(d, bias=False),
                    "qkv": nn.Linear(d, 3 * d, bias=False),
                    "proj": nn.Linear(d, d, bias=False),
                    "ln_2": nn.LayerNorm(d, bias=False),
                    "up": nn.Linear(d, 4 * d, bias=False),
                    "down": nn.Linear(4 * d, d, bias=False),
                }
            )
            for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, w in self.named_parameters():
            if w.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(w, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))  # (B, T, C)
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln_1"](x)).view(B, T, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
            x = x + blk["proj"](y.transpose(1, 2).reshape(B, T, -1))
            x = x + blk["down"](torch.nn.functional.gelu(blk["up"](blk["ln_2"](x))))
        return self.head(self.ln_f(x))  # (B, T, V)


def train_plain(
    train_ids: np.ndarray, vocab: int, seconds: float, bf16: bool, seed: int, p: dict
) -> tuple[torch.nn.Module, dict]:
    """nanoGPT's loop with the settings p (PLAIN's keys) for `seconds` of wall time (schedule by elapsed
    time: the loop knows its time, not its step count). Returns the model in eval mode and {steps,
    tokens, tokens_per_s}."""
    torch.manual_seed(seed)
    model = NanoGPT(vocab, p["seq_len"], p["n_layer"], p["n_head"], p["d_model"]).train()
    decay = [w for w in model.parameters() if w.dim() >= 2]
    other = [w for w in model.parameters() if w.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=p["lr"], betas=(0.9, 0.95)
    )
    ctx = device.autocast(torch.device("cpu"), bf16)
    data = torch.from_numpy(train_ids)
    gen = torch.Generator().manual_seed(seed)
    T, B = p["seq_len"], p["batch"]
    start, steps = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < seconds:
        frac = elapsed / seconds
        lr = (
            p["lr"] * min(1.0, frac / p["warmup"])
            if frac < p["warmup"]
            else p["min_lr"]
            + 0.5 * (1 + math.cos(math.pi * (frac - p["warmup"]) / (1 - p["warmup"]))) * (p["lr"] - p["min_lr"])
        )
        for group in opt.param_groups:
            group["lr"] = lr
        ix = torch.randint(len(data) - T - 1, (B,), generator=gen)
        x = torch.stack([data[i : i + T] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        with ctx():
            loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 100 == 0:
            print(f"plain loop: step {steps}, loss {loss.item():.3f}, {elapsed:.0f}/{seconds:.0f} s", flush=True)
    wall = time.perf_counter() - start
    return model.eval(), {"steps": steps, "tokens": steps * B * T, "tokens_per_s": steps * B * T / wall}


def shape_text(p: dict) -> str:
    return f"{p['n_layer']}x{p['d_model']}x{p['n_head']}"


def plain_grid(shapes: list[str], lrs: list[float]) -> list[dict]:
    """PLAIN with each shape (LAYERSxD_MODELxHEADS) and peak learning rate; min_lr a tenth of it."""
    grid = []
    for shape in shapes:
        try:
            n_layer, d_model, n_head = (int(v) for v in shape.split("x"))
        except ValueError:
            raise SystemExit(f"--plain-shapes: {shape!r} is not LAYERSxD_MODELxHEADS, e.g. 4x128x4") from None
        for lr in lrs:
            grid.append(PLAIN | dict(n_layer=n_layer, d_model=d_model, n_head=n_head, lr=lr, min_lr=lr / 10))
    return grid


def plain_params(p: dict, vocab: int) -> int:
    """NanoGPT's parameter count: tied embedding, positions, 12 d^2 per block, the norms' gains."""
    d = p["d_model"]
    return vocab * d + p["seq_len"] * d + p["n_layer"] * (12 * d * d + 2 * d) + d


def _scores_text(scores: dict) -> str:
    return ", ".join(f"{name} {bpb:.4f} bits/byte" for name, bpb in scores.items())


def main() -> None:
    parser = common.parser(__doc__, quick="a tiny run and plain loop (quick_run): tests/bench/test_bench.py")
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--config", nargs="*", default=[], help="Snakemake --config overrides for Kiln's arm")
    parser.add_argument("--run-name", default="quality-bench")
    parser.add_argument("--cores", default="all", help="Snakemake's --cores for Kiln's arm (1: two arms side by side)")
    parser.add_argument("--skip-kiln", action="store_true", help="score the existing results/<run-name> train output")
    parser.add_argument("--skip-plain", action="store_true", help="Kiln's arm only")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="Kiln's arm in this process on existing shards, scored as it is (direct_run)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch's CPU threads in this process (0: torch's default)"
    )
    parser.add_argument(
        "--stall",
        metavar="STEP:SECONDS",
        help="a second Kiln arm, the same run under KILN_FAULT=stall@STEP:SECONDS (kiln.train.faults), beside the "
        "first; STEP may be a share of the first arm's steps, e.g. 15%%",
    )
    parser.add_argument("--plain-seconds", type=float, help="the baseline's wall time (default: Kiln's train stage's)")
    parser.add_argument("--plain-precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument(
        "--plain-shapes",
        nargs="+",
        default=[shape_text(PLAIN)],
        help="plain-loop shapes to search, LAYERSxD_MODELxHEADS (default: PLAIN's, the tuned anchor)",
    )
    parser.add_argument(
        "--plain-lrs", nargs="+", type=float, default=[PLAIN["lr"]], help="plain-loop peak learning rates to search"
    )
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    args.results = ROOT / "results"
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.quick:
        args.results, args.plain_seconds = Path(tempfile.mkdtemp(prefix="kiln-quality-")), 0.5
        PLAIN.update(QUICK_PLAIN)
        args.plain_shapes, args.plain_lrs = [shape_text(PLAIN)], [1e-3, 2e-3]  # the search path, two trials
        args.stall = args.stall or "50%:0.1"  # the stall arm's path too: at step 4 of 8
    arms = {"kiln": kiln_arm(args)}
    if args.stall:
        stall = stall_at(args.stall, arms["kiln"])
        arms[f"kiln, stall@{stall}"] = kiln_arm(args, stall=stall)
    paths = arms["kiln"]
    kiln_seconds = stage_seconds(paths, "train")
    tokenizer = load_tokenizer(paths.output("tokenizer", "tokenizer.json"))
    encoder = Encoder(tokenizer, "tiktoken")
    train_texts, held_texts = split_texts(paths)
    pip = pip_texts(QUICK_PIP_FILES if args.quick else None)
    sets = {"held-out stdlib": token_stream(encoder, held_texts), "pip/_internal": token_stream(encoder, pip)}

    rows = {arm: kiln_row(arm_paths, sets, args.direct) for arm, arm_paths in arms.items()}
    trials = []
    if not args.skip_plain:
        seconds = args.plain_seconds or kiln_seconds
        train_ids, _ = token_stream(encoder, train_texts)
        vocab = json.loads((paths.folder("shard") / "manifest.json").read_text())["padded_vocab_size"]
        for settings in plain_grid(args.plain_shapes, args.plain_lrs):
            model, info = train_plain(train_ids, vocab, seconds, args.plain_precision == "bf16", args.seed, settings)
            scores = {
                name: stream_bits_per_byte(model, ids, nb, settings["seq_len"]) for name, (ids, nb) in sets.items()
            }
            trials.append({"settings": settings, "wall_s": seconds, **info, **scores})
            print(f"plain loop {shape_text(settings)}, lr {settings['lr']:g}: " + _scores_text(scores), flush=True)
        best = min(trials, key=lambda t: t[next(iter(sets))])  # chosen on the held-out split
        rows["plain"] = {k: best[k] for k in ("wall_s", "tokens", "tokens_per_s", *sets)}
    if len(trials) > 1:
        print(f"\nplain-loop search at {seconds:.0f} s each (the best, by held-out, is the plain arm below):")
        print(
            "| shape (layers x d_model x heads) | parameters | lr | steps | "
            + " | ".join(f"bpb {s}" for s in sets)
            + " |"
        )
        print("|---|---:|---:|---:|" + "---:|" * len(sets))
        for t in trials:
            print(
                f"| {shape_text(t['settings'])} | {plain_params(t['settings'], vocab):,} | {t['settings']['lr']:g} | "
                f"{t['steps']:,} | " + " | ".join(f"{t[s]:.4f}" for s in sets) + " |"
            )
    print("\n| arm | wall s | tokens | tokens/s | " + " | ".join(f"bpb {s}" for s in sets) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(sets))
    for arm, r in rows.items():
        print(
            f"| {arm} | {r['wall_s']:.0f} | {r['tokens'] or 0:,} | {r['tokens_per_s'] or 0:,.0f} | "
            + " | ".join(f"{r[s]:.4f}" for s in sets)
            + " |"
        )
    for arm in arms if "plain" in rows else ():
        print(f"ratio {arm}/plain: " + ", ".join(f"{s} {rows[arm][s] / rows['plain'][s]:.3f}x" for s in sets))
    if args.out:
        args.out.write_text(json.dumps({"arms": rows, "plain_trials": trials}, indent=2))
    if args.quick:
        shutil.rmtree(args.results, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
