"""How an infilled middle is scored, the held-out infilling's and HumanEval-Infilling's alike, and the
prompt layouts both use: torch-free, so that `kiln plan` can count HumanEval-Infilling's tasks
(kiln.eval.sizes) without importing the model."""

from __future__ import annotations

import difflib

LAYOUTS = ("psm", "spm")  # the FIM prompt layouts Kiln trains (kiln.data.fim)


def edit_similarity(a: str, b: str) -> float:
    """difflib's ratio: 1.0 for identical strings."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def match_scores(completion: str, expected: str) -> dict[str, float | bool]:
    """Exact match and edit similarity of a middle, both up to trailing whitespace."""
    got, want = completion.rstrip(), expected.rstrip()
    return {"exact_match": got == want, "edit_similarity": edit_similarity(got, want)}
