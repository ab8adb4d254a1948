"""Tokens/s of the eval stage's decoding (kiln.generate.decode: KV cache, batched prompts) against the
loop it replaced (the whole sequence through the model for every new token, one prompt at a time),
on the same model, prompts and machine, in one run.

    python bench/generate.py                                  # the default config's 4x256 GPT, 32 prompts x 64 tokens
    python bench/generate.py --family llama --prompts 64 --rounds 3
    python bench/generate.py --quick          # 2 prompts x 4 tokens at seq 32: what tests/bench/test_bench.py runs

Three loops, all greedy with no stop ids, so each makes exactly prompts x new tokens:
- uncached, one by one: the pre-cache kiln.generate.decode, kept here as the baseline;
- cached, one by one: generate() on each prompt alone (what the cache alone buys);
- cached, batched: generate() on all prompts at once (what the eval stage runs).
The model is a fresh one of the default config's shape (random weights decode at the same speed as
trained ones); prompt lengths are drawn between half and all of --prompt-len so the batch holds
padding. Loops alternate over --rounds (a noisy neighbour hits all alike); the figure is the median.
Rows whose greedy output equals the baseline's are counted as a check.
"""

from __future__ import annotations

import statistics
import time

import common  # bench/ is sys.path[0]
import torch

from kiln.config.models import ModelConfig
from kiln.generate.decode import generate
from kiln.model.build import build_model
from kiln.plan.decode import Machine, decode_tokens_per_s
from kiln.plan.peaks import gpu_of

# The shape docs/benchmarks.md's figures were measured at (an early default of config/config.yaml).
DEFAULT_MODEL = {"n_layer": 4, "n_head": 4, "d_model": 256}
UNCACHED, CACHED_ONE, CACHED_BATCH = "uncached, one by one", "cached, one by one", "cached, batched"


@torch.no_grad()
def uncached_one_by_one(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The decoding loop before the KV cache, greedy: every step reruns the last seq_len tokens."""
    device = next(model.parameters()).device
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        for _ in range(new_tokens):
            logits, _ = model(ids[:, -model.config.seq_len :])
            next_id = logits[0, -1].float().argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        out.append(ids[0, len(prompt) :].tolist())
    return out


LOOPS = {
    UNCACHED: uncached_one_by_one,
    CACHED_ONE: lambda model, prompts, n: [generate(model, [p], n)[0] for p in prompts],
    CACHED_BATCH: lambda model, prompts, n: generate(model, prompts, n),
}


def main() -> None:
    parser = common.parser(__doc__, rounds=1, rounds_help="timed rounds per loop, alternating")
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--vocab", type=int, default=8192, help="tokenizer vocabulary (padded to 64 for the model)")
    parser.add_argument("--seq-len", type=int, default=256, help="the model's context")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128, help="longest prompt; the shortest is half")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if args.quick:
        vars(args).update(vocab=512, seq_len=32, prompts=2, prompt_len=8, new_tokens=4, rounds=1)
    if args.prompt_len + args.new_tokens > args.seq_len:
        parser.error("--prompt-len + --new-tokens must fit --seq-len (the baseline would slide its window)")
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    cfg = ModelConfig(family=args.family, vocab_size=-(-args.vocab // 64) * 64, seq_len=args.seq_len, **DEFAULT_MODEL)
    model = build_model(cfg).to(args.device).eval()
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (args.prompts,), generator=g).tolist()
    prompts = [torch.randint(0, args.vocab, (n,), generator=g).tolist() for n in lengths]

    for loop in LOOPS.values():  # warm-up: allocator, kernels, threads
        loop(model, prompts[:2], 2)
    times: dict[str, list[float]] = {name: [] for name in LOOPS}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for name, loop in LOOPS.items():
            start = time.perf_counter()
            outputs[name] = loop(model, prompts, args.new_tokens)
            times[name].append(time.perf_counter() - start)

    tokens = args.prompts * args.new_tokens
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    print(
        f"{args.family} {DEFAULT_MODEL}, vocab {cfg.vocab_size}, seq_len {args.seq_len}: "
        f"{model.num_params(non_embedding=False):,} parameters; {args.device}, {torch.get_num_threads()} threads"
    )
    print(
        f"{args.prompts} prompts of {min(lengths)}-{max(lengths)} tokens x {args.new_tokens} new tokens, "
        f"median of {args.rounds} round(s)\n"
    )
    print("| loop | new tokens/s | seconds | same output as baseline |\n|---|---:|---:|---:|")
    for name in LOOPS:
        same = sum(a == b for a, b in zip(outputs[name], outputs[UNCACHED]))
        print(f"| {name} | {rate[name]:,.0f} | {statistics.median(times[name]):.2f} | {same}/{args.prompts} |")
    print(
        f"\ncached batched / uncached one by one: {rate[CACHED_BATCH] / rate[UNCACHED]:.1f}x "
        f"(cached one by one: {rate[CACHED_ONE] / rate[UNCACHED]:.1f}x)"
    )
    gpu = gpu_of(torch.cuda.get_device_name(args.device)) if args.device.startswith("cuda") else None
    if gpu is not None:  # the rate the eval's price assumes on this card (kiln.plan.decode)
        priced = decode_tokens_per_s(cfg, Machine.of(gpu, mfu=0.4), args.prompts)
        print(
            f"priced: {priced:,.0f} new tokens/s on {gpu.fragment}; cached batched is {rate[CACHED_BATCH] / priced:.2f}x the price"
        )


if __name__ == "__main__":
    main()
