"""Autoregressive decoding: greedy or sampled (temperature, top-k), stopping at a stop token.

Each step reruns the model on the last seq_len tokens (no KV cache yet): simple and exact, and cheap
at the sizes the eval stage decodes.
"""

from __future__ import annotations

import torch

from kiln.model.gpt import GPT


@torch.no_grad()
def generate(model: GPT, prompt: list[int], max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, stop_ids: frozenset[int] = frozenset(),
             vocab_size: int | None = None, generator: torch.Generator | None = None,
             keep_stop: bool = False) -> list[int]:
    """New token ids after `prompt`, up to a stop token (included only if keep_stop). temperature 0
    means greedy. vocab_size restricts choices to the tokenizer's real ids (the embedding is padded
    past them)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits, _ = model(ids[:, -model.cfg.seq_len :])
        logits = logits[0, -1, :vocab_size].float()  # (V,)
        if temperature == 0.0:
            next_id = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            next_id = int(torch.multinomial(probs, 1, generator=generator))
        if next_id in stop_ids:
            if keep_stop:
                out.append(next_id)
            break
        out.append(next_id)
        ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)
    return out
