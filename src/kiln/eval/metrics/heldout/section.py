"""The held-out loss's settings: the batches it reads, and a figure measured elsewhere to show beside it."""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import OUTPUT, Number, Section, optional, reads, setting

# A reference gives exactly one of these figures.
_FIGURES = ("val_loss", "bits_per_byte")


class Reference(Section):
    """A figure measured elsewhere, shown in the report with where and when, never subtracted from
    the run's: `val_loss` (a published figure, e.g. a seed's target) or `bits_per_byte` on the
    held-out documents (e.g. the plain loop's of bench/quality.py: comparable across tokenizers, not
    across machines), one of the two; `source`, what produced it; `measured_on`, the machine, or a
    publication's run; `date`, YYYY-MM-DD (YYYY-MM for a publication that gives no day)."""

    KEY: ClassVar[str] = "eval.reference"
    val_loss: Number | None = optional("A published validation loss.", gt=0)
    bits_per_byte: Number | None = optional(
        "Bits per byte on the held-out documents, comparable across tokenizers.", gt=0
    )
    source: str = setting(
        description="What produced the figure: the script and its settings, or the publication.", min_length=1
    )
    measured_on: str = setting(
        description="The machine that measured it (a 2-core VM with AMX and AVX-512 BF16), or for a "
        "published figure the run that did (llm.c's GPT-2 124M on 8 GPUs).",
        min_length=1,
    )
    date: str = setting(
        description="When it was measured, or published: YYYY-MM-DD, or YYYY-MM where the publication gives no day.",
        pattern=r"^\d{4}-\d{2}(-\d{2})?$",
    )

    @field_validator("date", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """YAML reads an unquoted 2026-12-06 as a date: kept as the text it was written as."""
        return value.isoformat() if isinstance(value, datetime.date) else value

    @model_validator(mode="before")
    @classmethod
    def _one_figure(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = [key for key in _FIGURES if key in data]
            if len(given) != 1:
                raise PydanticCustomError(
                    "kiln",
                    "give exactly one of val_loss and bits_per_byte (given: {given})",
                    {"given": ", ".join(given) or "neither"},
                )
        return data


class Fields(Section):
    reference: Reference | None = setting(
        None, Reference.__doc__, reads("a figure measured elsewhere, shown beside the run's", report=OUTPUT)
    )
    max_batches: int = setting(
        200,
        "Validation batches for loss, perplexity and bits per byte.",
        reads("the unigram baseline reads the same batches", eval_data=OUTPUT, eval=OUTPUT),
        ge=1,
    )
