"""Tokens/s of Kiln's train step against nanoGPT's loop, eager and compiled whole, on the same model,
batch, precision and machine, in one run.

    python bench/train_throughput.py                                    # CPU: the default config's model
    python bench/train_throughput.py --compile false                    # ... Kiln's step eager (the config compiles)
    python bench/train_throughput.py --quick     # a 1-layer model, 1 step a round: what tests/bench/test_bench.py runs
    python bench/train_throughput.py --arm 'model={qk_norm: true}' --rounds 15   # a recipe arm against the default
    python bench/train_throughput.py --sdpa --rounds 11   # SDPA's CPU kernel against the written-out attention
    python bench/train_throughput.py --arm 'tokenizer={vocab_size: 4096}' 'shard={seq_len: 512}' 'train={micro_batch: 8}'
    # one H100/H200 (compile on by default on CUDA):
    python bench/train_throughput.py --flavour llama3.2-1b --vocab 32768 --seq-len 8192 --micro-batch 6 --steps 10 --rounds 3 --warmup 5
    python bench/train_throughput.py --flavour gpt2-124m --vocab 50257 --seq-len 1024 --micro-batch 16 --steps 20 --rounds 3 --warmup 5

Ours is kiln.train.trainer.Trainer.train_step, as the train stage runs it (data from memory-mapped
shards, bf16 autocast, compile per train.compile, the loss whole or in chunks as the memory plan
allows, the default config's train.optimizer (Muon on the blocks' matrices, fused AdamW on the rest),
pinned copies on CUDA, gradient clipping). The baselines are nanoGPT's
train.py loop on a fresh model of the same class, shape and seed: random windows of a token memmap,
autocast, the model's logits and nanoGPT's plain F.cross_entropy over them, loss.backward,
clip_grad_norm_, AdamW (fused on CUDA, as nanoGPT does); once eager, once compiled whole
(`torch.compile(model)`, nanoGPT's --compile, the loss inside the graph). The loops run the same
number of steps in alternating rounds (so a noisy neighbour hits them alike; on CUDA, where two large
models may not fit together, one loop after the other); the figure is the median round. The data is
random tokens in a temporary shard folder. --baselines eager skips the compiled loop (its ~30 s of
compilation on a CPU).

--arm KEY=YAML... times a second Kiln train step instead of the baselines: the same sections with these
overrides merged in (a model option, a train setting; `tokenizer={vocab_size: N}` and `shard={seq_len: T}`
train on synthetic shards of their own), in alternating rounds with the first, and prints
its tokens/s over the first's: what a recipe arm's steps are scaled by to train for the default's time
(docs/benchmarks.md, "Recipe arms at equal wall time"). --sdpa makes the arm attend through SDPA's
kernel where a CPU's compiled step writes attention out for inductor (kiln.model.sdpa.blockwise_causal):
whether that pays on this CPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np
import torch
import torch.nn.functional as F
import yaml

from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.data.shards import open_shard, shard_split
from kiln.io import write_json
from kiln.model.build import build_model
from kiln.train import device
from kiln.train.metrics import flops_per_token, memory_mb, peak_flops
from kiln.train.trainer import Trainer

EMBEDDED = yaml.safe_load(kiln_config.EMBEDDED_DEFAULT.read_text(encoding="utf-8"))  # config/config.yaml
DEFAULT_MODEL = EMBEDDED["model"]
EAGER, COMPILED, OURS = "nanoGPT eager loop", "nanoGPT loop compiled whole", "kiln Trainer.train_step"
ARM = "kiln Trainer.train_step, --arm"
# --quick: a 1-layer model on tiny batches, one step a round (train_sections reads `model`)
QUICK = dict(model={"n_layer": 1, "n_head": 2, "d_model": 32}, vocab=512, seq_len=32, micro_batch=2)
QUICK |= dict(compile="false", steps=1, rounds=1, warmup=1, baselines=["eager"])


def synthetic_shards(out: Path, vocab: int, seq_len: int, rows: int, seed: int) -> Path:
    padded = -(-vocab // 64) * 64
    tokens = np.random.default_rng(seed).integers(0, vocab, size=rows * (seq_len + 1), dtype=np.int64)
    dtype = np.uint16 if padded <= 65536 else np.uint32
    splits = {s: shard_split(tokens.astype(dtype), out, s, seq_len + 1, rows, padded) for s in ("train", "val")}
    write_json(
        out / "manifest.json",
        {
            "seq_len": seq_len,
            "row_len": seq_len + 1,
            "dtype": np.dtype(dtype).name,
            "vocab_size": vocab,
            "padded_vocab_size": padded,
            "splits": splits,
            "documents": {"eos_id": 0, "bos_id": None},  # token 0 ends a document (model.document_mask)
        },
    )
    return out


def train_sections(args, arm: dict | None = None) -> dict:
    """The train stage's sections for the bench's model and batch; `arm`'s sections merged over them."""
    model = {"flavour": args.flavour} if args.flavour else getattr(args, "model", None) or DEFAULT_MODEL
    train = {
        "optimizer": EMBEDDED["train"]["optimizer"],  # what the default's step runs (the baselines: AdamW)
        "micro_batch": args.micro_batch,
        "max_steps": 10**6,
        "warmup_steps": 10,
        "precision": args.precision,
        "compile": args.compile,
    }
    arm = arm or {}
    return kiln_config.stage_sections(
        "train",
        seed=args.seed,
        shard={"seq_len": args.seq_len} | arm.get("shard", {}),
        model=model | arm.get("model", {}),
        train=train | arm.get("train", {}),
    )


class PlainLoss(torch.nn.Module):
    """nanoGPT's loss: the model's whole logits (B, T, V), then F.cross_entropy over them."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, _ = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


class NanoGPTLoop:
    """nanoGPT's train.py inner loop on a fresh model of the same shape and seed, eager or compiled whole."""

    def __init__(self, trainer: Trainer, shard_dir: Path, train: dict, seed: int, compiled: bool = False):
        torch.manual_seed(seed)
        self.device, self.B, self.T = trainer.dist.device, train["micro_batch"], trainer.model_config.seq_len
        with torch.device(self.device):
            self.model = build_model(trainer.model_config)
        self.model.train()
        self.loss = PlainLoss(self.model)
        if compiled:
            self.loss = torch.compile(self.loss)
        self.data = open_shard(shard_dir / "train-00000.bin").reshape(-1)  # one token stream
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=train["lr"],
            weight_decay=train["weight_decay"],
            betas=(train["beta1"], train["beta2"]),
            fused=self.device.type == "cuda",
        )
        self.ctx = device.autocast(self.device, trainer.bf16)
        self.clip = train["grad_clip"]

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(self.data) - self.T - 1, (self.B,))
        x = torch.stack([torch.from_numpy(self.data[i : i + self.T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(self.data[i + 1 : i + 1 + self.T].astype(np.int64)) for i in ix])
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x, y

    def train_step(self) -> torch.Tensor:
        x, y = self.get_batch()
        with self.ctx():
            loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


def baseline_names(args) -> tuple[str, ...]:
    return tuple({"eager": EAGER, "compiled": COMPILED}[b] for b in args.baselines)


def timed_round(step, steps: int, dev: torch.device) -> float:
    """Seconds for `steps` steps, from an idle device to the last loss read back."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start = time.perf_counter()
    for _ in range(steps - 1):
        step()
    step().item()
    return time.perf_counter() - start


def measure(loops: dict, args, dev: torch.device) -> dict[str, list[float]]:
    """Warm each loop up, then time args.rounds rounds of each, alternating between the loops: a
    neighbour's burst of load lands on both alike."""
    for step in loops.values():
        for _ in range(args.warmup):
            step()
    seconds = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, step in loops.items():
            seconds[name].append(timed_round(step, args.steps, dev))
    return seconds


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and batch a train-step bench runs: --flavour, --vocab, --seq-len, --micro-batch."""
    parser.add_argument("--flavour", help="a registry flavour (default: the default config's model)")
    parser.add_argument(
        "--vocab",
        type=int,
        default=EMBEDDED["tokenizer"]["vocab_size"],
        help="tokenizer vocabulary (padded to 64 for the model; default: the default config's)",
    )
    parser.add_argument("--seq-len", type=int, default=EMBEDDED["shard"]["seq_len"])
    parser.add_argument("--micro-batch", type=int, default=EMBEDDED["train"]["micro_batch"])


def main() -> None:
    parser = common.parser(__doc__, rounds=25, rounds_help="timed rounds per loop, alternating")
    add_shape_arguments(parser)
    parser.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default="fp32" if device.cpu_bf16_emulated() else "bf16",
        help="both loops' (default: fp32 on a CPU without bf16 instructions, where train.precision auto "
        "trains in fp32; else bf16)",
    )
    parser.add_argument(
        "--compile",
        choices=["auto", "true", "false"],
        default=str(EMBEDDED["train"].get("compile", "auto")).lower(),
        help="ours only (default: the default config's train.compile)",
    )
    parser.add_argument("--steps", type=int, default=2, help="steps per timed round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument(
        "--baselines",
        nargs="+",
        choices=["eager", "compiled"],
        default=["eager", "compiled"],
        help="nanoGPT's loops to run",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument(
        "--arm", nargs="+", metavar="SECTION=YAML", help="time Kiln's step with these overrides against Kiln's own"
    )
    parser.add_argument(
        "--sdpa",
        action="store_true",
        help="the arm (alone, or with --arm's overrides) attends through SDPA's kernel, not the written-out "
        "attention a CPU's compiled step runs (kiln.model.sdpa.blockwise_causal)",
    )
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    args.compile = {"true": True, "false": False}.get(args.compile, "auto")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        shards = synthetic_shards(
            Path(tmp), args.vocab, args.seq_len, rows=max(64, 4 * args.micro_batch), seed=args.seed
        )
        sections = train_sections(args)
        ours = Trainer(RunConfig.of(sections), shards)
        loops = {EAGER: False, COMPILED: True}
        loops = {
            name: compiled for name, compiled in loops.items() if (EAGER, COMPILED)[compiled] in baseline_names(args)
        }

        def ours_step() -> torch.Tensor:
            return ours.train_step()[0]  # the loss; no host sync inside

        if args.arm or args.sdpa:
            arm = {key: yaml.safe_load(value) for key, value in (text.split("=", 1) for text in args.arm or [])}
            vocab = arm.get("tokenizer", {}).get("vocab_size", args.vocab)
            seq_len = arm.get("shard", {}).get("seq_len", args.seq_len)
            if (vocab, seq_len) != (args.vocab, args.seq_len):  # the arm's rows: shards of their own
                micro_batch = arm.get("train", {}).get("micro_batch", args.micro_batch)
                (Path(tmp) / "arm").mkdir()
                arm_shards = synthetic_shards(
                    Path(tmp) / "arm", vocab, seq_len, rows=max(64, 4 * micro_batch), seed=args.seed
                )
            else:
                arm_shards = shards
            other = Trainer(RunConfig.of(train_sections(args, arm)), arm_shards)
            if args.sdpa:  # SDPA's kernel where a CPU's compiled step writes attention out (kiln.model.sdpa)
                for block in other.model.blocks:
                    block.attn.blockwise = False
            seconds = measure({OURS: ours_step, ARM: lambda: other.train_step()[0]}, args, ours.dist.device)
            tokens = {  # a micro-batch's tokens, each loop's own (the arm may change its rows' length)
                OURS: ours.train.micro_batch * ours.model_config.seq_len,
                ARM: other.train.micro_batch * other.model_config.seq_len,
            }
            rate = {loop: args.steps * tokens[loop] / statistics.median(times) for loop, times in seconds.items()}
            print(f"| loop | tokens/s (median of {args.rounds}) |\n|---|---:|")
            print("\n".join(f"| {loop} | {r:,.0f} |" for loop, r in rate.items()))
            what = " ".join([*(args.arm or []), *(["SDPA's attention kernel"] if args.sdpa else [])])
            print(f"\narm / ours: {rate[ARM] / rate[OURS]:.3f}x ({what})")
            return
        if ours.dist.device.type == "cuda":  # one model at a time: two 1B models and their activations do not fit
            seconds = {}
            for name, compiled in loops.items():
                base = NanoGPTLoop(ours, shards, sections["train"], args.seed, compiled)
                seconds |= measure({name: base.train_step}, args, ours.dist.device)
                del base
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            seconds |= measure({OURS: ours_step}, args, ours.dist.device)
        else:
            steps = {
                name: NanoGPTLoop(ours, shards, sections["train"], args.seed, compiled).train_step
                for name, compiled in loops.items()
            }
            seconds = measure(steps | {OURS: ours_step}, args, ours.dist.device)
        tokens = args.steps * args.micro_batch * args.seq_len
        flops, peak = flops_per_token(ours.model), peak_flops(ours.dist.device)
        name = (
            torch.cuda.get_device_name()
            if ours.dist.device.type == "cuda"
            else f"CPU, {torch.get_num_threads()} threads"
        )
        print(
            f"{name}; {args.flavour or 'default-config model'}: {ours.model.num_params(non_embedding=False):,} parameters, "
            f"batch {args.micro_batch} x {args.seq_len}, {args.precision}, ours compiled: "
            f"{device.use_compile(args.compile, ours.dist.device)}; {args.rounds} rounds x {args.steps} steps\n"
        )
        print("| loop | tokens/s (median) | min-max | TFLOP/s | MFU |\n|---|---:|---:|---:|---:|")
        rate = {}
        for loop, times in seconds.items():
            rate[loop] = tokens / statistics.median(times)
            mfu = f"{flops * rate[loop] / peak:.1%}" if peak else "n/a"
            print(
                f"| {loop} | {rate[loop]:,.0f} | {tokens / max(times):,.0f}-{tokens / min(times):,.0f} | "
                f"{flops * rate[loop] / 1e12:.2f} | {mfu} |"
            )
        against = ", ".join(f"{rate[OURS] / rate[name]:.2f}x the {name}" for name in loops)
        print(f"\nours: {against}; peak memory {memory_mb(ours.dist.device):,.0f} MB")


if __name__ == "__main__":
    main()
