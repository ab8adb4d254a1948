"""Each of eval.prompts continued greedily and sampled (every prompt in one batch per mode), with token
healing (kiln.generate.healing); the sampled ones draw from a generator seeded with the run's seed.

samples.json keys: completions ([{prompt, greedy, sampled}]), decoding (how each was decoded, which
the report labels them with).
"""

from __future__ import annotations

from kiln.config.eval_sections import EvalSection
from kiln.eval.context import Context
from kiln.eval.metrics.output import EvalOutput
from kiln.generate.decode import describe, seeded
from kiln.generate.healing import complete


def measure(ctx: Context) -> EvalOutput:
    return EvalOutput(
        samples={"completions": completions(ctx.model, ctx.tokenizer, ctx.cfg, ctx.seed), "decoding": decoding(ctx.cfg)}
    )


def completions(model, tokenizer, cfg: EvalSection, seed: int) -> list[dict]:
    generator = seeded(model, seed)
    out = [{"prompt": prompt} for prompt in cfg.prompts]
    for name, temperature in (("greedy", 0.0), ("sampled", cfg.temperature)):
        texts = complete(
            model,
            tokenizer,
            cfg.prompts,
            cfg.max_new_tokens,
            temperature=temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            generator=generator,
        )
        for row, text in zip(out, texts):
            row[name] = text
    return out


def decoding(cfg: EvalSection) -> dict[str, str]:
    """completions()'s rows' keys -> how each was decoded (kiln.generate.decode.describe)."""
    return {"greedy": describe(0.0), "sampled": describe(cfg.temperature, cfg.top_k, cfg.top_p)}
