"""The eval_data stage's 13-gram contamination of each eval set against the training tokens
(kiln.eval.contamination): measured on the data alone, before the model existed.

metrics.json key: contamination ({eval set: {items, contaminated_items, ngram_overlap}}).
"""

from __future__ import annotations

from kiln.eval.context import Context
from kiln.eval.metrics.output import EvalOutput


def measure(ctx: Context) -> EvalOutput:
    return EvalOutput({"contamination": ctx.data.contamination})
