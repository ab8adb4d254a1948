"""Greedy completions of fixed prompts during training, so a long run shows what its model writes
while it is still going (the run in seed 000 had no such window until it ended).

`make_sampler` returns the callable Trainer.fit runs at every validation step; its rows go to the
console, train/samples.jsonl and wandb.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from kiln.data.tokenizer import load_tokenizer
from kiln.generate.healing import complete


def make_sampler(
    tokenizer_path: Path, prompts: list[str], max_new_tokens: int
) -> Callable[[torch.nn.Module], list[dict]] | None:
    """model -> [{"prompt", "completion"}] for each prompt (greedy with token healing, up to
    max_new_tokens or <|endoftext|>); None when there are no prompts."""
    if not prompts:
        return None
    tokenizer = load_tokenizer(tokenizer_path)

    def sample(model: torch.nn.Module) -> list[dict]:
        texts = complete(model, tokenizer, prompts, max_new_tokens)
        return [{"prompt": p, "completion": t} for p, t in zip(prompts, texts)]

    return sample
