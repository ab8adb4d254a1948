"""A sweep: one config, several runs (arms) that differ in named settings.

    sweep:
      train.lr: [3.0e-4, 6.0e-4, 1.2e-3]          # a grid: every combination of every listed key
      variants:                                    # and/or named variants, each a config fragment
        124m: {model: {flavour: gpt2-124m}}
        350m: {model: {flavour: gpt2-350m}}

Each arm is the config without `sweep`, with the arm's values merged in (as --config merges: mappings
key by key), validated like any run; its run_name is `<run_name>-<arm>`, e.g. `lr-sweep-lr-0.0003`,
so every arm is an ordinary run folder. Arms whose data sections are equal share their data stages
(kiln.layout), so a sweep over training settings builds the data once. The sweep's own results
(the overlay report) go to results/<run_name>/.
"""

from __future__ import annotations

import copy
import itertools
import json
import re

from kiln.config.files import merge
from kiln.errors import ConfigError

SWEEP = "sweep"
VARIANTS = "variants"
_UNSAFE = re.compile(r"[^A-Za-z0-9._]+")


def _value_name(value) -> str:
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.3g}"
    elif isinstance(value, (int, str)):
        text = str(value)
    else:
        text = json.dumps(value, sort_keys=True)
    return _UNSAFE.sub("-", text).strip("-") or "x"


def _nested(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = copy.deepcopy(value)
    return out


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DOTTED = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+$")


def _check(sweep: dict) -> None:
    problems = []
    for key, values in sweep.items():
        if key == VARIANTS:
            if not isinstance(values, dict) or not values:
                problems.append("sweep.variants: expected a mapping of variant names to config fragments")
                continue
            for name, fragment in values.items():
                if not _NAME.match(str(name)):
                    problems.append(f"sweep.variants.{name}: a variant name is letters, digits, '.', '_' or '-'")
                if not isinstance(fragment, dict):
                    problems.append(
                        f"sweep.variants.{name}: expected a config fragment (a mapping), got {type(fragment).__name__}"
                    )
                elif "run_name" in fragment:
                    problems.append(
                        f"sweep.variants.{name}: a variant cannot change run_name (each arm is <run_name>-<variant>)"
                    )
        elif not _DOTTED.match(key):
            problems.append(f"sweep.{key}: expected a dotted config key (e.g. train.lr) or 'variants'")
        elif key.split(".")[0] == "run_name":
            problems.append(f"sweep.{key}: an arm cannot change run_name")
        elif not isinstance(values, list) or not values:
            problems.append(f"sweep.{key}: expected a non-empty list of values, got {values!r}")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def arm_overrides(sweep: dict) -> dict[str, dict]:
    """{arm name: the config fragment it merges in}, variants first, then the grid in key order."""
    _check(sweep)
    variants = sweep.get(VARIANTS) or {"": {}}
    grid_keys = [key for key in sweep if key != VARIANTS]
    arms: dict[str, dict] = {}
    for (variant, fragment), values in itertools.product(
        variants.items(), itertools.product(*(sweep[k] for k in grid_keys))
    ):
        override = copy.deepcopy(fragment)
        parts = [variant] if variant else []
        for key, value in zip(grid_keys, values):
            override = merge(override, _nested(key, value))
            parts.append(f"{key.split('.')[-1]}-{_value_name(value)}")
        name = "_".join(parts)
        if name in arms:
            raise ConfigError(f"sweep: two arms are both named {name!r}; give the values distinct names")
        arms[name] = override
    return arms


def expand(raw: dict) -> dict[str, dict]:
    """{run name: that run's raw config}: the config itself when it has no sweep, else one per arm."""
    if not raw.get(SWEEP):
        return {raw["run_name"]: raw}
    base = {k: v for k, v in raw.items() if k != SWEEP}
    return {
        f"{raw['run_name']}-{name}": merge(base, override) | {"run_name": f"{raw['run_name']}-{name}"}
        for name, override in arm_overrides(raw[SWEEP]).items()
    }


def varied_keys(sweep: dict) -> list[str]:
    """The dotted keys the arms differ in (a variant counts as every key its fragment sets)."""
    keys = [key for key in sweep if key != VARIANTS]
    for fragment in (sweep.get(VARIANTS) or {}).values():
        keys += [k for k in _dotted(fragment) if k not in keys]
    return keys


def _dotted(fragment: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in fragment.items():
        path = f"{prefix}{key}"
        out += _dotted(value, path + ".") if isinstance(value, dict) and value else [path]
    return out
