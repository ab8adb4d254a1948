"""eval.humaneval and eval.humaneval_infill: how much of each benchmark, and how it is decoded."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import EVAL, OUTPUT, RUN, Number, Section, group, reads, setting

InfillKind = Literal["single_line", "multi_line", "random_span"]
FimMode = Literal["psm", "spm"]  # as kiln.data.fim lays a FIM example out
# "auto": a size that follows from where the eval runs and what the run costs (kiln.eval.sizes)
Auto = Literal["auto"]
Problems = Annotated[int, Field(ge=0, le=164)]


class HumanEvalSection(Section):
    """HumanEval (Chen et al. 2021, arXiv 2107.03374): the model completes each problem's prompt, the
    completion is cut at the paper's stop sequences and run with the problem's unit tests in a sandbox
    (kiln.eval.sandbox), never in the eval process. Greedy decoding gives a cheap pass@1 to follow; the
    paper's protocol is n=200 samples per problem at top-p 0.95, T=0.2 for pass@1 and T=0.8 for
    pass@10/100 (samples). The report prints published figures beside."""

    KEY: ClassVar[str] = "eval.humaneval"
    problems: Problems | None | Auto = setting(
        "auto",
        """The first N of the 164 problems; 0 skips HumanEval, null (or 164) runs all; auto: 4 on a CPU,
        all 164 on a GPU.""",
        EVAL,
    )
    samples: Annotated[int, Field(ge=0)] | Auto = setting(
        "auto",
        """Sampled completions per problem at each of the paper's temperatures (top-p 0.95): n at T=0.2
        for pass@1 and n at T=0.8 for pass@10 and pass@100 (each k <= n). 0 runs greedy decoding only;
        the paper's n is 200. auto: 0 on a CPU; on a GPU the largest of 200, 100, 50, 20 and 10 whose
        eval `kiln plan` prices within samples_share of the train stage (else 0).""",
        EVAL,
    )
    samples_share: Number = setting(
        0.05,
        """What samples: auto may spend: the whole eval's predicted time at most this share of the
        train stage's (both as `kiln plan` predicts them from plan.gpu and plan.mfu).""",
        EVAL,
        gt=0,
    )
    max_new_tokens: int = setting(128, "Tokens per completion.", EVAL, ge=1)


class HumanEvalInfillSection(Section):
    """HumanEval-Infilling (Bavarian et al. 2022, arXiv 2207.14255): a span of a canonical solution is
    removed and the model writes it back between prefix and suffix (greedy, in each FIM mode); the
    program is run with the unit tests in a sandbox: pass@1 per kind and mode, beside exact match and
    edit similarity. The paper's pass@1 is from 100 samples per task at T=0.2. Not run for a model
    trained without FIM (as eval.infill_docs)."""

    KEY: ClassVar[str] = "eval.humaneval_infill"
    problems: Problems | Auto = setting(
        "auto", "The tasks of the first N problems (0 skips infilling); auto: 2 on a CPU, all 164 on a GPU.", EVAL
    )
    kinds: tuple[InfillKind, ...] = setting(
        ("single_line", "multi_line", "random_span"),
        """Task kinds: single_line (one task per non-blank line), multi_line (one per pair of non-blank
        lines: many), random_span (10 per problem).""",
        EVAL,
        strict=False,  # a YAML list
        min_length=1,
    )
    tasks_per_kind: Annotated[int, Field(ge=1)] | None | Auto = setting(
        "auto",
        """At most N tasks of each kind, the same in every run, spread over the problems
        (kiln.eval.humaneval_infill.subset): every kind is scored for a few seconds, not multi_line's
        dozens of tasks a problem. null scores every task of the problems, as published figures do.
        auto: 8 on a CPU, null on a GPU.""",
        EVAL,
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


# metrics.jsonl's keys for the in-loop eval (kiln.eval.in_loop writes them, kiln.report.run plots them)
IN_LOOP_PASS_AT_1, IN_LOOP_SECONDS = "humaneval_pass@1", "in_loop_eval_s"
IN_LOOP = reads("logged beside the loss; the weights and the data order do not change", train=RUN)
# The smoke stage probes the sandbox when the in-loop eval is on (workflow/scripts/smoke.py): a run whose
# programs cannot be confined stops before smoke's probe, not at train's start. Read to run: the probe's
# result is only a line of smoke's report, and rerunning smoke's GPU probe for a new `every` would buy
# nothing (turned on after smoke ran, the train stage's own refusal still comes before its first step).
IN_LOOP_EVERY = reads(
    "logged beside the loss; the weights and the data order do not change; smoke probes the sandbox when on;"
    " the rehearsal adds the decode's phase",
    smoke=RUN,
    train=RUN,
    rehearse=OUTPUT,
)


class InLoopSection(Section):
    """HumanEval during training (kiln.eval.in_loop): at the validations of every `every` steps, and at
    the last step, the training ranks' model completes the first `problems` HumanEval problems greedily;
    rank 0 runs the programs in the sandbox and logs pass@1 (humaneval_pass@1) and the seconds it took
    (in_loop_eval_s) beside the validation loss: metrics.jsonl, W&B, the report's plot. Its time is
    the train stage's (a budget counts it); `kiln plan` prices it. Off by default."""

    KEY: ClassVar[str] = "eval.in_loop"
    every: int = setting(
        0, "Steps between in-loop evals, a multiple of train.eval_every; 0 turns them off.", IN_LOOP_EVERY, ge=0
    )
    problems: Problems = setting(20, "The first N HumanEval problems, each completed once, greedily.", IN_LOOP, ge=1)
    max_new_tokens: int = setting(128, "Tokens per completion.", IN_LOOP, ge=1)


class Fields(Section):
    in_loop: InLoopSection = group(InLoopSection)
    humaneval: HumanEvalSection = group(HumanEvalSection)
    humaneval_infill: HumanEvalInfillSection = group(HumanEvalInfillSection)
