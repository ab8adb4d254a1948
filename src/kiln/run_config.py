"""A run's config as the pipeline uses it: resolved from the files given (kiln.config.raw_config),
validated against the schema, then checked against what only the layers above the config know: the
model registry (a flavour's shape, heads dividing d_model), the batch plan (the global batch a whole
number of micro-batches on every rank) and the tokenizer (a vocabulary holding the special tokens).

The Snakefile, `kiln plan` and every stage script run by hand with --config call this module, so a
config means the same thing wherever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from kiln import config as kiln_config
from kiln import layout, sweep
from kiln.config import ConfigError
from kiln.data.special_tokens import BYTE_ALPHABET, SMALLEST_VOCAB, SPECIAL_TOKENS
from kiln.errors import KilnError
from kiln.model.registry import check_section as check_model_section
from kiln.plan.steps import plan_batch


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
    every, period = train["keep_checkpoint_every"], train["checkpoint_every"]
    if every % period:
        problems.append(
            f"train.keep_checkpoint_every: {every} is not a multiple of train.checkpoint_every={period}, "
            f"so no checkpoint would fall on it (e.g. {max(1, every // period) * period})"
        )
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
    return validate(kiln_config.raw_config(configfiles, overrides))


@dataclass(frozen=True)
class Experiment:
    """What one `snakemake` call runs: a single run, or the arms of a sweep (kiln.sweep)."""

    name: str  # the config's run_name: the run's, or the sweep's (its overlay report's folder)
    sweep: dict | None  # the config's sweep section, None for a single run
    runs: dict[str, dict]  # {run name: validated config}


def resolve_experiment(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> Experiment:
    """The runs of `snakemake --configfile F... --config K=V...`: one, or one per arm of the config's
    sweep, each validated on its own (an arm's problems are named with the arm)."""
    raw = kiln_config.raw_config(configfiles, overrides)
    spec = raw.get(sweep.SWEEP)
    if spec is not None and not isinstance(spec, dict):
        raise ConfigError(
            f"sweep: expected a mapping of dotted keys to lists (and/or variants), got {type(spec).__name__}"
        )
    if not spec:
        cfg = validate({k: v for k, v in raw.items() if k != sweep.SWEEP})
        layout.check_run_name(cfg["run_name"])
        return Experiment(cfg["run_name"], None, {cfg["run_name"]: cfg})
    if not isinstance(raw.get("run_name"), str):
        raise ConfigError("run_name: a sweep needs a run_name (its arms are <run_name>-<arm>)")
    runs = {}
    for run, arm in sweep.expand(raw).items():
        try:
            runs[run] = validate(arm)
        except ConfigError as exc:
            raise ConfigError(f"sweep arm {run}: {exc}") from None
    for run in [raw["run_name"], *runs]:
        layout.check_run_name(run)
    return Experiment(raw["run_name"], spec, runs)


def load(path: str | Path) -> dict:
    """One run file, validated: what `snakemake --configfile path` runs. A sweep is several runs: an
    error naming them (a stage run by hand takes one arm's settings)."""
    spec = kiln_config.read_yaml(path).get(sweep.SWEEP)
    if spec:
        arms = list(sweep.arm_overrides(spec))
        raise ConfigError(
            f"{path}: a sweep of {len(arms)} runs ({', '.join(arms)}); a stage run by hand takes "
            "one run's config: write that arm's settings to a file"
        )
    return resolve([path])
