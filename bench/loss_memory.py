"""Peak memory of the training loss, Kiln's chunked cross-entropy (kiln.model.loss) against the plain
one (whole logits, upcast to fp32, one F.cross_entropy), in one run on the CPU.

    python bench/loss_memory.py                    # head + loss alone at V 32,768, then a whole model step
    python bench/loss_memory.py --rows 8192 --rounds 3
    python bench/loss_memory.py --quick            # 64 rows, V 512, one round, one child: tests/test_bench.py

Two measurements of each, forward and backward, bf16 autocast as train runs it:
  - allocated: the peak of tensor bytes above what was alive before (torch's CPU profiler,
    kiln.train.cpu_memory), exact and repeatable; what torch.cuda.max_memory_allocated is on a GPU;
  - resident: the growth of the peak resident set (ru_maxrss) of a fresh child process over its
    value before the call, glibc's default allocator (big blocks mmap'd, returned when freed).
The baseline is the same function with the plain loss in place of the chunked one (for the model,
kiln.model.gpt's lm_loss swapped for it). Seconds are the median of --rounds, for the recompute's cost.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import resource
import statistics
import time

import torch
import torch.nn.functional as F

import kiln.model.gpt as gpt
from kiln.config.models import ModelConfig, loss_chunk_rows
from kiln.model.build import build_model
from kiln.model.loss import lm_loss
from kiln.train.cpu_memory import allocated_during

DEFAULT_MODEL = dict(family="gpt2", n_layer=4, n_head=4, d_model=256)  # config/config.yaml's model


def plain_loss(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, chunk_loss=None) -> torch.Tensor:
    """The whole-logits loss, in lm_loss's place (the model passes its chunk function; unused here)."""
    return F.cross_entropy(F.linear(h, w).float().flatten(0, 1), y.flatten())


def loss_case(args, loss_fn):
    """A closure running forward and backward of the head + loss on (rows, C) hidden states."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, args.rows, args.d_model, generator=g, requires_grad=True)  # (1, N, C)
    w = (0.02 * torch.randn(args.vocab, args.d_model, generator=g)).requires_grad_()  # (V, C)
    y = torch.randint(0, args.vocab, (1, args.rows), generator=g)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(h, w, y)
        loss.backward()
        h.grad = w.grad = None

    return run


def model_case(args, loss_fn):
    """Forward and backward of the default config's GPT at batch x seq_len, vocab --model-vocab."""
    gpt.lm_loss = loss_fn  # the model calls the loss by this name
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.model_vocab, seq_len=args.seq_len, **DEFAULT_MODEL)
    model = build_model(cfg).train()
    idx, targets = torch.randint(0, cfg.vocab_size, (2, args.batch, args.seq_len))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, targets)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return run


CASES = {"loss": loss_case, "model": model_case}
LOSSES = {"plain": plain_loss, "chunked": lm_loss}


def measure(case: str, loss: str, args, queue) -> None:
    """In a fresh child: resident growth of one call, allocated peak of another, then timed rounds."""
    torch.set_num_threads(args.threads)
    run = CASES[case](args, LOSSES[loss])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    resident = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024  # KiB on Linux
    _, alloc = allocated_during(run)
    seconds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    queue.put({"allocated": alloc.peak, "resident": resident, "seconds": statistics.median(seconds)})


def child_result(case: str, loss: str, args) -> dict:
    # --quick forks (this process has run no torch op yet): a spawned child's imports cost seconds
    # (pickling the arguments, which spawn does and fork does not, is left to the full run)
    ctx = multiprocessing.get_context("fork" if args.quick else "spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=measure, args=(case, loss, args, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def in_process(case: str, loss: str, args) -> dict:
    out = queue.SimpleQueue()
    measure(case, loss, args, out)
    return out.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096, help="loss case: positions (B*T)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32768, help="loss case: vocabulary (llama-1b seed's)")
    parser.add_argument("--model-vocab", type=int, default=32768, help="model case: vocabulary")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny input through every part that prints the table (tests/test_bench.py); figures meaningless",
    )
    args = parser.parse_args()
    if args.quick:
        vars(args).update(rows=64, d_model=32, vocab=512, model_vocab=512, batch=2, seq_len=32, rounds=1, threads=1)
    rows = []
    shapes = {
        "loss": f"head + loss, {args.rows:,} rows x C {args.d_model} -> V {args.vocab:,}",
        "model": f"default 4x256 GPT, {args.batch} x {args.seq_len}, V {args.model_vocab:,}",
    }
    for case in CASES:
        results = {}
        for loss in LOSSES:
            # --quick: the first in a child as always, the others here (a child pays torch's profiler
            # start-up, ~1.5 s, and the figures mean nothing)
            quick_here = args.quick and (rows or results)
            results[loss] = in_process(case, loss, args) if quick_here else child_result(case, loss, args)
        rows.append((case, results))
    if args.json:
        print(json.dumps({case: r for case, r in rows}, indent=2))
        return
    vocab = {"loss": args.vocab, "model": args.model_vocab}
    print(f"bf16 autocast, forward + backward; chunks of {loss_chunk_rows(args.vocab):,} rows at V {args.vocab:,}\n")
    print("| case | loss | allocated peak MiB | resident growth MiB | seconds |\n|---|---|---:|---:|---:|")
    for case, results in rows:
        for loss, r in results.items():
            print(
                f"| {shapes[case]} | {loss} | {r['allocated'] / 2**20:,.1f} | {r['resident'] / 2**20:,.1f} | "
                f"{r['seconds']:.3f} |"
            )
    for case, results in rows:
        p, c = results["plain"], results["chunked"]
        print(
            f"\n{case} (V {vocab[case]:,}): chunked / plain allocated peak {c['allocated'] / p['allocated']:.2f}x "
            f"({(p['allocated'] - c['allocated']) / 2**20:,.0f} MiB saved); resident "
            f"{c['resident'] / max(p['resident'], 1):.2f}x; time {c['seconds'] / p['seconds']:.2f}x"
        )


if __name__ == "__main__":
    main()
