"""Completions of fixed prompts during training, so a long run shows what its model writes while it
is still going (the run in seed 000 had no such window until it ended).

Sampled by default (train.samples.temperature, top_p): a small model's greedy text tends to repeat
one line, which says little about what it has learnt. Each call draws from its own generator seeded
with the run's seed, never torch's global one: the global stream is training's (initial weights,
anything else seeded from it), and a draw from it here would change the run. Reseeded at every
call, so a prompt's completion at a step is a function of the model alone, the same in a resumed
run as in one that never stopped. Temperature 0 is greedy. Every row says how it was decoded.

`make_sampler` returns the callable the train stage's validations run (kiln.train.callbacks.Validation),
on every rank, with an `agree` that gives all ranks rank 0's tokens (kiln.generate.decode); its rows go
to the console, train/samples.jsonl and wandb. `train_sampler` is the one train.samples configures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

from kiln.config.train_sections import TrainSection
from kiln.data.tokenizer import load_tokenizer
from kiln.generate.decode import Agree, describe, seeded
from kiln.generate.healing import complete

log = logging.getLogger("kiln")

# What make_sampler makes, and what train's validations and the eval stage call: (model, agree=...) ->
# [{"prompt", "completion", "decoding"}] (agree: kiln.generate.decode)
Sampler = Callable[..., list[dict]]


def make_sampler(
    tokenizer_path: Path,
    prompts: list[str],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Sampler | None:
    """model -> [{"prompt", "completion", "decoding"}] for each prompt (token healing, up to
    max_new_tokens or <|endoftext|>; "decoding" is kiln.generate.decode.describe's label); None when
    there are no prompts."""
    if not prompts:
        return None
    tokenizer = load_tokenizer(tokenizer_path)
    label = describe(temperature, top_p=top_p)
    log.info("samples at each validation: %s, seed %d", label, seed)

    def sample(model: torch.nn.Module, agree: Agree | None = None) -> list[dict]:
        generator = seeded(model, seed) if temperature > 0 else None
        texts = complete(
            model,
            tokenizer,
            prompts,
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            generator=generator,
            agree=agree,
        )
        return [{"prompt": p, "completion": t, "decoding": label} for p, t in zip(prompts, texts)]

    return sample


def train_sampler(tokenizer_path: Path, train: TrainSection) -> Sampler | None:
    """train.samples' prompts and decoding, seeded with train.seed: what the train stage's validations
    and the eval stage sample."""
    samples = train.samples
    return make_sampler(
        tokenizer_path,
        samples.prompts,
        samples.max_new_tokens,
        temperature=samples.temperature,
        top_p=samples.top_p,
        seed=train.seed,
    )
