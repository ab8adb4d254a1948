"""Batched autoregressive decoding over a KV cache: greedy or sampled (temperature, top-k, top-p),
each row stopping at its own stop token or after max_new_tokens.

A batch of prompts is left-padded to one width, prefilled in one forward, then decoded one token
per forward over the cache (kiln.model.kv_cache says why the padding cannot change a row's result).
A row that has stopped keeps being fed until every row has (its extra tokens are dropped): a batch
of one shape is simpler than removing rows from the cache, and eval batches stop close together.

The context is the model's training seq_len, which the cache never outgrows (no learned position
or RoPE entry lies past it): a prompt is cropped from the left so that prompt + max_new_tokens
fits, keeping its most recent tokens (and, with `keep_first`, its first one when it is that id: a
BOS every training sample started with), and max_new_tokens is capped at seq_len - 1 so that at
least one prompt token remains.

Nothing in a step waits for the device, so an eager GPU step's kernels are queued while earlier
ones run (kiln.generate.ops counts both): the rows' stops are kept on the device and read every
STOP_CHECK_EVERY tokens (a batch may run up to STOP_CHECK_EVERY - 1 steps past its last stop, their
tokens dropped), and a sample is drawn on the logits' device, from a generator there (`seeded`).

With `agree`, every step's chosen ids pass through it before they are used. Ranks that decode
together under FSDP, where every forward is a collective, pass one that hands every rank rank 0's
ids (kiln.train.distributed.same_on_every_rank): a rank that stopped a step before another would
leave it waiting in a forward it never joins.
"""

from __future__ import annotations

from typing import Callable

import torch

from kiln.model.kv_cache import KVCache

Agree = Callable[[torch.Tensor], torch.Tensor]  # a step's ids (B,) -> the ids every rank uses
# Tokens between reads of whether every row has stopped: each read makes the host wait for the
# device; a batch stopping between two reads runs on at most this many steps less one.
STOP_CHECK_EVERY = 16


def seeded(model: torch.nn.Module, seed: int) -> torch.Generator:
    """A generator on the model's device seeded with `seed`, for generate()'s sampling: the same seed
    draws the same samples on the same kind of device. A CUDA generator (Philox) draws other numbers
    than a CPU's (Mersenne Twister), so a GPU's samples differ from a CPU's at the same seed."""
    return torch.Generator(device=next(model.parameters()).device).manual_seed(seed)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    stop_ids: frozenset[int] = frozenset(),
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    keep_stop: bool = False,
    batch_size: int | None = None,
    first_allowed: list[list[int] | None] | None = None,
    agree: Agree | None = None,
    keep_first: int | None = None,
) -> list[list[int]]:
    """New token ids after each prompt, each list ending before its first stop token (or with it,
    if keep_stop). temperature 0 means greedy; otherwise sampling from the temperature-scaled
    distribution cut to its top_k ids, then to the fewest ids holding top_p of the mass.
    vocab_size restricts choices to the tokenizer's real ids (the embedding is padded past them).
    first_allowed (one entry per prompt, None for no limit) restricts each row's first new token
    to the ids listed, as token healing needs (kiln.generate.healing). keep_first: an id (the
    tokenizer's BOS) that a prompt cropped to the context keeps at its start when it began with it.
    Prompts are decoded batch_size at a time (all at once when None), grouped by length so a
    batch holds little padding; the results are in the prompts' order."""
    if max_new_tokens < 1 or any(not p for p in prompts):
        raise ValueError("generate needs max_new_tokens >= 1 and at least one token in every prompt")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    size = batch_size or max(len(prompts), 1)
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        allowed = [first_allowed[i] for i in chunk] if first_allowed is not None else None
        rows = _decode(
            model,
            [prompts[i] for i in chunk],
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop_ids=stop_ids,
            vocab_size=vocab_size,
            generator=generator,
            first_allowed=allowed,
            agree=agree,
            keep_first=keep_first,
        )
        for i, row in zip(chunk, rows):
            out[i] = _until_stop(row, stop_ids, keep_stop)
    return out


def _crop(prompt: list[int], room: int, keep_first: int | None) -> list[int]:
    """The prompt's last `room` ids; keep_first stays first if the prompt began with it."""
    if len(prompt) <= room:
        return prompt
    if keep_first is not None and prompt[0] == keep_first and room > 1:
        return [keep_first, *prompt[len(prompt) - room + 1 :]]
    return prompt[-room:]


def _decode(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float,
    stop_ids: frozenset[int],
    vocab_size: int | None,
    generator: torch.Generator | None,
    first_allowed: list[list[int] | None] | None,
    agree: Agree | None,
    keep_first: int | None,
) -> list[list[int]]:
    """max_new_tokens ids per prompt, or fewer once every row has produced a stop id (read every
    STOP_CHECK_EVERY tokens: a row may run past its stop, and generate() cuts it there)."""
    device = next(model.parameters()).device
    context = model.config.seq_len
    max_new = min(max_new_tokens, context - 1)
    prompts = [_crop(p, context - max_new, keep_first) for p in prompts]
    width = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), width, dtype=torch.long)  # pad id 0: masked out, any id would do
    for b, p in enumerate(prompts):
        idx[b, width - len(p) :] = torch.tensor(p)
    # The last new token is never fed back, so the cache needs one slot fewer than the full rows.
    cache = KVCache.for_model(model, [width - len(p) for p in prompts], width + max_new - 1)
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    stopped = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    logits, _ = model(idx.to(device), cache=cache)  # (B, 1, V)
    new = []
    for step in range(max_new):
        scores = logits[:, -1, :vocab_size].float()  # (B, V)
        if step == 0 and first_allowed is not None:
            scores = _restrict(scores, first_allowed)
        next_id = pick(scores, temperature, top_k, top_p, generator)  # (B,)
        if agree is not None:  # the same ids, so the same stop, on every rank
            next_id = agree(next_id)
        new.append(next_id)
        if step == max_new - 1:
            break
        if stop_ids:  # kept on the device; bool() waits for it, so only every STOP_CHECK_EVERY tokens
            # (B, S) compared, not torch.isin: past ~15 stop ids for 16 rows isin sorts, through a
            # unique() whose size depends on the data (a host sync)
            stopped |= (next_id[:, None] == stops).any(dim=-1)
            if (step + 1) % STOP_CHECK_EVERY == 0 and bool(stopped.all()):
                break
        logits, _ = model(next_id[:, None], cache=cache)
    return torch.stack(new, dim=1).tolist()


def _restrict(scores: torch.Tensor, allowed: list[list[int] | None]) -> torch.Tensor:
    """scores (B, V) with every id outside row b's allowed list set to -inf (rows with None kept)."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    for b, ids in enumerate(allowed):
        if ids is not None:
            keep[b] = False
            keep[b, torch.tensor(ids, dtype=torch.long, device=scores.device)] = True
    return scores.masked_fill(~keep, float("-inf"))


def pick(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Next id (B,) from logits (B, V): the argmax when temperature is 0, else a sample drawn on the
    logits' device from `generator`, which must be there (`seeded`)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p < 1.0:
        # Nucleus: drop an id once the ids ranked above it already hold top_p of the mass; the most
        # likely id always stays. (At top_p 1 nothing is dropped, and rounding could drop the tail.)
        sorted_probs, ranked = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p  # (B, V) by rank
        probs = probs.masked_fill(drop.scatter(-1, ranked, drop), 0.0)  # multinomial renormalises
    if generator is not None and generator.device.type != probs.device.type:
        raise ValueError(f"a {generator.device} generator samples {probs.device} logits: make it there (seeded)")
    # torch.multinomial's own draw of one sample (the argmax of p / Exp(1) noise, an exponential race:
    # id i wins with probability p_i), the same ids from the same generator, without its check of the
    # probabilities, which reads a scalar back from the device every token.
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)  # (B, V)
    return (probs / noise).argmax(dim=-1)


def _until_stop(row: list[int], stop_ids: frozenset[int], keep_stop: bool) -> list[int]:
    for i, token in enumerate(row):
        if token in stop_ids:
            return row[: i + 1] if keep_stop else row[:i]
    return row


def describe(temperature: float, top_k: int | None = None, top_p: float = 1.0) -> str:
    """How a completion was decoded, for whoever reads it beside others: "greedy" (what exact-match
    metrics need: one answer per prompt) or "sampled (temperature T, top-p P)" (what a model
    writes; greedy text of a small model tends to loop on one line). pick()'s arguments."""
    if temperature == 0.0:
        return "greedy"
    cut = f"top-k {top_k}, " if top_k is not None else ""
    return f"sampled (temperature {temperature:g}, {cut}top-p {top_p:g})"
