"""The typed sections (kiln.config.sections, kiln.config.run_config) hold the schema's keys, no more and no
fewer, each typed as the schema types it; they round-trip the validated dict exactly (the train fingerprint and
the stage interface read that dict); they are frozen, overridden with dataclasses.replace. RunConfig holds every
section, of a whole run or of what one stage reads."""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from pathlib import Path

import pytest
import yaml

from kiln import config as kiln_config
from kiln.config import schema, settings
from kiln.config.run_config import SECTIONS, RunConfig, Source
from kiln.config.sections import UNSET, Budget, Section, SmokeSection, TrainSection, item_type, section_types
from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[1]
# Nullable in the schema, filled by kiln.config.validate: the section holds the derived value.
DERIVED = {"train.seed"}  # null: the top-level seed
SCHEMA_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str, "null": type(None), "array": tuple}


def schema_document() -> dict:
    return yaml.safe_load(schema.SCHEMA_PATH.read_text(encoding="utf-8"))


def resolved(node: dict, document: dict) -> dict:
    """`node`, or what its $ref names in `document` (#/$defs/...)."""
    while "$ref" in node:
        target = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def section_keys(node: dict, document: dict) -> dict[str, tuple[dict, bool]]:
    """{key: (its schema, whether a validated section may lack it)} of an object schema: its properties,
    and those of each variant (allOf's if/then: tokenizer.kind's, a source kind's). A key may be absent
    when it has no default and is not required, or when some variant lacks it."""
    node = resolved(node, document)
    required = set(node.get("required", []))
    keys = {k: (resolved(p, document), "default" not in p and k not in required) for k, p in node["properties"].items()}
    variants = [branch["then"] for branch in node.get("allOf", [])]
    for variant in variants:
        for key, prop in variant.get("properties", {}).items():
            if isinstance(prop, dict) and key not in keys:  # `kind: true` names a key above
                always = all(
                    key in v.get("required", []) or "default" in v.get("properties", {}).get(key, {}) for v in variants
                )
                keys[key] = (resolved(prop, document), not always)
    return keys


def is_mapping(prop: dict) -> bool:
    """A free-form object (pretokenize.mixture): its keys are the user's, its values typed alike."""
    return "additionalProperties" in prop and "properties" not in prop and "allOf" not in prop


def schema_types(prop: dict, optional: bool) -> set:
    """The Python classes a schema property's values take: its type(s), its enum's or const's values'
    types, each anyOf branch's; an
    object is a Section (checked field by field in its own right), or a mapping when free-form."""
    kinds = prop.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    out = {
        (collections.abc.Mapping if is_mapping(prop) else Section) if k == "object" else SCHEMA_TYPES[k] for k in kinds
    }
    out |= {type(v) for v in prop.get("enum", [])} | ({type(prop["const"])} if "const" in prop else set())
    for branch in prop.get("anyOf", []):  # train.init_from.warmup_from: a number or `source`
        out |= schema_types(branch, optional=False)
    return out | ({type(None)} if optional else set())  # an unset key reads None


def field_types(hint) -> set:
    return {Section if isinstance(t, type) and issubclass(t, Section) else t for t in section_types(hint)}


def nested_section(hint) -> type[Section] | None:
    """The Section a field holds, itself or as a tuple's items (download.sources)."""
    item = item_type(hint)
    kinds = section_types(hint) + (section_types(item) if item else ())
    return next((t for t in kinds if isinstance(t, type) and issubclass(t, Section)), None)


def parity_problems(cls: type[Section], node: dict, where: str, document: dict | None = None) -> list[str]:
    """One line per difference between a section class's fields and the object schema `node` at `where`."""
    document = document or schema_document()
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    keys = section_keys(node, document)
    problems = [
        f"{where}.{key}: a key in the schema but no field of {cls.__name__} ({cls.__module__}): add one, typed "
        f"as the schema types it"
        for key in keys
        if key not in names
    ]
    problems += [
        f"{where}.{name}: a field of {cls.__name__} ({cls.__module__}) but no key in the schema"
        for name in names
        if name not in keys
    ]
    problems += [
        f"{where}.{name}: {cls.__name__}.{name} has a Python default; the schema owns defaults"
        for name, f in names.items()
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    for key in sorted(set(keys) & set(names)):
        (prop, optional), hint = keys[key], hints[key]
        expected = schema_types(prop, optional) - ({type(None)} if f"{where}.{key}" in DERIVED else set())
        if expected != field_types(hint):
            problems.append(
                f"{where}.{key}: the schema's values are {sorted(t.__name__ for t in expected)}, "
                f"{cls.__name__}.{key} is typed {hint}"
            )
        if is_mapping(prop):
            values = schema_types(prop["additionalProperties"], optional=False)
            if values != set(section_types(typing.get_args(hint)[1])):
                problems.append(
                    f"{where}.{key}: the schema's mapping values are {values}, {cls.__name__}.{key}'s {hint}"
                )
        if bool(names[key].metadata.get(UNSET)) != optional:
            problems.append(
                f"{where}.{key}: a validated config {'may lack' if optional else 'always has'} it, so "
                f"{cls.__name__}.{key} must {'' if optional else 'not '}be an unset-able field (unset())"
            )
        if nested := nested_section(hint):
            inner = prop["items"] if "items" in prop else prop
            problems += parity_problems(nested, inner, f"{where}.{key}", document)
    return problems


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_the_typed_sections_have_the_schemas_keys_and_types(name):
    document = schema_document()
    problems = parity_problems(SECTIONS[name], document["properties"][name], name, document)
    assert not problems, "the typed sections and the schema differ:\n  " + "\n  ".join(problems)


def test_the_run_config_holds_every_section_of_the_schema():
    """sweep makes runs (kiln.config.sweep) and is no run's setting."""
    hints = typing.get_type_hints(RunConfig)
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert set(fields) == set(schema_document()["properties"]) - {"sweep"}
    assert set(SECTIONS) == set(fields) - {"run_name", "seed"}
    for name, cls in SECTIONS.items():
        assert set(section_types(hints[name])) == {cls, type(None)}, name
    assert all(f.metadata.get(UNSET) for f in fields.values())  # a stage reads only some sections


def test_the_parity_check_names_a_key_added_or_a_field_left_behind():
    node = schema_document()["properties"]["train"]
    props = node["properties"]
    added = dict(node, properties=props | {"new_knob": {"type": "integer", "default": 1}})
    assert parity_problems(TrainSection, added, "train") == [
        "train.new_knob: a key in the schema but no field of TrainSection (kiln.config.sections): add one, typed as the "
        "schema types it"
    ]
    removed = dict(node, properties={k: v for k, v in props.items() if k != "micro_batch"})
    assert parity_problems(TrainSection, removed, "train") == [
        "train.micro_batch: a field of TrainSection (kiln.config.sections) but no key in the schema"
    ]
    budget = dict(props["budget"], properties=dict(props["budget"]["properties"], weeks={}))
    nested = dict(node, properties=dict(props, budget=budget))
    assert parity_problems(TrainSection, nested, "train")[0].startswith("train.budget.weeks: a key in the schema")
    retyped = dict(node, properties=dict(props, micro_batch={"type": "string", "default": "16"}))
    assert parity_problems(TrainSection, retyped, "train")[0].startswith("train.micro_batch: the schema's values")


def test_the_parity_check_reads_each_variant_of_a_list_item():
    """A key of one source kind needs a field, unset-able; one every kind gives a default, a plain field."""
    document = schema_document()
    stdlib, local, hf = (branch["then"] for branch in document["$defs"]["source"]["allOf"])
    hf["properties"]["token"] = {"type": "string"}
    stdlib["properties"]["text_column"] = local["properties"]["text_column"]
    assert parity_problems(SECTIONS["download"], document["properties"]["download"], "download", document) == [
        "download.sources.token: a key in the schema but no field of Source (kiln.config.run_config): add one, typed "
        "as the schema types it",
        "download.sources.text_column: the schema's values are ['str'], Source.text_column is typed str | None",
        "download.sources.text_column: a validated config always has it, so Source.text_column must not be an "
        "unset-able field (unset())",
    ]


def validated(train: dict | None = None, smoke: dict | None = None, **sections) -> dict:
    """tests/configs/tiny.yaml, validated, with keys of train and smoke and whole other `sections` set."""
    raw = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["train"] = raw["train"] | (train or {})
    raw["smoke"] = raw.get("smoke", {}) | (smoke or {})
    return kiln_config.validate(raw | sections)


# Every variant of the sections with variants, and every optional key of the others, somewhere.
VARIANTS = {
    "tiny": {},
    "sources": {
        "download": {
            "sources": [
                {"name": "std", "kind": "stdlib", "max_rows": 10},
                {"name": "files", "kind": "local", "paths": ["data/*.jsonl"], "repo_column": "repo"},
                {"name": "hub", "kind": "hf", "dataset": "json", "data_files": ["a.jsonl"], "max_bytes": 10**6},
            ],
            "max_doc_bytes": 10**5,
        },
        "pretokenize": {"mixture": {"std": 1, "hub": 0.5}, "train_tokens": 10**5, "fim": {"rate": 0}},
        "eval": {"reference": {"bits_per_byte": 1.1, "source": "a plain loop"}},
        "model": {"flavour": "debug", "family": "llama", "tie_embeddings": False},
    },
    "tokenizer file": {"tokenizer": {"kind": "file", "path": "tokenizer.json"}},
    "tiktoken ranks": {"tokenizer": {"kind": "tiktoken", "path": "r.tiktoken", "pattern": "\\w+"}},
    "tiktoken name": {"tokenizer": {"kind": "tiktoken", "encoding": "gpt2"}, "eval": {"reference": None}},
}


@pytest.mark.parametrize("sections", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_run_config_gives_back_exactly_the_validated_config_and_each_stages_part(sections):
    """A key a variant lacks (a stdlib source's dataset, a file tokenizer's vocab_size) stays absent; a
    stage's part (kiln.stage.stage_config) has None for the sections it does not read."""
    cfg = validated(**sections)
    run = RunConfig.of(cfg)
    assert run.as_dict() == cfg and isinstance(run.as_dict()["pretokenize"]["mixture"], dict)
    for stage in settings.STAGES:
        part = settings.stage_config(cfg, stage)
        typed = RunConfig.of(part)
        assert typed.as_dict() == part, stage
        assert {f.name for f in dataclasses.fields(typed) if getattr(typed, f.name) is not None} == set(part), stage


def test_the_run_config_reads_by_attribute_and_is_read_only_throughout():
    run = RunConfig.of(validated(**VARIANTS["sources"]))
    std, files, hub = run.download.sources
    assert (std.include, std.dataset, files.paths, files.text_column, hub.split) == (
        ("**/*.py",),
        None,
        ("data/*.jsonl",),
        "text",
        "train",
    )
    assert run.pretokenize.mixture == {"std": 1, "hub": 0.5} and run.eval.reference.val_loss is None
    assert run.model.flavour == "debug" and run.model.n_layer is None and run.tokenizer.vocab_size == 512
    with pytest.raises(TypeError):
        run.pretokenize.mixture["files"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.shard.seq_len = 8  # type: ignore[misc]
    assert isinstance(Source.of({"name": "s", "kind": "stdlib", "include": ["*.py"], "quality": "code"}).include, tuple)


def test_a_config_that_is_not_validated_is_refused_naming_the_key_path():
    cfg = validated(**VARIANTS["sources"])
    sources = cfg["download"]["sources"]
    with pytest.raises(
        KilnError, match=r"^download.sources.1.colour: unknown key, no field of kiln.config.run_config.Source"
    ):
        RunConfig.of(cfg | {"download": cfg["download"] | {"sources": [sources[0], sources[1] | {"colour": "red"}]}})
    with pytest.raises(KilnError, match=r"^eval.lm_eval.limit: missing"):
        RunConfig.of(cfg | {"eval": cfg["eval"] | {"lm_eval": {"tasks": [], "max_docs": 1}}})
    with pytest.raises(KilnError, match=r"^sweep: unknown key"):
        RunConfig.of(cfg | {"sweep": {"train.lr": [1e-3]}})
    with pytest.raises(KilnError, match=r"^<root>: expected a mapping"):
        RunConfig.of([cfg])  # type: ignore[arg-type]


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
