"""The schema a run config must meet (workflow/schemas/config.schema.yaml, JSON Schema): each key's
type, default and description. `check` fills every default in and reports each problem by its dotted
key path; `leaves` lists every setting a run can set, which kiln.config.settings tags."""

from __future__ import annotations

import copy
from functools import cache
from typing import Iterator

import jsonschema
import yaml

from kiln.config.files import ROOT

SCHEMA_PATH = ROOT / "workflow" / "schemas" / "config.schema.yaml"


@cache
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


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "<root>"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        prefix = f"{where}." if error.absolute_path else ""
        return "; ".join(f"{prefix}{k}: unknown key (allowed: {', '.join(allowed)})" for k in extra)
    return f"{where}: {error.message}"


def check(cfg: dict) -> list[str]:
    """Fill `cfg`'s missing keys with their defaults, in place; one line per problem, by key path."""
    validator = _validator_filling_defaults()(_schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path)))
    return [_describe(e) for e in errors]


def _walk(node: dict, prefix: str) -> Iterator[tuple[str, dict]]:
    props = dict(node.get("properties", {}))
    for branch in node.get("allOf", []):  # e.g. tokenizer.kind's branches: path, encoding, ...
        for key, sub in branch.get("then", {}).get("properties", {}).items():
            if isinstance(sub, dict):
                props.setdefault(key, sub)
    for key, sub in props.items():
        if not isinstance(sub, dict) or key == "sweep":  # a sweep makes runs; it is no run's setting
            continue
        if sub.get("type") == "object" and ("properties" in sub or "allOf" in sub):
            yield from _walk(sub, f"{prefix}{key}.")
        else:  # a value, a list, or a nullable or free-form mapping (train.budget, pretokenize.mixture)
            yield f"{prefix}{key}", sub


@cache
def leaves() -> dict[str, dict]:
    """{dotted path: its schema} for every leaf a run config can set."""
    return dict(_walk(_schema(), ""))
