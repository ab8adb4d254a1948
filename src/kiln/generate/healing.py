"""Prompts as text in, completions as text out, with token healing.

A BPE tokenizer cuts a prompt where it ends, not where training text usually breaks: "def f(n):\n"
ends in a lone newline token, while in training the newline and the next line's indentation are
one token ("\n   "), so after the lone token the model has mostly seen blank lines and writes
newlines. Token healing (Guidance; transformers' `token_healing`) drops the prompt's last token and
lets the first new token be any token that starts with its text, so the model picks the boundary
it learnt. The healed text is taken off the front of the completion again.

A prompt is read from its start, so it starts with the tokenizer's BOS when it has one (a Llama
source's: kiln.data.tokenizer.with_bos), as every training sample did; healing leaves it alone.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from kiln.data.tokenizer import EOS, bos_id, role_id, with_bos
from kiln.generate.decode import Agree, generate


def heal(tokenizer: Tokenizer, ids: list[int]) -> tuple[list[int], list[int] | None, str]:
    """(prompt ids without the last token, the ids whose token starts with that token's text, the
    text taken off). A one-token prompt or one ending in a special token is left whole (None, "")."""
    specials = set(tokenizer.get_added_tokens_decoder())
    if len(ids) < 2 or ids[-1] in specials:
        return ids, None, ""
    last = tokenizer.id_to_token(ids[-1])
    allowed = sorted(i for token, i in tokenizer.get_vocab(with_added_tokens=False).items() if token.startswith(last))
    return ids[:-1], allowed, tokenizer.decode([ids[-1]], skip_special_tokens=False)


def complete(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    agree: Agree | None = None,
) -> list[str]:
    """The text each prompt continues with (up to <|endoftext|> or max_new_tokens, the healed token
    counting as one), decoded in one batch."""
    healed = [heal(tokenizer, with_bos(tokenizer, tokenizer.encode(p, add_special_tokens=False).ids)) for p in prompts]
    new = generate(
        model,
        [ids for ids, _, _ in healed],
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_ids=frozenset({role_id(tokenizer, EOS)}),
        vocab_size=tokenizer.get_vocab_size(),
        generator=generator,
        first_allowed=[allowed for _, allowed, _ in healed],
        agree=agree,
        keep_first=bos_id(tokenizer),
    )
    out = []
    for (_, _, cut), row in zip(healed, new):
        text = tokenizer.decode(row, skip_special_tokens=False)
        out.append(text[len(cut) :] if text.startswith(cut) else text)
    return out
