"""The run configuration: which files make a run, the schema they must meet, errors that name the key path.

Which files: the files given with --configfile, merged in order as Snakemake merges them (nested
mappings merged key by key, anything else replaced), then --config key=value overrides; the embedded
default (config/config.yaml) only when no file is given. A run file is never merged over the
embedded default, so a run gets exactly its own settings plus the schema's defaults (`resolve`).

Structure and types come from workflow/schemas/config.schema.yaml (JSON Schema, which also supplies
the defaults); rules between keys that a schema cannot say (FIM shares summing to one, warmup below
max_steps, ...) are checked in `_check_relations`. Rules that need the model registry, the batch plan
or the tokenizer are one layer up, in kiln.run_config, which is what the Snakefile and the stage
scripts call.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Mapping, Sequence

import jsonschema
import yaml

from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "workflow" / "schemas" / "config.schema.yaml"
EMBEDDED_DEFAULT = ROOT / "config" / "config.yaml"


class ConfigError(KilnError):
    """Raised with one line per problem, each starting with the dotted key path."""


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


def _validator_filling_defaults():
    """A Draft 2020-12 validator that also sets missing keys to their schema default (the recipe in
    the jsonschema FAQ, with defaults copied so no two configs share a mutable default)."""
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if isinstance(sub, dict) and "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(base, {"properties": properties})


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<root>"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _key_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        prefix = f"{where}." if error.absolute_path else ""
        return "; ".join(f"{prefix}{k}: unknown key (allowed: {', '.join(allowed)})" for k in extra)
    if error.validator == "required":
        return f"{where}: {error.message}"
    return f"{where}: {error.message}"


def _check_relations(cfg: dict) -> list[str]:
    """Rules between keys that the schema cannot say. Those that need the model registry, the
    batch plan or the tokenizer's special tokens live one layer up, in kiln.run_config."""
    problems = []
    fim = cfg["pretokenize"]["fim"]
    shares = fim["psm"] + fim["spm"] + fim["middle_only"]
    if not math.isclose(shares, 1.0, abs_tol=1e-6):
        problems.append(f"pretokenize.fim: psm + spm + middle_only must sum to 1, got {shares:g}")
    train = cfg["train"]
    if train["min_lr"] > train["lr"]:
        problems.append(f"train.min_lr: {train['min_lr']} is above train.lr={train['lr']}")
    if train["max_steps"] is None and train["budget"] is None:
        problems.append("train: set max_steps (optimizer steps) or budget ({minutes|hours|dollars: N})")
    if train["max_steps"] is not None and train["warmup_steps"] >= train["max_steps"]:
        problems.append(
            f"train.warmup_steps: {train['warmup_steps']} must be below train.max_steps={train['max_steps']}"
        )
    if "dollars" in (train["budget"] or {}) and not cfg["smoke"]["price_per_gpu_hour"]:
        problems.append("train.budget: dollars needs smoke.price_per_gpu_hour, the price of one device-hour, above 0")
    init = train["init_from"]
    if init is not None and len({"run", "checkpoint", "hf"} & set(init)) != 1:
        problems.append("train.init_from: give exactly one of run, checkpoint or hf")
    elif init is not None and init.get("optimizer") and "hf" in init:
        problems.append(
            "train.init_from.optimizer: a Hugging Face export holds no optimizer state; use run or checkpoint"
        )
    if train["node_rank"] >= train["nnodes"]:
        problems.append(f"train.node_rank: {train['node_rank']} must be below train.nnodes={train['nnodes']}")
    if train["async_checkpoint"] and checkpoint_format(train["checkpoint_format"], train["parallel"]) != "sharded":
        problems.append(
            f"train.async_checkpoint: needs sharded checkpoints, but train.checkpoint_format is "
            f"{train['checkpoint_format']} under train.parallel {train['parallel']} (full); set it to sharded"
        )
    smoke = cfg["smoke"]
    if smoke["warmup_steps"] >= smoke["steps"]:
        problems.append(f"smoke.warmup_steps: {smoke['warmup_steps']} must be below smoke.steps={smoke['steps']}")
    if smoke["profile_step"] is not None and smoke["profile_step"] > smoke["steps"]:
        problems.append(f"smoke.profile_step: {smoke['profile_step']} is past smoke.steps={smoke['steps']}")
    names = [s["name"] for s in cfg["download"]["sources"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"download.sources: names must be unique, repeated: {', '.join(dupes)}")
    mixture = cfg["pretokenize"]["mixture"]
    unknown = sorted(set(mixture) - set(names))
    if unknown:
        problems.append(f"pretokenize.mixture: {', '.join(unknown)} not among download.sources ({', '.join(names)})")
    if mixture and cfg["pretokenize"].get("train_tokens") is None:
        problems.append("pretokenize.mixture: weights need pretokenize.train_tokens, the train tokens to share")
    return problems


def checkpoint_format(setting: str, parallel: str) -> str:
    """train.checkpoint_format's meaning under train.parallel: auto is sharded under FSDP (no rank
    gathers the whole state) and full under DDP (one file, as before sharded checkpoints existed)."""
    if setting != "auto":
        return setting
    return "sharded" if parallel == "fsdp" else "full"


def validate(raw: dict) -> dict:
    """Return a validated copy of `raw` with every default filled in, or raise ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError(f"<root>: expected a mapping of config sections, got {type(raw).__name__}")
    cfg = copy.deepcopy(raw)
    validator = _validator_filling_defaults()(_schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(_describe(e) for e in errors))
    problems = _check_relations(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    if cfg["train"]["seed"] is None:  # derived here, once: the model seed defaults to the data seed
        cfg["train"]["seed"] = cfg["seed"]
    return cfg


def read_yaml(path: str | Path) -> dict:
    """One config file as written (not validated)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections, got {type(raw).__name__}")
    return raw


def merge(base: dict, override: Mapping) -> dict:
    """`override` merged into a copy of `base` the way Snakemake merges config files: mappings key by
    key, any other value (lists included) replaced whole."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = merge({}, value) if isinstance(value, Mapping) else copy.deepcopy(value)
    return out


def yaml_values(overrides: Mapping) -> dict:
    """--config overrides with their nested values read as YAML. Snakemake reads `train={max_steps: 7}`
    with YAML's BaseLoader, which leaves every nested scalar a string ('7'); Kiln reads it as written."""
    return {
        key: yaml_values(value)
        if isinstance(value, Mapping)
        else yaml.safe_load(value)
        if isinstance(value, str) and value
        else value
        for key, value in overrides.items()
    }


def raw_config(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> dict:
    """The raw config of `snakemake --configfile F... --config K=V...` (not yet validated): the files
    merged in order, or the embedded default when there are none; then the overrides."""
    raw: dict = {}
    for path in configfiles or [EMBEDDED_DEFAULT]:
        raw = merge(raw, read_yaml(path))
    return merge(raw, yaml_values(overrides or {}))
