"""The eval stage's section: the keys of every registered eval metric (kiln.eval.metrics.registry), each
declared once in its metric's section.py (kiln.config.declare), gathered in registration order."""

from __future__ import annotations

from typing import ClassVar

from pydantic import create_model

from kiln.config.declare import Section
from kiln.errors import KilnError
from kiln.eval.metrics import registry


def _fields() -> dict:
    """{key: (type, field)} of every metric's Fields, in registration order; a key two metrics
    declare is an error naming both."""
    fields, owner = {}, {}
    for metric in registry.metrics():
        if metric.section is None:
            continue
        for key, info in metric.section.Fields.model_fields.items():
            if key in fields:
                raise KilnError(f"eval.{key} is declared by two eval metrics: {owner[key]} and {metric.name}")
            fields[key], owner[key] = (info.annotation, info), metric.name
    return fields


class _Eval(Section):
    KEY: ClassVar[str] = "eval"


EvalSection = create_model("EvalSection", __base__=_Eval, __module__=__name__, **_fields())
