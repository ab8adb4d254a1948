"""The typed train and smoke sections (kiln.config.sections) hold the schema's keys, no more and no fewer, each
typed as the schema types it; they round-trip the validated dict exactly (the train fingerprint and the
stage interface read that dict); they are frozen, overridden with dataclasses.replace."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import yaml

from kiln import config as kiln_config
from kiln.config import schema
from kiln.config.sections import SECTIONS, UNSET, Budget, Section, SmokeSection, TrainSection, section_types
from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[1]
# Nullable in the schema, filled by kiln.config.validate: the section holds the derived value.
DERIVED = {"train.seed"}  # null: the top-level seed
SCHEMA_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str, "null": type(None), "array": tuple}


def schema_types(prop: dict) -> set:
    """The Python classes a schema property's values take: its type(s), or its enum's values' types;
    an object is a Section (checked field by field in its own right)."""
    kinds = prop.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    out = {Section if k == "object" else SCHEMA_TYPES[k] for k in kinds}
    out |= {type(v) for v in prop.get("enum", [])}
    return out | ({type(None)} if "default" not in prop else set())  # an unset key reads None


def field_types(hint) -> set:
    return {Section if isinstance(t, type) and issubclass(t, Section) else t for t in section_types(hint)}


def parity_problems(cls: type[Section], props: dict, where: str) -> list[str]:
    """One line per difference between a section class's fields and the schema properties at `where`."""
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    problems = [
        f"{where}.{key}: a key in the schema but no field of {cls.__name__} (kiln.config.sections): add one, typed "
        f"as the schema types it"
        for key in props
        if key not in names
    ]
    problems += [
        f"{where}.{name}: a field of {cls.__name__} (kiln.config.sections) but no key in the schema"
        for name in names
        if name not in props
    ]
    problems += [
        f"{where}.{name}: {cls.__name__}.{name} has a Python default; the schema owns defaults"
        for name, f in names.items()
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    for key in sorted(set(props) & set(names)):
        prop, hint = props[key], hints[key]
        expected = schema_types(prop) - ({type(None)} if f"{where}.{key}" in DERIVED else set())
        if expected != field_types(hint):
            problems.append(
                f"{where}.{key}: the schema's values are {sorted(t.__name__ for t in expected)}, "
                f"{cls.__name__}.{key} is typed {hint}"
            )
        if bool(names[key].metadata.get(UNSET)) != ("default" not in prop):
            problems.append(
                f"{where}.{key}: the schema gives {'no' if 'default' not in prop else 'a'} default, so "
                f"{cls.__name__}.{key} must {'' if 'default' not in prop else 'not '}be an unset-able field (_unset())"
            )
        nested = [t for t in section_types(hint) if isinstance(t, type) and issubclass(t, Section)]
        if nested:
            problems += parity_problems(nested[0], prop.get("properties", {}), f"{where}.{key}")
    return problems


def schema_properties() -> dict:
    return yaml.safe_load(schema.SCHEMA_PATH.read_text(encoding="utf-8"))["properties"]


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_the_typed_sections_have_the_schemas_keys_and_types(name):
    problems = parity_problems(SECTIONS[name], schema_properties()[name]["properties"], name)
    assert not problems, "kiln.config.sections and the schema differ:\n  " + "\n  ".join(problems)


def test_the_parity_check_names_a_key_added_or_a_field_left_behind():
    props = schema_properties()["train"]["properties"]
    added = props | {"new_knob": {"type": "integer", "default": 1}}
    assert parity_problems(TrainSection, added, "train") == [
        "train.new_knob: a key in the schema but no field of TrainSection (kiln.config.sections): add one, typed as the "
        "schema types it"
    ]
    removed = {k: v for k, v in props.items() if k != "micro_batch"}
    assert parity_problems(TrainSection, removed, "train") == [
        "train.micro_batch: a field of TrainSection (kiln.config.sections) but no key in the schema"
    ]
    nested = dict(props, budget=dict(props["budget"], properties=dict(props["budget"]["properties"], weeks={})))
    assert parity_problems(TrainSection, nested, "train")[0].startswith("train.budget.weeks: a key in the schema")
    retyped = dict(props, micro_batch={"type": "string", "default": "16"})
    assert parity_problems(TrainSection, retyped, "train")[0].startswith("train.micro_batch: the schema's values")


def validated(train: dict | None = None, smoke: dict | None = None) -> dict:
    raw = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["train"] = raw["train"] | (train or {})
    raw["smoke"] = raw.get("smoke", {}) | (smoke or {})
    return kiln_config.validate(raw)


@pytest.mark.parametrize(
    "train",
    [
        {},
        {"budget": {"minutes": 7}, "max_steps": None},
        {"init_from": {"run": "base"}, "checkpoint_mirror": "/tmp/m", "samples": {"prompts": []}},
    ],
    ids=["defaults", "budget", "init_from"],
)
def test_a_section_gives_back_exactly_the_validated_dict(train):
    """Keys the schema leaves unset (a budget's other units, init_from's other sources) stay absent, and
    prompts are a list again: the train fingerprint of a typed section is the dict's."""
    cfg = validated(train, {"price_per_gpu_hour": 2.5})
    typed = TrainSection.of(cfg["train"])
    assert typed.as_dict() == cfg["train"]
    assert SmokeSection.of(cfg["smoke"]).as_dict() == cfg["smoke"]
    if typed.budget or typed.init_from:  # dataclasses.asdict would add their unset keys, as None
        assert dataclasses.asdict(typed) != cfg["train"]


def test_sections_are_frozen_and_overridden_by_replace():
    train = TrainSection.of(validated()["train"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.precision = "bf16"  # type: ignore[misc]
    probe = dataclasses.replace(train, precision="fp32", budget=Budget.of({"hours": 1}))
    assert probe.as_dict() == validated()["train"] | {"precision": "fp32", "budget": {"hours": 1}}
    assert isinstance(train.samples.prompts, tuple) and train.ranks == train.nproc_per_node * train.nnodes


def test_a_dict_that_is_not_a_validated_section_is_refused_naming_the_keys():
    cfg = validated()["train"]
    with pytest.raises(KilnError, match=r"train.micro_batch: missing \(build sections from a config kiln.config"):
        TrainSection.of({k: v for k, v in cfg.items() if k != "micro_batch"})
    with pytest.raises(KilnError, match=r"train.nonfinite.colour: unknown key"):
        TrainSection.of(cfg | {"nonfinite": cfg["nonfinite"] | {"colour": "red"}})
    with pytest.raises(KilnError, match="smoke: expected a mapping"):
        SmokeSection.of(["steps"])  # type: ignore[arg-type]


def test_the_union_of_a_fields_types_is_read_from_its_annotation():
    assert section_types(int | None) == (int, types.NoneType)
    assert section_types(typing.Optional[Budget]) == (Budget, types.NoneType)
