"""The completions' prompts and how they are decoded."""

from __future__ import annotations

from kiln.config.declare import EVAL, Number, Prompts, Section, setting


class Fields(Section):
    prompts: Prompts = setting(
        ("import os\n", "def fibonacci(n):\n", "class Stack:\n"),
        """Completed greedily and sampled at eval, with token healing (a prompt may end mid-token, e.g. in
        a newline the model learnt merged with the next line's indentation).""",
        EVAL,
    )
    max_new_tokens: int = setting(64, "Tokens per completion of eval.prompts.", EVAL, ge=1)
    temperature: Number = setting(0.8, "Sampling temperature of eval.prompts' sampled completions.", EVAL, gt=0)
    top_k: int = setting(50, "The sampled completions draw from the top_k most likely tokens.", EVAL, ge=1)
    top_p: Number = setting(
        1.0,
        """Nucleus sampling for the sampled completions: after top_k, keep the fewest most likely tokens
        holding this share of the probability; 1 keeps them all.""",
        EVAL,
        gt=0,
        le=1,
    )
