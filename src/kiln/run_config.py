"""A run's config as the pipeline uses it: resolved from the files given (kiln.config.resolve),
validated against the schema, then checked against what only the layers above the config know: the
model registry (a flavour's shape, heads dividing d_model), the batch plan (the global batch a whole
number of micro-batches on every rank) and the tokenizer (a vocabulary holding the special tokens).

The Snakefile, `kiln plan` and every stage script run by hand with --config call this module, so a
config means the same thing wherever it is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from kiln import config as kiln_config
from kiln.config import ConfigError
from kiln.data.special_tokens import BYTE_ALPHABET, SMALLEST_VOCAB, SPECIAL_TOKENS
from kiln.errors import KilnError
from kiln.model.registry import check_section as check_model_section
from kiln.train.plan import plan_batch


def _cross_layer_problems(cfg: dict) -> list[str]:
    problems = check_model_section(cfg["model"], cfg["shard"]["seq_len"])
    vocab = cfg["tokenizer"].get("vocab_size", SMALLEST_VOCAB)  # only a trained tokenizer has one
    if vocab < SMALLEST_VOCAB:
        problems.append(
            f"tokenizer.vocab_size: {vocab} is smaller than the {SMALLEST_VOCAB} tokens every vocabulary holds "
            f"({BYTE_ALPHABET} byte symbols + {len(SPECIAL_TOKENS)} special tokens)"
        )
    train = cfg["train"]
    try:
        world = train["nproc_per_node"] * train["nnodes"]
        plan_batch(train["batch_tokens"], train["micro_batch"], cfg["shard"]["seq_len"], world)
    except KilnError as exc:
        problems.append(str(exc))
    return problems


def validate(raw: dict) -> dict:
    """A validated copy of `raw` with every default filled in, or a ConfigError listing each problem
    by its key path."""
    cfg = kiln_config.validate(raw)
    problems = _cross_layer_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return cfg


def resolve(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> dict:
    """The validated config of `snakemake --configfile F... --config K=V...` (no files: the embedded
    default)."""
    return validate(kiln_config.resolve(configfiles, overrides))


def load(path: str | Path) -> dict:
    """One run file, validated: what `snakemake --configfile path` runs."""
    return resolve([path])
