"""Which of the eval stage's batches a run's config turns on, from the config alone: the one answer the
rehearsal's eval phases (kiln.rehearse.eval_stage) and its rule's params (kiln.config.settings.derived,
so a switch flipped reruns the rehearsal) both take.

The eval stage decides infilling later, from what its data holds (kiln.eval.infill.not_run_reason: the
token folder's FIM-transformed documents, the tokenizer's FIM tokens); before any data exists the
config says only whether it may: a run that trains with FIM or starts from a checkpoint. Where the
stage then finds no FIM (no document FIM-transformed, a tokenizer without the tokens) it runs fewer
batches than named here: a batch rehearsed and skipped costs the rehearsal's CPU, a batch run and not
rehearsed would be a card the rehearsal never checked. It runs more only on a token folder older than
the record of FIM-transformed documents (meta.json's fim_modes), which cannot say, and is measured.
"""

from __future__ import annotations

from typing import Mapping

HELD_OUT, INFILLING, LM_EVAL, HUMANEVAL, HUMANEVAL_INFILL = (
    "held_out",
    "infilling",
    "lm_eval",
    "humaneval",
    "humaneval_infill",
)


def fim_trained(cfg: Mapping) -> bool:
    """Whether the eval stage may infill, from the whole config: FIM in training (pretokenize.fim.rate
    above 0) or a start from a checkpoint (train.init_from), whose source may have seen FIM."""
    return cfg["pretokenize"]["fim"]["rate"] > 0 or cfg["train"].get("init_from") is not None


def eval_batches_on(cfg: Mapping) -> list[str]:
    """The eval stage's batches the whole, validated config `cfg` turns on, in the suite's order: the
    held-out loss always; infilling for a FIM-trained run with eval.infill_docs; lm-eval with
    eval.lm_eval.tasks; HumanEval with eval.humaneval.problems not 0 (null is every problem);
    HumanEval-Infilling for a FIM-trained run with eval.humaneval_infill.problems not 0."""
    ev, fim = cfg["eval"], fim_trained(cfg)
    on = {
        HELD_OUT: True,
        INFILLING: fim and ev["infill_docs"] > 0,
        LM_EVAL: bool(ev["lm_eval"]["tasks"]),
        HUMANEVAL: ev["humaneval"]["problems"] != 0,
        HUMANEVAL_INFILL: fim and ev["humaneval_infill"]["problems"] != 0,
    }
    return [name for name, switched_on in on.items() if switched_on]
