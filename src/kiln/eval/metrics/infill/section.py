"""How many held-out documents the infilling problems are made from."""

from __future__ import annotations

from kiln.config.declare import EVAL_DATA, Section, setting


class Fields(Section):
    infill_docs: int = setting(
        50,
        """Held-out documents turned into infilling problems (one single-line and one multi-line span
        each, prompted in PSM and SPM). Not run for a model trained without FIM (no train document
        FIM-transformed, e.g. pretokenize.fim.rate 0, and no train.init_from): the report says so.""",
        EVAL_DATA,
        ge=0,
    )
