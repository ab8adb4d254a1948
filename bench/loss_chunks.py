"""Train-step tokens/s of Kiln's Trainer with the chunked loss at several chunk sizes, against the
same step with the loss unchunked (one chunk: the plain loss), in one run.

    python bench/loss_chunks.py --quick                 # CPU, a 2-layer model: what tests/test_bench.py runs
    # one H100/H200 (what chose kiln.config.models.LOSS_CHUNK_ELEMENTS, docs/benchmarks.md):
    python bench/loss_chunks.py --flavour gpt2-124m --vocab 50257 --seq-len 1024 --micro-batch 16
    python bench/loss_chunks.py --flavour llama3.2-1b --vocab 32768 --seq-len 8192 --micro-batch 6 --steps 3

The chunk size is kiln.config.models.LOSS_CHUNK_ELEMENTS (logits per chunk), which kiln.model.loss
reads at every call, so one Trainer (one model, one compile of its blocks) runs every setting; the
settings take turns round by round, so a neighbour's burst of load lands on all alike, and the figure
is each setting's median round. The compiled per-chunk function is compiled once per chunk shape:
the recompile limit is raised so that no setting falls back to eager. Peak memory is each setting's
max_memory_allocated over its rounds (CUDA only).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from train_throughput import add_shape_arguments, synthetic_shards, timed_round, train_sections  # bench/ is sys.path[0]

import kiln.config.models as model_configs
from kiln.train import device
from kiln.train.trainer import Trainer

UNCHUNKED = 2**62  # more logits than any batch holds: one chunk, no recompute
QUICK = dict(model={"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64}, flavour=None, vocab=512)
QUICK |= dict(seq_len=64, micro_batch=4, exponents="12,14", steps=1, rounds=1, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    parser.add_argument("--exponents", default="25,27,28,29,30", help="chunk sizes to time, as powers of two")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per setting, taking turns")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per setting first (compiles)")
    parser.add_argument("--compile", choices=["auto", "true", "false"], default="auto")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU (tests/test_bench.py)")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    args.precision, args.compile = "bf16", {"true": True, "false": False}.get(args.compile, "auto")
    settings = {f"2**{e}": 2 ** int(e) for e in args.exponents.split(",")} | {"unchunked": UNCHUNKED}
    torch._dynamo.config.recompile_limit = 8 * len(settings)  # a chunk shape each: none may fall back to eager

    with tempfile.TemporaryDirectory() as tmp:
        shards = synthetic_shards(
            Path(tmp), args.vocab, args.seq_len, rows=max(64, 4 * args.micro_batch), seed=args.seed
        )
        trainer = Trainer(train_sections(args), shards)
        dev, cuda = trainer.dist.device, trainer.dist.device.type == "cuda"
        tokens = args.steps * trainer.batch_split.tokens_per_step
        rows, vocab = args.micro_batch * args.seq_len, trainer.model_config.vocab_size

        def step() -> torch.Tensor:
            return trainer.train_step()[0]

        seconds, peak = {name: [] for name in settings}, {name: 0.0 for name in settings}
        for name, elements in settings.items():
            model_configs.LOSS_CHUNK_ELEMENTS = elements
            for _ in range(args.warmup):
                step()
        for _ in range(args.rounds):
            for name, elements in settings.items():
                model_configs.LOSS_CHUNK_ELEMENTS = elements
                if cuda:
                    torch.cuda.reset_peak_memory_stats(dev)
                seconds[name].append(timed_round(step, args.steps, dev))
                if cuda:
                    peak[name] = max(peak[name], torch.cuda.max_memory_allocated(dev) / 2**30)

    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"{where}; {args.flavour or 'model ' + str(trainer.model_config.n_layer) + ' layers'}, batch "
        f"{args.micro_batch} x {args.seq_len} ({rows:,} rows), V {vocab:,}, bf16, compiled: {device.use_compile(args.compile, dev)}; "
        f"{args.rounds} rounds x {args.steps} steps\n"
    )
    print("| loss chunks | logits a chunk | chunks a micro-batch | tokens/s (median) | peak GiB | / unchunked |")
    print("|---|---:|---:|---:|---:|---:|")
    base = tokens / statistics.median(seconds["unchunked"])
    for name, elements in settings.items():
        chunk_rows = max(1, min(rows, elements // vocab))
        rate = tokens / statistics.median(seconds[name])
        print(
            f"| {name} | {min(elements, rows * vocab):,} | {-(-rows // chunk_rows)} | {rate:,.0f} | "
            f"{peak[name]:.1f} | {rate / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
