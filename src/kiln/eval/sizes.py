"""How much of each code benchmark the eval stage runs, and what that costs on a GPU.

A size left at `auto` (eval.humaneval.problems and samples, eval.humaneval_infill.problems and
tasks_per_kind) follows from where the eval runs:

- on a CPU, a few problems of each benchmark (HumanEval 4 greedy; infilling 8 tasks of each kind from
  2 problems), so that `make run` stays in its minutes and the report still shows every figure;
- on a GPU, the published sizes: all 164 HumanEval problems greedy, every infilling task of all 164
  problems in each mode (1,033 single-line, 5,815 multi-line and 1,640 random-span tasks), and the
  Codex protocol's sampled pass@1 and pass@10 from the largest n of SAMPLE_LADDER whose eval `kiln
  plan` prices within eval.humaneval.samples_share of the train stage.

`kiln plan` (kiln.forecast) prices these sizes beside training, on plan.gpu at plan.mfu for the
train stage it predicts. The eval stage decides n with the same rule from what it knows then
(`for_run`): the card it runs on, the train stage's own time and MFU (train/summary.json), so a run
that trained longer than planned may afford more samples, never more than its share.

The price is a prediction with its assumptions named (no GPU has measured Kiln's decoding yet):
a decode step costs what kiln.plan.decode says (the bf16 weights read at half the card's bandwidth,
or the launches of an eager step's counted kernels, whichever is more); a step decodes DECODE_BATCH prompts for max_new_tokens (the most a batch runs: a batch stops early
only when every row has); prompts cost their forward FLOPs at plan.mfu; each program costs
SANDBOX_S_PER_PROGRAM of one CPU in kiln.eval.sandbox, on SANDBOX_WORKERS at once.
"""

from __future__ import annotations

import logging

from kiln.config.eval_sections import EvalSection
from kiln.config.models import ModelConfig
from kiln.errors import KilnError
from kiln.eval.humaneval import load_problems
from kiln.eval.humaneval_infill import multi_line_tasks, random_span_tasks, single_line_tasks, subset
from kiln.plan.decode import Machine, decode_step_s
from kiln.plan.peaks import gpu_of

log = logging.getLogger("kiln.eval")

AUTO = "auto"
CPU_SIZES = {"problems": 4, "samples": 0, "infill_problems": 2, "tasks_per_kind": 8}
GPU_SIZES = {"problems": 164, "infill_problems": 164, "tasks_per_kind": None}
SAMPLE_LADDER = (200, 100, 50, 20, 10)  # the Codex paper's n first
KINDS = {"single_line": single_line_tasks, "multi_line": multi_line_tasks, "random_span": random_span_tasks}

DECODE_BATCH = 16  # prompts decoded together (kiln.eval.code, kiln.eval.infill)
PROMPT_BYTES_PER_TOKEN = 3.5  # Python on a code BPE (seed 000's ~3.6)
SANDBOX_S_PER_PROGRAM = 0.098  # docs/benchmarks.md, "Code evals": one program on one CPU
SANDBOX_WORKERS = 15  # kiln.eval.code.workers() on a GPU node's 16 CPUs


def resolve(cfg: EvalSection, on_gpu: bool, samples: int = 0) -> EvalSection:
    """cfg with every `auto` size replaced by the one for a CPU or a GPU (module note); `samples` is
    what eval.humaneval.samples: auto becomes (the plan's choice: `samples_within`)."""
    sizes = dict(GPU_SIZES, samples=samples) if on_gpu else CPU_SIZES
    he, inf = cfg.humaneval, cfg.humaneval_infill
    pick = lambda value, key: sizes[key] if value == AUTO else value  # noqa: E731
    return cfg.replace(
        humaneval=he.replace(problems=pick(he.problems, "problems"), samples=pick(he.samples, "samples")),
        humaneval_infill=inf.replace(
            problems=pick(inf.problems, "infill_problems"), tasks_per_kind=pick(inf.tasks_per_kind, "tasks_per_kind")
        ),
    )


def check_resolved(cfg: EvalSection) -> None:
    """A clear error where a size is still `auto` (a caller that skipped `resolve` or `for_run`)."""
    he, inf = cfg.humaneval, cfg.humaneval_infill
    left = [
        f"{section.KEY}.{key}"
        for section in (he, inf)
        for key in ("problems", "samples", "tasks_per_kind")
        if getattr(section, key, None) == AUTO
    ]
    if left:
        raise KilnError(f"eval: {', '.join(left)} still auto: resolve the sizes first (kiln.eval.sizes.resolve)")


def _batches(prompts: int) -> int:
    return -(-prompts // DECODE_BATCH)


def workload(cfg: EvalSection) -> dict:
    """What a resolved cfg asks of the model: per benchmark, the prompts, their characters, the new
    tokens each may decode, and the programs the sandbox runs."""
    parts = {}
    he = cfg.humaneval
    if he.problems != 0:
        problems = load_problems(None if he.problems in (None, 164) else he.problems)
        draws = 1 + (2 * he.samples if he.samples >= 10 else he.samples)  # greedy, T=0.2 and T=0.8 (kiln.eval.code)
        chars = sum(len(p.prompt) for p in problems)
        parts["humaneval"] = {
            "problems": len(problems),
            "prompts": draws * len(problems),
            "prompt_chars": draws * chars,
            "max_new_tokens": he.max_new_tokens,
        }
    inf = cfg.humaneval_infill
    if inf.problems != 0:
        problems = load_problems(inf.problems)
        tasks = [t for kind in inf.kinds for t in subset(KINDS[kind](problems), inf.tasks_per_kind)]
        parts["humaneval_infill"] = {
            "problems": len(problems),
            "prompts": len(tasks) * len(inf.modes),
            "prompt_chars": sum(len(t.prefix) + len(t.suffix) for t in tasks) * len(inf.modes),
            "max_new_tokens": inf.max_new_tokens,
        }
    for part in parts.values():
        part["programs"] = part["prompts"]
    return parts


def price(cfg: EvalSection, model: ModelConfig, machine: Machine) -> dict:
    """The predicted seconds of the code evals of a resolved cfg on one GPU (module note), by benchmark
    and in all: {benchmark: {prompts, programs, decode_s, prompt_s, sandbox_s, s}, "s": total}."""
    step_s = decode_step_s(model, machine)
    forward_flops = 2 * model.num_params(non_embedding=True)  # a prompt token's forward pass
    out: dict = {}
    for name, part in workload(cfg).items():
        new = min(part["max_new_tokens"], model.seq_len // 2)  # kiln.eval.code.new_tokens
        decode_s = _batches(part["prompts"]) * new * step_s
        prompt_s = part["prompt_chars"] / PROMPT_BYTES_PER_TOKEN * forward_flops / (machine.mfu * machine.peak_flops)
        sandbox_s = part["programs"] * SANDBOX_S_PER_PROGRAM / SANDBOX_WORKERS
        out[name] = part | {
            "decode_s": decode_s,
            "prompt_s": prompt_s,
            "sandbox_s": sandbox_s,
            "s": decode_s + prompt_s + sandbox_s,
        }
    out["s"] = sum(part["s"] for part in out.values())
    return out


def samples_within(cfg: EvalSection, model: ModelConfig, machine: Machine, train_s: float) -> int:
    """What eval.humaneval.samples: auto becomes on a GPU: the largest n of SAMPLE_LADDER whose whole
    eval is priced within samples_share of train_s, else 0 (greedy only)."""
    if cfg.humaneval.samples != AUTO:
        return cfg.humaneval.samples
    share = cfg.humaneval.samples_share
    for n in SAMPLE_LADDER:
        if price(resolve(cfg, on_gpu=True, samples=n), model, machine)["s"] <= share * train_s:
            return n
    return 0


def describe(cfg: EvalSection) -> str:
    """The resolved sizes in one line, for the eval's log and the plan."""
    he, inf = cfg.humaneval, cfg.humaneval_infill
    humaneval = "HumanEval off" if he.problems == 0 else f"HumanEval {he.problems or 164} problems"
    if he.problems != 0:
        humaneval += f", greedy + n={he.samples} sampled" if he.samples else ", greedy"
    if inf.problems == 0:
        return f"{humaneval}; infilling off"
    tasks = "every task" if inf.tasks_per_kind is None else f"at most {inf.tasks_per_kind} tasks"
    return (
        f"{humaneval}; infilling {'/'.join(inf.kinds)} x {'/'.join(inf.modes)}, {tasks} of each kind "
        f"from {inf.problems} problems"
    )


def train_seconds(summary: dict) -> float:
    """The train stage's time from its summary.json: the steps it trained at its measured speed (a
    resumed run's jobs together), or a budgeted stage's own wall time."""
    if summary.get("spent_s"):
        return float(summary["spent_s"])
    speed = summary.get("tokens_per_s") or 0.0
    return summary.get("steps", 0) * summary.get("tokens_per_step", 0) / speed if speed else 0.0


def for_run(cfg: EvalSection, model: ModelConfig, device_name: str | None, summary: dict) -> EvalSection:
    """The eval stage's sizes: cfg resolved for its CPU (device_name None) or its GPU, where
    samples: auto is priced against the train stage's time and MFU (train_seconds; a card not in
    kiln.plan.peaks cannot be priced: greedy only, said in the log)."""
    if device_name is None:
        return resolve(cfg, on_gpu=False)
    gpu, samples = gpu_of(device_name), 0
    if gpu is None:
        log.warning("eval: %s is not in kiln.plan.peaks: HumanEval samples: auto runs greedy only", device_name)
    else:
        machine = Machine.of(gpu, summary.get("mfu") or 0.4)
        samples = samples_within(cfg, model, machine, train_seconds(summary))
    resolved = resolve(cfg, on_gpu=True, samples=samples)
    log.info("eval sizes on %s: %s", device_name, describe(resolved))
    return resolved
