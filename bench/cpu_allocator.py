"""Tokens/s of the train step on CPU with Kiln's allocator setting (kiln.train.device.
tune_cpu_allocator: glibc malloc keeps freed memory) against glibc's default, on the same model,
batch and machine, in one run.

    python bench/cpu_allocator.py                 # the default config's 4x256 GPT, batch 16 x 256, bf16
    python bench/cpu_allocator.py --rounds 5 --steps 16
    python bench/cpu_allocator.py --quick        # one round of one step, a 1-layer model: tests/test_bench.py

An allocator setting is per process, so each measurement is a child process (this script with
--child), alternating default and tuned over --rounds so a noisy neighbour hits both alike; each child
builds Kiln's Trainer on random-token shards, warms up, and times --steps steps. The figure is the
median round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICK_MODEL = {"n_layer": 1, "n_head": 2, "d_model": 32}  # --quick (train_throughput's)


def child(args) -> None:
    """One measurement: tokens/s of args.steps train steps, allocator tuned or left as glibc's."""
    # Imported here, not at the top: the parent only starts children and reads their figures.
    import torch

    from kiln.train import device
    from kiln.train.trainer import Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_throughput import synthetic_shards, train_sections

    if args.child == "default":
        device.tune_cpu_allocator = lambda: False  # Trainer's device.configure calls it
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        shards = synthetic_shards(Path(tmp), args.vocab, args.seq_len, rows=4 * args.micro_batch, seed=args.seed)
        trainer = Trainer(train_sections(args), shards)
        for _ in range(args.warmup):
            trainer.train_step()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = trainer.train_step()[0]
        loss.item()
        elapsed = time.perf_counter() - start
    print(json.dumps({"tokens_per_s": args.steps * trainer.batch_split.tokens_per_step / elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--steps", type=int, default=16, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="child processes per setting, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny input through every part that prints the table (tests/test_bench.py); figures meaningless",
    )
    parser.add_argument("--child", choices=["default", "tuned"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:  # train_throughput's tiny model and batch (the children get --quick too)
        vars(args).update(model=QUICK_MODEL, vocab=512, seq_len=32, micro_batch=2, steps=1, warmup=0, rounds=1)
    args.flavour, args.compile = None, False  # what train_sections reads: the default config's GPT, eager
    if args.child:
        child(args)
        return
    rates: dict[str, list[float]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for setting in rates:
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--child", setting],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rates[setting].append(json.loads(out.strip().splitlines()[-1])["tokens_per_s"])
    base, ours = statistics.median(rates["default"]), statistics.median(rates["tuned"])
    print(
        f"CPU, {args.threads} threads; default-config GPT, batch {args.micro_batch} x {args.seq_len}, "
        f"{args.precision}; {args.rounds} rounds x {args.steps} steps\n"
    )
    print("| allocator | tokens/s (median) | min-max |\n|---|---:|---:|")
    for name, label in (("default", "glibc default"), ("tuned", "Kiln (tune_cpu_allocator)")):
        print(f"| {label} | {statistics.median(rates[name]):,.0f} | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} |")
    print(f"\nours / baseline: {ours / base:.2f}x")


if __name__ == "__main__":
    main()
