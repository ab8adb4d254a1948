"""eval.lm_eval: the lm-evaluation-harness tasks and how much of each."""

from __future__ import annotations

from typing import ClassVar

from kiln.config.declare import EVAL, EVAL_DATA, OUTPUT, Section, Strings, group, reads, setting


class LmEval(Section):
    """lm-evaluation-harness tasks run on the trained model through the "kiln" model class."""

    KEY: ClassVar[str] = "eval.lm_eval"
    tasks: Strings = setting(
        ("kiln_heldout_perplexity", "kiln_heldout_next_line"),
        """Local tasks (built from the run's own held-out documents, offline: kiln_heldout_perplexity,
        kiln_heldout_next_line; formerly kiln_code_perplexity and kiln_next_line, names still accepted)
        and any lm-eval task name (hellaswag, arc_easy, piqa, wikitext, ...); a task that cannot be
        loaded (no network) is reported as unavailable, not fatal.""",
        reads("eval_data scans the local ones for contamination", eval_data=OUTPUT, eval=OUTPUT),
    )
    limit: int = setting(50, "Examples per task.", EVAL, ge=1)
    max_docs: int = setting(50, "Held-out documents the local tasks are built from.", EVAL_DATA, ge=1)


class Fields(Section):
    lm_eval: LmEval = group(LmEval)
