"""The training loss's speed, compiled (what a compiled run uses: kiln.train.parallel.compile_blocks
compiles the chunked loss's per-chunk function) against eager, in one run, forward and backward
under bf16 autocast as train runs it.

    python bench/loss_compile.py                 # GPT-2 124M's head: 2,048 rows, C 768, V 50,304
    python bench/loss_compile.py --device cuda   # the same on a GPU (the figure issue 29 asks about)
    python bench/loss_compile.py --quick         # 256 rows, C 64, V 512: tests/test_bench.py

Both run kiln.model.loss.lm_loss on the same inputs, chunked as train chunks them; the compiled one
with inductor (cold: its compile time is printed apart, not timed). Seconds are the median of
--rounds after one warm-up each; the ratio is eager / compiled (above 1: compiled is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kiln.config.models import loss_chunk_rows
from kiln.model.loss import chunk_loss_sum, lm_loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(hidden, weight, targets, chunk_loss, device) -> float:
    """One forward and backward of the loss; seconds."""
    hidden.grad = weight.grad = None
    _sync(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = lm_loss(hidden, weight, targets, chunk_loss=chunk_loss)
    loss.backward()
    _sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048, help="positions per step (batch x seq_len)")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.d_model, args.vocab, args.rounds = 256, 64, 512, 2
    device = torch.device(args.device)
    torch.manual_seed(0)
    hidden = torch.randn(1, args.rows, args.d_model, device=device, requires_grad=True)
    weight = (torch.randn(args.vocab, args.d_model, device=device) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (1, args.rows), device=device)
    compiled = torch.compile(chunk_loss_sum, dynamic=False)
    started = time.perf_counter()
    step(hidden, weight, targets, compiled, device)  # compiles
    compile_s = time.perf_counter() - started
    step(hidden, weight, targets, chunk_loss_sum, device)
    times = {"eager": [], "compiled": []}
    for _ in range(args.rounds):  # interleaved: a burst of load on the machine hits both
        times["eager"].append(step(hidden, weight, targets, chunk_loss_sum, device))
        times["compiled"].append(step(hidden, weight, targets, compiled, device))
    eager, ours = statistics.median(times["eager"]), statistics.median(times["compiled"])
    chunk = loss_chunk_rows(args.vocab)
    print(f"loss of {args.rows} rows x C {args.d_model} x V {args.vocab} on {device} ({-(-args.rows // chunk)} chunks)")
    print("| loss | s per forward+backward (median) |\n|---|---:|")
    print(f"| eager | {eager:.4f} |\n| compiled | {ours:.4f} |")
    print(f"eager / compiled: {eager / ours:.2f}x (compile, cold: {compile_s:.1f} s)")


if __name__ == "__main__":
    main()
