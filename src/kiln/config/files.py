"""Which files make a run: the files given with --configfile, merged in order as Snakemake merges them
(nested mappings key by key, anything else replaced), then the --config key=value overrides; the
embedded default (config/config.yaml) only when no file is given. A run file is never merged over the
embedded default, so a run gets exactly its own settings plus the schema's defaults."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from kiln.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
EMBEDDED_DEFAULT = ROOT / "config" / "config.yaml"


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
    with YAML's BaseLoader, which leaves every nested scalar a string ('7'), in lists too
    (`download={sources: [{max_rows: 150}]}`); Kiln reads it as written. A value given as text
    (`train='{lr: 0.004}'`, as a script may pass it) is read whole."""
    return {key: _yaml_value(value, whole=True) for key, value in overrides.items()}


def _yaml_value(value, whole: bool):
    if isinstance(value, Mapping):
        return yaml_values(value)
    if isinstance(value, list):
        return [_yaml_value(item, whole=False) for item in value]
    if not isinstance(value, str) or not value:
        return value
    try:
        typed = yaml.safe_load(value)
    except yaml.YAMLError:  # a string YAML would not take bare (a glob such as *.md): as typed
        return value
    # In a list, only a scalar YAML types (150, 0.004, true, null) is converted; any other string
    # stays as typed (a prompt `def main():` is not the mapping {'def main()': None}).
    return typed if whole or typed is None or isinstance(typed, (bool, int, float)) else value


def raw_config(configfiles: Sequence[str | Path] = (), overrides: Mapping | None = None) -> dict:
    """The raw config of `snakemake --configfile F... --config K=V...` (not yet validated): the files
    merged in order, or the embedded default when there are none; then the overrides."""
    raw: dict = {}
    for path in configfiles or [EMBEDDED_DEFAULT]:
        raw = merge(raw, read_yaml(path))
    return merge(raw, yaml_values(overrides or {}))
