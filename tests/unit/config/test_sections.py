"""The typed sections (kiln.config: one pydantic model per section, each setting declared once) round-trip
the validated dict exactly (the train fingerprint and the stage interface read that dict); they are frozen,
overridden with `replace`. RunConfig holds every section, of a whole run or of what one stage reads."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml

from kiln import config as kiln_config
from kiln.config import schema, settings
from kiln.config.data_sections import Source
from kiln.config.run_config import SECTIONS, RunConfig
from kiln.config.smoke_section import SmokeSection
from kiln.config.train_sections import Budget, TrainSection
from kiln.errors import KilnError

ROOT = Path(__file__).resolve().parents[3]


def test_the_run_config_holds_every_section_and_the_schema_is_generated_from_it():
    """sweep makes runs (kiln.config.sweep) and is no run's setting; the JSON Schema names it all the same."""
    assert set(RunConfig.model_fields) == {"run_name", "seed", *SECTIONS}
    generated = schema.json_schema()
    assert set(generated["properties"]) == set(RunConfig.model_fields) | {"sweep"}
    assert generated["required"] == ["run_name", "download", "model", "train"]
    assert generated["properties"]["shard"]["default"] == {}


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
        "eval": {
            "reference": {"bits_per_byte": 1.1, "source": "a plain loop", "measured_on": "a VM", "date": "2026-12-06"}
        },
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
        assert {name for name in RunConfig.model_fields if getattr(typed, name) is not None} == set(part), stage


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
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        run.shard.seq_len = 8  # type: ignore[misc]
    assert isinstance(Source.of({"name": "s", "kind": "stdlib", "include": ["*.py"], "quality": "code"}).include, tuple)


def test_a_config_that_is_not_validated_is_refused_naming_the_key_path():
    cfg = validated(**VARIANTS["sources"])
    sources = cfg["download"]["sources"]
    with pytest.raises(KilnError, match=r"^download.sources.1: kind local has no key colour"):
        RunConfig.of(cfg | {"download": cfg["download"] | {"sources": [sources[0], sources[1] | {"colour": "red"}]}})
    with pytest.raises(KilnError, match=r"^eval.lm_eval.limit: Input should be greater than or equal to 1"):
        RunConfig.of(cfg | {"eval": cfg["eval"] | {"lm_eval": {"tasks": [], "limit": 0}}})
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
    if typed.budget or typed.init_from:  # pydantic's own dump would add their unset keys, as None
        assert typed.model_dump() != cfg["train"]


def test_sections_are_frozen_and_overridden_by_replace():
    train = TrainSection.of(validated()["train"])
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        train.precision = "bf16"  # type: ignore[misc]
    probe = train.replace(precision="fp32", budget=Budget.of({"hours": 1}))
    assert probe.as_dict() == validated()["train"] | {"precision": "fp32", "budget": {"hours": 1}}
    assert isinstance(train.samples.prompts, tuple) and train.ranks == train.nproc_per_node * train.nnodes


def test_a_section_built_from_part_of_a_dict_takes_the_declared_defaults_and_refuses_the_rest():
    cfg = validated()["train"]
    assert TrainSection.of({k: v for k, v in cfg.items() if k != "log_every"}).log_every == 10
    with pytest.raises(KilnError, match=r"train.nonfinite.colour: unknown key \(allowed: action, max_skips\)"):
        TrainSection.of(cfg | {"nonfinite": cfg["nonfinite"] | {"colour": "red"}})
    with pytest.raises(KilnError, match="smoke: expected a mapping"):
        SmokeSection.of(["steps"])  # type: ignore[arg-type]
    with pytest.raises(KilnError, match=r"train.budget: set exactly one of minutes, hours and dollars"):
        TrainSection.of(cfg | {"budget": {"minutes": 1, "hours": 1}})
    with pytest.raises(KilnError, match=r"download: max_doc_bytes: null is not a value here"):
        RunConfig.of(validated() | {"download": validated()["download"] | {"max_doc_bytes": None}})
