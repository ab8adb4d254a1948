"""Fill-in-the-middle exact match on held-out code: can the model write back a line it never saw?

Each problem hides one non-blank line of a validation document (never trained on, never FIM-ed) and
prompts PSM: <fim_prefix> prefix <fim_suffix> suffix <fim_middle>; greedy decoding runs until
<|endoftext|> or a limit. A problem counts as solved when the completion equals the hidden line up to
trailing whitespace. Problems are chosen from (seed, document id), so every eval sees the same ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kiln.data.fim import MIDDLE, PREFIX, SUFFIX
from kiln.data.sources import Document
from kiln.data.tokenizer import EOS
from kiln.eval.generate import generate
from kiln.io import stable_hash
from kiln.model.gpt import GPT

MAX_MIDDLE_TOKENS = 48


@dataclass(frozen=True)
class InfillProblem:
    doc_id: str
    prefix: str
    middle: str
    suffix: str


def make_problems(docs: list[Document], n: int, seed: int) -> list[InfillProblem]:
    """One single-line problem from each of up to n documents (those with 3+ non-blank lines)."""
    problems = []
    for doc in sorted(docs, key=lambda d: stable_hash(seed, "infill", d.id)):
        lines = doc.text.splitlines(keepends=True)
        candidates = [i for i, line in enumerate(lines) if line.strip() and 0 < i < len(lines) - 1]
        if len(candidates) < 3:
            continue
        i = random.Random(stable_hash(seed, "infill-line", doc.id)).choice(candidates)
        problems.append(InfillProblem(doc.id, "".join(lines[:i]), lines[i], "".join(lines[i + 1 :])))
        if len(problems) == n:
            break
    return problems


def _prompt(problem: InfillProblem, tokenizer, budget: int) -> list[int]:
    """PSM prompt ids, keeping the prefix's end and the suffix's start when the budget is short."""
    tid = tokenizer.token_to_id
    pre = tokenizer.encode(problem.prefix, add_special_tokens=False).ids
    suf = tokenizer.encode(problem.suffix, add_special_tokens=False).ids
    room = budget - 3
    keep_suf = min(len(suf), room // 2)
    keep_pre = min(len(pre), room - keep_suf)
    keep_suf = min(len(suf), room - keep_pre)
    return ([tid(PREFIX)] + pre[len(pre) - keep_pre :] + [tid(SUFFIX)] + suf[:keep_suf] + [tid(MIDDLE)])


def run_infill(model: GPT, tokenizer, problems: list[InfillProblem]) -> dict:
    stop = frozenset({tokenizer.token_to_id(EOS), tokenizer.token_to_id("<file_sep>")})
    results = []
    for problem in problems:
        prompt = _prompt(problem, tokenizer, model.cfg.seq_len - MAX_MIDDLE_TOKENS)
        out = generate(model, prompt, MAX_MIDDLE_TOKENS, stop_ids=stop, vocab_size=tokenizer.get_vocab_size())
        completion = tokenizer.decode(out, skip_special_tokens=False)
        results.append({"doc_id": problem.doc_id, "expected": problem.middle, "completion": completion,
                        "exact_match": completion.rstrip() == problem.middle.rstrip()})
    solved = sum(r["exact_match"] for r in results)
    return {"problems": len(results), "exact_match": solved / len(results) if results else None,
            "examples": results}
