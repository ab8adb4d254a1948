"""What a run config must be, from the section models (kiln.config.run_config.RunConfig and the sections
it holds): `check` validates a config and fills every default in, naming each problem by its key path;
`leaves` lists every setting a run can set with its declaration; `json_schema` is the JSON Schema
generated from the same models (workflow/schemas/config.schema.json, for editors and other tools;
`python -m kiln.config schema` writes it, and a test keeps the checked-in file current)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from kiln.config.declare import Declared, declared, describe, plain, section_of
from kiln.config.files import ROOT
from kiln.config.run_config import DEFAULT_SEED, REQUIRED, SECTIONS, RunConfig
from kiln.config.sweep import SWEEP

JSON_SCHEMA_PATH = ROOT / "workflow" / "schemas" / "config.schema.json"


def check(cfg: dict) -> list[str]:
    """Validate `cfg` and fill its missing keys with their defaults, in place; one line per problem,
    by key path (`train.lr: Input should be greater than 0`)."""
    missing = [f"{key}: required (every run sets it)" for key in REQUIRED if key not in cfg]
    if missing:
        return missing
    try:
        whole = RunConfig.model_validate(cfg, context={"whole": True})
    except ValidationError as exc:
        return describe(exc, RunConfig)
    cfg.clear()
    cfg.update(whole.as_dict())
    return []


@dataclass(frozen=True)
class Leaf:
    """One setting: its dotted path, its field (type, default, bounds, description) and declaration."""

    path: str
    field: FieldInfo
    declared: Declared

    @property
    def default(self) -> Any:
        """The default a validated config holds (a section's whole dict), or None with none."""
        if self.field.is_required():
            return None
        return plain(self.field.default_factory() if self.field.default_factory else self.field.default)


def _walk(model, prefix: str):
    for name, info in model.model_fields.items():
        mark = declared(info)
        section = section_of(info.annotation)
        if mark.reads is None and section is not None:  # a group: its fields are the settings
            yield from _walk(section, f"{prefix}{name}.")
        else:
            yield Leaf(f"{prefix}{name}", info, mark)


@cache
def leaves() -> dict[str, Leaf]:
    """{dotted path: Leaf} for every setting a run config can set, in the order the models declare them."""
    return {leaf.path: leaf for leaf in _walk(RunConfig, "")}


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a whole run config, generated from the models, with what a
    whole config adds: the required sections, the seed's default, the sections' defaults, and `sweep`
    (checked by kiln.config.sweep, not here)."""
    schema = RunConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Kiln run configuration"
    schema["description"] = (
        "One run of the pipeline, generated from kiln.config's section models (python -m kiln.config schema). "
        "x-reruns names the stages a key's change reruns; x-read-to-run those that read it only to run."
    )
    schema["required"] = list(REQUIRED)
    props = schema["properties"]
    props["seed"]["default"] = DEFAULT_SEED
    for name in SECTIONS:
        if name not in REQUIRED:
            props[name]["default"] = {}
    props[SWEEP] = {
        "type": "object",
        "description": "Several runs (arms) from one config: dotted keys with lists of values, and/or `variants`, "
        "named config fragments (kiln.config.sweep).",
    }
    return _numbers(schema)


def _numbers(node):
    """A Number field (kiln.config.declare: an int stays an int) as JSON Schema's plain `number`, its
    bounds under their JSON Schema names."""
    if isinstance(node, list):
        return [_numbers(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _numbers(v) for k, v in node.items()}
    if node.get("anyOf", [])[:2] == [{"type": "integer"}, {"type": "number"}]:
        rest = node.pop("anyOf")[2:]
        kind = {"type": "number"}
        for ours, theirs in (
            ("ge", "minimum"),
            ("gt", "exclusiveMinimum"),
            ("le", "maximum"),
            ("lt", "exclusiveMaximum"),
        ):
            if ours in node:
                kind[theirs] = node.pop(ours)
        if rest:
            node["anyOf"] = [kind, *rest]
        else:
            node.update(kind)
    return node


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
