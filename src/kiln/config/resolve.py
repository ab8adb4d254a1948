"""A run's config, resolved once: the files and overrides (kiln.config.files), every default the
schema gives (kiln.config.schema), every rule between keys (kiln.config.rules), and what is derived:
train.seed defaults to the data seed, and a run continuing a Hugging Face checkpoint (train.init_from:
{hf: FOLDER}) has the checkpoint's shape as its model section (kiln.config.hf_source). The Snakefile,
`kiln plan`, every stage script run by hand, the benches and the tests call this module, so a config
means the same thing wherever it is read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from kiln.config import hf_source, rules, schema, settings, sweep
from kiln.config.files import merge, raw_config, read_yaml
from kiln.config.models import ModelConfigError
from kiln.errors import ConfigError, KilnError


def validate(raw: dict) -> dict:
    """A validated copy of `raw` with every default filled in, or a ConfigError listing each problem
    by its key path."""
    if not isinstance(raw, dict):
        raise ConfigError(f"<root>: expected a mapping of config sections, got {type(raw).__name__}")
    cfg = copy.deepcopy(raw)
    problems = _model_from_source(cfg) or schema.check(cfg) or rules.check(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    if cfg["train"]["seed"] is None:  # the model seed defaults to the data seed
        cfg["train"]["seed"] = cfg["seed"]
    return cfg


def _model_from_source(cfg: dict) -> list[str]:
    """With train.init_from: {hf: FOLDER}, set cfg's model section to FOLDER's config.json shape (the
    section may be left out; what it says must agree: kiln.config.hf_source.model_section). Before the
    schema, which then checks the derived section as any other; a malformed train or model section
    is left to it."""
    train = cfg.get("train")
    init = train.get("init_from") if isinstance(train, dict) else None
    section = cfg.get("model")
    if not isinstance(init, dict) or not isinstance(init.get("hf"), str) or not isinstance(section, (dict, type(None))):
        return []
    try:
        cfg["model"] = hf_source.model_section(Path(init["hf"]), section)
    except ModelConfigError as exc:
        return exc.problems
    except KilnError as exc:
        return [f"train.init_from.hf: {exc}"]
    return []


def resolve(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> dict:
    """The validated config of `snakemake --configfile F... --config K=V...` (no files: the embedded
    default)."""
    return validate(raw_config(configfiles, overrides))


@dataclass(frozen=True)
class Experiment:
    """What one `snakemake` call runs: a single run, or the arms of a sweep (kiln.config.sweep)."""

    name: str  # the config's run_name: the run's, or the sweep's (its overlay report's folder)
    sweep: dict | None  # the config's sweep section, None for a single run
    runs: dict[str, dict]  # {run name: validated config}


def resolve_experiment(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> Experiment:
    """The runs of `snakemake --configfile F... --config K=V...`: one, or one per arm of the config's
    sweep, each validated on its own (an arm's problems are named with the arm)."""
    raw = raw_config(configfiles, overrides)
    spec = raw.get(sweep.SWEEP)
    if spec is not None and not isinstance(spec, dict):
        raise ConfigError(
            f"sweep: expected a mapping of dotted keys to lists (and/or variants), got {type(spec).__name__}"
        )
    if not spec:
        cfg = validate({k: v for k, v in raw.items() if k != sweep.SWEEP})
        return Experiment(cfg["run_name"], None, {cfg["run_name"]: cfg})
    if not isinstance(raw.get("run_name"), str):
        raise ConfigError("run_name: a sweep needs a run_name (its arms are <run_name>-<arm>)")
    runs = {}
    for run, arm in sweep.expand(raw).items():
        try:
            runs[run] = validate(arm)
        except ConfigError as exc:
            raise ConfigError(f"sweep arm {run}: {exc}") from None
    return Experiment(raw["run_name"], spec, runs)


def load(path: str | Path) -> dict:
    """One run file, validated: what `snakemake --configfile path` runs. A sweep is several runs: an
    error naming them (a stage run by hand takes one arm's settings)."""
    spec = read_yaml(path).get(sweep.SWEEP)
    if spec:
        arms = list(sweep.arm_overrides(spec))
        raise ConfigError(
            f"{path}: a sweep of {len(arms)} runs ({', '.join(arms)}); a stage run by hand takes "
            "one run's config: write that arm's settings to a file"
        )
    return resolve([path])


# The least a run needs besides a model and a length (train.max_steps or train.budget), for code that
# builds a config in Python (benches, tests): one source, no wandb; the rest is the schema's defaults.
MINIMAL = {
    "run_name": "kiln",
    "seed": 0,
    "download": {"sources": [{"name": "stdlib", "kind": "stdlib"}]},
    "wandb": {"mode": "disabled"},
}


def stage_sections(stage: str, base: str | Path | Mapping | None = None, **overrides) -> dict:
    """The sections `stage` reads (kiln.config.settings), from `base` (a config file, a raw config,
    or MINIMAL) with `overrides` merged in as --config merges them (mappings key by key), validated
    like any run: `stage_sections("train", model={...}, train={"max_steps": 10})`."""
    raw = read_yaml(base) if isinstance(base, (str, Path)) else copy.deepcopy(dict(base or MINIMAL))
    return settings.stage_config(validate(merge(raw, overrides)), stage)
