"""Greedy completions of fixed prompts during training, so a long run shows what its model writes
while it is still going (the run in seed 000 had no such window until it ended).

`make_sampler` returns the callable Trainer.fit runs at every validation step; its rows go to the
console, train/samples.jsonl and wandb.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from kiln.data.tokenizer import EOS, load_tokenizer
from kiln.eval.generate import generate


def make_sampler(tokenizer_path: Path, prompts: list[str], max_new_tokens: int) -> Callable[[torch.nn.Module], list[dict]] | None:
    """model -> [{"prompt", "completion"}] for each prompt (greedy, up to max_new_tokens or
    <|endoftext|>); None when there are no prompts."""
    if not prompts:
        return None
    tokenizer = load_tokenizer(tokenizer_path)
    ids = [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
    stop = frozenset({tokenizer.token_to_id(EOS)})

    def sample(model: torch.nn.Module) -> list[dict]:
        new = generate(model, ids, max_new_tokens, stop_ids=stop, vocab_size=tokenizer.get_vocab_size())
        return [{"prompt": p, "completion": tokenizer.decode(n, skip_special_tokens=False)} for p, n in zip(prompts, new)]

    return sample
