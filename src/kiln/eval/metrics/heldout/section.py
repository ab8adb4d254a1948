"""The held-out loss's settings: the batches it reads, and a published figure to show beside it."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import model_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import OUTPUT, Number, Section, optional, reads, setting

# A reference gives exactly one of these figures.
_FIGURES = ("val_loss", "bits_per_byte")


class Reference(Section):
    """A figure to show beside the run's in the report and on its loss plot: a published val loss
    (e.g. a seed's target), or bits per byte on the held-out documents (e.g. the plain loop's of
    bench/quality.py, comparable across tokenizers). One of the two."""

    KEY: ClassVar[str] = "eval.reference"
    val_loss: Number | None = optional("A published validation loss to compare the run's with.", gt=0)
    bits_per_byte: Number | None = optional(
        "Bits per byte on the held-out documents, comparable across tokenizers.", gt=0
    )
    source: str = setting(description="Where the figure comes from.", min_length=1)

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
    reference: Reference | None = setting(None, Reference.__doc__, reads("a figure beside the run's", report=OUTPUT))
    max_batches: int = setting(
        200,
        "Validation batches for loss, perplexity and bits per byte.",
        reads("the unigram baseline reads the same batches", eval_data=OUTPUT, eval=OUTPUT),
        ge=1,
    )
