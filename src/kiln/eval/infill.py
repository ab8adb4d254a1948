"""Fill-in-the-middle on held-out code: can the model write back lines it never saw?

From each validation document (never trained on, never FIM-ed) come two problems: one hidden
non-blank line ("single") and a hidden run of 2-4 lines ("multi"). Each is prompted in both
training layouts:
  PSM  <fim_prefix> prefix <fim_suffix> suffix <fim_middle>
  SPM  <fim_suffix> suffix <fim_prefix> prefix <fim_middle>
and decoded greedily until <|endoftext|> or a limit, BATCH prompts at a time. Scores: exact match
(up to trailing whitespace) and edit similarity (difflib's ratio, 1.0 = identical), reported per
span kind and layout. Problems are drawn from (seed, document id), so every eval of a run sees the
same ones. A prompt starts with the tokenizer's BOS when it has one (a Llama source's), as every
training sample did.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import torch

from kiln.config.train_sections import InitFrom
from kiln.data.fim import MIDDLE, MODES, PREFIX, SUFFIX
from kiln.data.sources import Document
from kiln.data.tokenizer import EOS, bos_id, role_id, with_bos
from kiln.eval.middles import LAYOUTS, match_scores
from kiln.generate.decode import generate
from kiln.io import stable_hash

MAX_MIDDLE_TOKENS = 64
BATCH = 16  # prompts decoded together: each holds up to seq_len cache slots per layer
SPAN_LINES = {"single": (1, 1), "multi": (2, 4)}


@dataclass(frozen=True)
class InfillProblem:
    doc_id: str
    span: str  # "single" or "multi"
    prefix: str
    middle: str
    suffix: str


def _problem(doc: Document, span: str, seed: int) -> InfillProblem | None:
    lines = doc.text.splitlines(keepends=True)
    rng = random.Random(stable_hash(seed, "infill", span, doc.id))
    lo, hi = SPAN_LINES[span]
    n = rng.randint(lo, hi)
    # the span starts on a non-blank line and leaves at least one line on each side
    starts = [i for i in range(1, len(lines) - n) if lines[i].strip()]
    if len(starts) < 3:
        return None
    i = rng.choice(starts)
    return InfillProblem(doc.id, span, "".join(lines[:i]), "".join(lines[i : i + n]), "".join(lines[i + n :]))


def not_run_reason(meta: dict, tokenizer, init_from: InitFrom | None) -> str | None:
    """Why infilling is not measured for this run, or None when it is. A model that never saw a FIM
    sentinel cannot infill (its completions of "<fim_middle>" are noise, not a score): that is a run
    whose train split (the token folder's meta.json `fim_modes`, what pretokenize actually wrote)
    holds no FIM-transformed document, e.g. pretokenize.fim.rate 0 for prose, and that started from
    random weights (train.init_from's source may have seen FIM: then it is measured), or one whose
    tokenizer has no FIM tokens. A token folder older than `fim_modes` cannot say: measured. Before
    any data, the rehearsal asks the config alone (kiln.config.eval_switches.fim_trained), which says
    "may infill" wherever this can say "measured" but for such an older folder."""
    if any(role_id(tokenizer, role) is None for role in (PREFIX, SUFFIX, MIDDLE)):  # the run's token for each
        return "the tokenizer has no FIM tokens"
    modes = meta.get("fim_modes")
    if modes is None or init_from is not None:
        return None
    if not any(modes.get(mode, 0) for mode in MODES):
        return (
            f"trained without FIM: none of the {meta['splits']['train']['docs']:,} train documents was "
            "FIM-transformed (pretokenize.fim.rate 0)"
        )
    return None


def make_problems(docs: list[Document], n_docs: int, seed: int) -> list[InfillProblem]:
    """A single-line and a multi-line problem from each of up to n_docs documents."""
    problems = []
    used = 0
    for doc in sorted(docs, key=lambda d: stable_hash(seed, "infill-docs", d.id)):
        found = [p for span in SPAN_LINES if (p := _problem(doc, span, seed)) is not None]
        if len(found) == len(SPAN_LINES):
            problems += found
            used += 1
        if used == n_docs:
            break
    return problems


def _prompt(problem: InfillProblem, tokenizer, layout: str, budget: int) -> list[int]:
    """Prompt ids (after the BOS, when the tokenizer has one), keeping the prefix's end and the
    suffix's start when the budget is short."""
    tid = lambda role: role_id(tokenizer, role)  # noqa: E731  the run's token for each sentinel's role
    pre = tokenizer.encode(problem.prefix, add_special_tokens=False).ids
    suf = tokenizer.encode(problem.suffix, add_special_tokens=False).ids
    room = budget - 3 - (bos_id(tokenizer) is not None)  # three sentinels, and the BOS when there is one
    keep_suf = min(len(suf), room // 2)
    keep_pre = min(len(pre), room - keep_suf)
    keep_suf = min(len(suf), room - keep_pre)
    pre_part = [tid(PREFIX)] + pre[len(pre) - keep_pre :]
    suf_part = [tid(SUFFIX)] + suf[:keep_suf]
    body = pre_part + suf_part if layout == "psm" else suf_part + pre_part
    return with_bos(tokenizer, body + [tid(MIDDLE)])


def write_middles(
    model, prompts: list[list[int]], stop_ids: frozenset[int], vocab_size: int | None = None
) -> list[list[int]]:
    """Each FIM prompt's middle, greedily, at most MAX_MIDDLE_TOKENS, BATCH prompts at a time: the
    infilling's work on the model's device (kiln.rehearse.eval_stage rehearses it at the longest prompts)."""
    return generate(model, prompts, MAX_MIDDLE_TOKENS, stop_ids=stop_ids, vocab_size=vocab_size, batch_size=BATCH)


@torch.no_grad()
def run_infill(model, tokenizer, problems: list[InfillProblem]) -> dict:
    """Scores by "<span>/<layout>" and overall, plus every completion."""
    stop = frozenset(i for i in (role_id(tokenizer, EOS), role_id(tokenizer, "<file_sep>")) if i is not None)
    cases = [(problem, layout) for problem in problems for layout in LAYOUTS]
    prompts = [
        _prompt(problem, tokenizer, layout, model.config.seq_len - MAX_MIDDLE_TOKENS) for problem, layout in cases
    ]
    outs = write_middles(model, prompts, stop, tokenizer.get_vocab_size())
    examples = []
    for (problem, layout), out in zip(cases, outs):
        completion = tokenizer.decode(out, skip_special_tokens=False)
        examples.append(
            {
                "doc_id": problem.doc_id,
                "span": problem.span,
                "layout": layout,
                "expected": problem.middle,
                "completion": completion,
                **match_scores(completion, problem.middle),
            }
        )
    groups: dict[str, list[dict]] = defaultdict(list, {"all": []})
    for ex in examples:
        groups[f"{ex['span']}/{ex['layout']}"].append(ex)
        groups["all"].append(ex)
    scores = {
        name: {
            "problems": len(rows),
            "exact_match": sum(r["exact_match"] for r in rows) / len(rows) if rows else None,
            "edit_similarity": sum(r["edit_similarity"] for r in rows) / len(rows) if rows else None,
        }
        for name, rows in sorted(groups.items())
    }
    return {"scores": scores, "examples": examples}
