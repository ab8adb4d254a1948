"""lm-eval's batches in the rehearsal (kiln.rehearse.eval_stage): the "kiln" adapter holding a model
the rehearsal built. Its own module so that a rehearsal without lm-eval tasks (and the smoke stage,
which rehearses in-process) does not import lm-eval (~1.3 s)."""

from __future__ import annotations

import torch
from lm_eval.api.model import TemplateLM

from kiln.eval.harness import KilnLM
from kiln.rehearse.eval_stage import EOS_ID


class ModelGiven(KilnLM):
    """The "kiln" lm-eval adapter (kiln.eval.harness: its batching and scoring) holding a given model
    where KilnLM loads one, its rows padded with EOS_ID where KilnLM pads with its tokenizer's EOS
    (no tokenizer exists before the tokenizer stage)."""

    def __init__(self, model: torch.nn.Module, batch_size: int, autocast_factory):
        TemplateLM.__init__(self)
        self.model, self._device = model, next(model.parameters()).device
        self.batch_size, self.autocast = batch_size, autocast_factory

    @property
    def eot_token_id(self) -> int:
        return EOS_ID
