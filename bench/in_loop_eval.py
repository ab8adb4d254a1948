"""What eval.in_loop costs a run (kiln.eval.in_loop): one in-loop HumanEval slice (the first 20
problems, greedy, 128 new tokens, every program in the sandbox) beside the default's train step, both
timed in this run on config/config.yaml's model shape, and the share of training that follows at a
few cadences (eval seconds / (every x step seconds)).

    python bench/in_loop_eval.py              # the default's model and batch, 20 problems
    python bench/in_loop_eval.py --quick      # 2 problems x 8 tokens: what tests/bench/test_bench.py runs

The model has random weights (they decode as fast as trained ones; a trained model stops earlier at
the Codex stop sequences, so this is the most a slice costs) and a BPE trained here on the stdlib, as
bench/code_eval.py's. The step is the default's: micro_batch x seq_len tokens, forward, backward and
AdamW, fp32, on this CPU's threads.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import torch
from code_eval import stdlib_tokenizer

from kiln import config as kiln_config
from kiln.config.models import model_config
from kiln.data.tokenizer import padded_vocab_size
from kiln.eval import code
from kiln.eval.humaneval import GREEDY, load_problems, truncate
from kiln.model.build import build_model

ROOT = Path(__file__).resolve().parent.parent
CADENCES = (100, 200, 500, 1000)


def step_seconds(model, rows: int, seq_len: int, vocab: int, steps: int) -> float:
    """Median seconds of the default's train step on random ids (the first two steps left out: warm-up)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (rows, seq_len + 1))
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def in_loop_seconds(model, tokenizer, problems: int, max_new: int) -> tuple[float, float, float]:
    """(decoding, sandbox, pass@1) of one in-loop slice, as HumanEvalInLoop runs it on rank 0."""
    chosen = load_problems(problems)
    model.eval()
    start = time.perf_counter()
    texts = code.complete(model, tokenizer, [p.prompt for p in chosen], code.new_tokens(model, max_new), GREEDY, None)
    decoded = time.perf_counter()
    scores = code.score_humaneval(chosen, [[truncate(t)] for t in texts], GREEDY)
    model.train()
    return decoded - start, time.perf_counter() - decoded, scores["pass@1"]["value"]


def main() -> None:
    args = common.parser(__doc__).parse_args()
    raw = kiln_config.read_yaml(ROOT / "config" / "config.yaml")
    run = kiln_config.RunConfig.of(kiln_config.validate(raw))
    tokenizer = stdlib_tokenizer(run.tokenizer.vocab_size, 1 if args.quick else 8)
    vocab = padded_vocab_size(tokenizer.get_vocab_size())
    seq_len = run.shard.seq_len
    model = build_model(model_config(run.model.as_dict(), vocab, seq_len))
    rows = run.train.batch_tokens // seq_len
    step_s = step_seconds(model, rows, seq_len, tokenizer.get_vocab_size(), 3 if args.quick else 20)
    problems, max_new = (2, 8) if args.quick else (run.eval.in_loop.problems, run.eval.in_loop.max_new_tokens)
    decode_s, sandbox_s, passed = in_loop_seconds(model, tokenizer, problems, max_new)
    eval_s = decode_s + sandbox_s
    print(f"# eval.in_loop on this CPU ({torch.get_num_threads()} threads), config/config.yaml's model\n")
    print("| part | seconds |\n|---|---:|")
    print(f"| train step (baseline): {rows} x {seq_len} tokens, AdamW, fp32, median | {step_s:.3f} |")
    print(f"| in-loop slice: {problems} problems x {max_new} new tokens, decoding | {decode_s:.2f} |")
    print(f"| in-loop slice: {problems} programs in the sandbox ({code.workers()} at once) | {sandbox_s:.2f} |")
    print(f"| in-loop slice, in all (pass@1 {passed:.2f}, random weights) | {eval_s:.2f} |\n")
    print("| eval.in_loop.every | share of training |\n|---:|---:|")
    for every in CADENCES:
        print(f"| {every} | {eval_s / (every * step_s):.1%} |")


if __name__ == "__main__":
    main()
