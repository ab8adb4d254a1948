"""The eval stage's section, each setting declared once (kiln.config.declare)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import (
    EVAL,
    EVAL_DATA,
    OUTPUT,
    Number,
    Prompts,
    Section,
    Strings,
    group,
    optional,
    reads,
    setting,
)

InfillKind = Literal["single_line", "multi_line", "random_span"]
FimMode = Literal["psm", "spm"]  # as kiln.data.fim lays a FIM example out

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


class HumanEvalSection(Section):
    """HumanEval (Chen et al. 2021, arXiv 2107.03374): the model completes each problem's prompt, the
    completion is cut at the paper's stop sequences and run with the problem's unit tests in a sandbox
    (kiln.eval.sandbox), never in the eval process. Greedy decoding gives a cheap pass@1 to follow; the
    paper's protocol is n=200 samples per problem at top-p 0.95, T=0.2 for pass@1 and T=0.8 for
    pass@10/100 (samples). The report prints published figures beside."""

    KEY: ClassVar[str] = "eval.humaneval"
    problems: int | None = setting(
        4, "The first N of the 164 problems; 0 skips HumanEval, null (or 164) runs all.", EVAL, ge=0, le=164
    )
    samples: int = setting(
        0,
        """Sampled completions per problem at each of the paper's temperatures (top-p 0.95): n at T=0.2
        for pass@1 and n at T=0.8 for pass@10 and pass@100 (each k <= n). 0 runs greedy decoding only;
        the paper's n is 200.""",
        EVAL,
        ge=0,
    )
    max_new_tokens: int = setting(128, "Tokens per completion.", EVAL, ge=1)


class HumanEvalInfillSection(Section):
    """HumanEval-Infilling (Bavarian et al. 2022, arXiv 2207.14255): a span of a canonical solution is
    removed and the model writes it back between prefix and suffix (greedy, in each FIM mode); the
    program is run with the unit tests in a sandbox: pass@1 per kind and mode, beside exact match and
    edit similarity. The paper's pass@1 is from 100 samples per task at T=0.2. Not run for a model
    trained without FIM (as eval.infill_docs)."""

    KEY: ClassVar[str] = "eval.humaneval_infill"
    problems: int = setting(2, "The tasks of the first N problems (0 skips infilling).", EVAL, ge=0, le=164)
    kinds: tuple[InfillKind, ...] = setting(
        ("single_line",),
        """Task kinds: single_line (one task per non-blank line), multi_line (one per pair of non-blank
        lines: many), random_span (10 per problem).""",
        EVAL,
        strict=False,  # a YAML list
        min_length=1,
    )
    modes: tuple[FimMode, ...] = setting(
        ("psm", "spm"),
        "FIM prompt layouts, as Kiln trains them (kiln.data.fim).",
        EVAL,
        strict=False,  # a YAML list
        min_length=1,
    )
    max_new_tokens: int = setting(64, "Tokens per middle.", EVAL, ge=1)

    @field_validator("kinds", "modes")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Each is run once: a repeat would only run (and count) the same tasks again.
        repeated = sorted({item for item in value if value.count(item) > 1})
        if repeated:
            # The error's path names the key (eval.humaneval_infill.kinds).
            raise PydanticCustomError("kiln", "repeats {repeated}: list each once", {"repeated": ", ".join(repeated)})
        return value


class EvalSection(Section):
    KEY: ClassVar[str] = "eval"
    reference: Reference | None = setting(None, Reference.__doc__, reads("a figure beside the run's", report=OUTPUT))
    max_batches: int = setting(
        200,
        "Validation batches for loss, perplexity and bits per byte.",
        reads("the unigram baseline reads the same batches", eval_data=OUTPUT, eval=OUTPUT),
        ge=1,
    )
    prompts: Prompts = setting(
        ("import os\n", "def fibonacci(n):\n", "class Stack:\n"),
        """Completed greedily and sampled at eval, with token healing (a prompt may end mid-token, e.g. in
        a newline the model learnt merged with the next line's indentation).""",
        EVAL,
    )
    max_new_tokens: int = setting(64, "Tokens per completion of eval.prompts.", EVAL, ge=1)
    temperature: Number = setting(0.8, "Sampling temperature of eval.prompts' sampled completions.", EVAL, gt=0)
    top_k: int = setting(50, "The sampled completions draw from the top_k most likely tokens.", EVAL, ge=1)
    top_p: Number = setting(
        1.0,
        """Nucleus sampling for the sampled completions: after top_k, keep the fewest most likely tokens
        holding this share of the probability; 1 keeps them all.""",
        EVAL,
        gt=0,
        le=1,
    )
    infill_docs: int = setting(
        50,
        """Held-out documents turned into infilling problems (one single-line and one multi-line span
        each, prompted in PSM and SPM). Not run for a model trained without FIM (no train document
        FIM-transformed, e.g. pretokenize.fim.rate 0, and no train.init_from): the report says so.""",
        EVAL_DATA,
        ge=0,
    )
    lm_eval: LmEval = group(LmEval)
    humaneval: HumanEvalSection = group(HumanEvalSection)
    humaneval_infill: HumanEvalInfillSection = group(HumanEvalInfillSection)
