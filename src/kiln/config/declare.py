"""How a setting is declared: once, as a field of its section's model, with everything known about it.

    class ShardSection(Section):
        seq_len: int = setting(256, "Tokens a training sequence predicts ...", reads(shard=OUTPUT), ge=1)

One line gives the key its type (the annotation), default, bounds (pydantic's ge/gt/le/lt/...), the
description users read and the stages it concerns (Reads). Everything else is derived from the
section models (kiln.config.data_sections, smoke_section, train_sections, eval_sections, run_config):

  validation        kiln.config.schema: pydantic checks each key and names it by path
                    (`train.lr: Input should be greater than 0`); defaults are filled in
  the JSON schema   workflow/schemas/config.schema.json, for editors (`python -m kiln.config schema`)
  docs/settings.md  every setting with its type, default, what it reruns and what it is
  rule params       kiln.config.settings: a stage's OUTPUT leaves are what Snakemake compares
  the fingerprint   the train leaves that shape the trajectory (kiln.train.fingerprint)

Reads names, for each stage that reads a setting, one of

  OUTPUT  it changes what the stage makes: weights and trajectory, shards, eval numbers, the plan's
          figures. It is in the rule's params, so Snakemake reruns the stage when it changes.
  RUN     it changes only how the stage runs and shows its work: logging, cadence, placement,
          retries, timeouts, the micro-batch at an equal global batch, ranks. The stage reads it,
          but its rule does not rerun for it: a logging change never costs a retrain.
  When    OUTPUT in the runs that meet a condition (say, a budget in dollars), RUN in the rest.

A field without Reads is a group of settings (a nested section such as train.samples, declared with
`group`) whose own fields carry theirs; a leaf without Reads is an error (settings.check_table;
tests/unit/config/test_declare.py). tests/dag/test_settings.py dry-runs a change of every leaf on a finished run and
checks the stages Snakemake schedules are the ones its tag names; tests/dag/test_tags.py runs each change
through the stages that read it and checks what they write moves where the tag says it does, and only
there (docs/testing.md).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from kiln.errors import KilnError

OUTPUT, RUN = "output", "run"
# The stages in DAG order (kiln.layout owns where each writes); `plan` prices the smoke stage's
# measurements (smoke/plan.json, plan.md), apart from what train reads, so a price reruns no training.
# `rehearse` needs the config alone (kiln.rehearse: the GPU step's memory on fake tensors), so it runs
# first, and smoke waits for it; its OUTPUT settings are those that move a phase's bytes.
DATA_STAGES = ("download", "tokenizer", "pretokenize", "shard")
# eval_data is eval's CPU work on the data alone (the unigram baseline, the held-out documents'
# infilling problems and lm-eval task data, the contamination scan), run beside training.
STAGES = (*DATA_STAGES, "rehearse", "smoke", "plan", "train", "eval_data", "eval", "report")

# A JSON number: an int stays an int (as jsonschema kept it), so a config's canonical JSON, and the
# data keys and fingerprints hashed from it, do not change with the validator; a bool is not one.
Number = StrictInt | StrictFloat
# A list in YAML, a read-only tuple here; its items are checked strictly all the same.
Strings = Annotated[tuple[str, ...], Field(strict=False)]
Prompts = Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(strict=False)]


@dataclass(frozen=True)
class When:
    """OUTPUT for a stage in the runs whose config meets `test`, RUN in the others."""

    name: str  # how the generated schema names it
    what: str  # the condition in words, for docs/settings.md
    test: Callable[[Mapping], bool] = field(compare=False)  # on the validated config dict

    def __repr__(self) -> str:
        return f"output when {self.what}"


BUDGETED = When("budgeted", "train.budget is set", lambda cfg: cfg["train"]["budget"] is not None)
DOLLARS = When("dollars", "train.budget is in dollars", lambda cfg: "dollars" in (cfg["train"]["budget"] or {}))
MUON = When("muon", "train.optimizer is muon", lambda cfg: cfg["train"]["optimizer"] == "muon")
# With train.batch_tokens null the global batch is one micro-batch per rank: the ranks and the
# micro-batch then make the step, not only how it is spread.
PER_RANK_BATCH = When("per_rank_batch", "train.batch_tokens is null", lambda cfg: cfg["train"]["batch_tokens"] is None)
FSDP = When("fsdp", "train.parallel is fsdp", lambda cfg: cfg["train"]["parallel"] == "fsdp")
# The rehearsal takes a GPU's branch, where auto and true compile alike: only false is another step
EAGER = When("eager", "train.compile is false", lambda cfg: cfg["train"]["compile"] is False)


@dataclass(frozen=True)
class Reads:
    """The stages that read a setting, each with OUTPUT, RUN or a When; `note` says why where the tag
    is not obvious (docs/settings.md)."""

    stages: Mapping[str, str | When]
    note: str = ""

    def __post_init__(self):
        for stage, tag in self.stages.items():
            if stage not in STAGES or not (tag in (OUTPUT, RUN) or isinstance(tag, When)):
                raise ValueError(f"Reads: {stage}={tag!r} (stages: {', '.join(STAGES)}; tags: OUTPUT, RUN, a When)")


def reads(note: str = "", **stages: str | When) -> Reads:
    return Reads(stages, note)


# Groups that recur. The smoke probe runs train's step (its optimizer, batch, precision) at a
# constant LR, so the schedule's shape and length shape train alone.
DOWNLOAD = reads(download=OUTPUT)
TOKENIZER = reads(tokenizer=OUTPUT)
VOCABULARY = reads("the rehearsal's embedding rows", tokenizer=OUTPUT, rehearse=OUTPUT)
PRETOKENIZE = reads(pretokenize=OUTPUT)
MODEL = reads(smoke=OUTPUT, train=OUTPUT, report=OUTPUT, rehearse=OUTPUT)
# what the model computes, not what it holds: each phase keeps the same tensors (a base, an epsilon, an
# activation of the same shape, an init, a window Kiln does not apply below its span)
MODEL_VALUES = reads(smoke=OUTPUT, train=OUTPUT, report=OUTPUT, rehearse=RUN)
GATE = reads(smoke=OUTPUT)
STEP = reads(smoke=OUTPUT, train=OUTPUT, report=OUTPUT)  # the optimizer step the probe also runs
SCHEDULE = reads(train=OUTPUT, report=OUTPUT)
MUON_STEP = reads(smoke=MUON, train=MUON)
RANKS = reads(
    "the data order is a function of the global row; with no train.batch_tokens, the batch is per rank",
    smoke=PER_RANK_BATCH,
    train=PER_RANK_BATCH,
    eval=RUN,
    report=PER_RANK_BATCH,
    rehearse=OUTPUT,
)
PLACEMENT = reads("where the ranks run: the data order is a function of the global row", smoke=RUN, train=RUN)
TRAIN_RUN = reads(train=RUN)
EVAL = reads(eval=OUTPUT)
EVAL_DATA = reads("eval reads what eval_data made of it", eval_data=OUTPUT)


@dataclass(frozen=True)
class Declared:
    """What a field declares beyond pydantic's own: its Reads, and whether it is left out of the
    validated dict while unset. Kept as the field's json_schema_extra, which pydantic calls to add
    the tags to the generated schema."""

    reads: Reads | None
    unset: bool = False
    nullable: bool = False  # an unset key that may also be written as null (model.sliding_window)

    def __call__(self, schema: dict[str, Any]) -> None:
        if self.reads is None:
            return
        schema["x-reruns"] = {
            s: (t if isinstance(t, str) else t.name) for s, t in self.reads.stages.items() if t != RUN
        }
        schema["x-read-to-run"] = [s for s, t in self.reads.stages.items() if t == RUN]


def setting(default: Any = PydanticUndefined, description: str = "", tag: Reads | None = None, **constraints) -> Any:
    """A field declared once: its default (a callable for a mutable one, e.g. a nested section; none:
    required), description, the stages it concerns and pydantic's bounds (ge, gt, le, lt, min_length,
    pattern, ...)."""
    factory = default if callable(default) else None
    return Field(
        PydanticUndefined if factory else default,
        default_factory=factory,
        description=" ".join(description.split()),
        json_schema_extra=Declared(tag),
        **constraints,
    )


def group(section: type[Section]) -> Any:
    """A nested section (train.samples, download.filters): its own defaults, described by its
    docstring; its fields carry their stages one by one."""
    return setting(section, section.__doc__ or "")


def optional(description: str = "", tag: Reads | None = None, nullable: bool = False, **constraints) -> Any:
    """A key with no default, or one only some variants of its section have: None here while unset,
    and absent from the validated dict (as_dict), so a config's canonical JSON holds only what it set.
    Written as null it is an error, unless `nullable` (null then means unset too)."""
    return Field(
        None,
        description=" ".join(description.split()),
        json_schema_extra=Declared(tag, unset=True, nullable=nullable),
        **constraints,
    )


def declared(info: FieldInfo) -> Declared:
    extra = info.json_schema_extra
    return extra if isinstance(extra, Declared) else Declared(None)


class Section(BaseModel):
    """A typed, frozen section of the run config, read by attribute (`train.micro_batch`), overridden
    with `replace` (never a dict copy). Strict: a YAML string is not a number, 1 is not true."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    KEY: ClassVar[str] = ""  # the dotted config path, for errors

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = [
                key
                for key, value in data.items()
                if value is None and key in cls.model_fields and _nulls_refused(cls.model_fields[key])
            ]
            if nulls:
                raise PydanticCustomError(
                    "kiln", "{keys}: null is not a value here (leave the key out)", {"keys": ", ".join(nulls)}
                )
        return data

    @classmethod
    def of(cls, data: Mapping, where: str | None = None):
        """The section `data` means (defaults filled in), or a KilnError naming each problem by path."""
        where = cls.KEY if where is None else where
        if not isinstance(data, Mapping):
            raise KilnError(f"{where or '<root>'}: expected a mapping of settings, got {type(data).__name__}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise KilnError("; ".join(describe(exc, cls, where))) from None

    def as_dict(self) -> dict[str, Any]:
        """The validated dict: JSON-ready, every default in, an unset optional key left out."""
        out = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None and declared(info).unset:
                continue
            out[name] = plain(value)
        return out

    def replace(self, **changes):
        """A copy with `changes` (typed values, as the fields hold them), like dataclasses.replace."""
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:
            raise TypeError(f"{type(self).__name__}.replace: no field {', '.join(sorted(unknown))}")
        return self.model_copy(update=changes)


def _nulls_refused(info: FieldInfo) -> bool:
    mark = declared(info)
    return mark.unset and not mark.nullable


def plain(value):
    """A section or value as JSON-ready data: sections as dicts, tuples as lists, mappings as dicts."""
    if isinstance(value, Section):
        return value.as_dict()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


# Where pydantic names a union member in an error's location (`micro_batch.constrained-int`, `.bool`,
# `.literal['auto']`, a model's name), not a key: config keys are lower snake case, and no key is a
# bare type name.
_TYPE_NAMES = {"bool", "int", "float", "str", "none", "list", "tuple", "dict"}


def _is_key(part) -> bool:
    return isinstance(part, int) or (
        isinstance(part, str) and part.replace("_", "a").isalnum() and part.islower() and part not in _TYPE_NAMES
    )


def describe(exc: ValidationError, model: type[BaseModel], where: str = "") -> list[str]:
    """One line per problem, by dotted key path: an unknown key lists the allowed ones, and the
    alternatives of a union (an int or "auto") are one line."""
    lines: dict[str, list[str]] = {}
    errors = exc.errors(include_url=False)
    # A list whose items failed also reports itself as too short (its valid items are fewer than
    # min_length): the items' errors say it.
    for error in errors:
        if error["type"] == "too_short" and any(_under_item(e["loc"], error["loc"]) for e in errors):
            continue
        keys = [str(p) for p in error["loc"] if _is_key(p)]
        path = ".".join(([where] if where else []) + keys) or "<root>"
        if error["type"] == "extra_forbidden":
            allowed = sorted(_fields_at(model, keys[:-1]))
            message = f"unknown key (allowed: {', '.join(allowed)})" if allowed else "unknown key"
        elif isinstance(error.get("input"), (str, int, float)) and error["type"] != "missing":
            message = f"{error['msg']} (got {error['input']!r})"
        else:
            message = error["msg"]
        lines.setdefault(path, [])
        if message not in lines[path]:
            lines[path].append(message)
    return [f"{path}: {', or '.join(messages)}" for path, messages in lines.items()]


def _under_item(loc: tuple, of: tuple) -> bool:
    """Whether `loc` is inside an item of the list at `of`."""
    return len(loc) > len(of) and loc[: len(of)] == of and isinstance(loc[len(of)], int)


def _fields_at(model: type[BaseModel], keys: list[str]) -> set[str]:
    """The keys a section at `keys` (under `model`) allows; empty where that is not a section."""
    node: Any = model
    for key in keys:
        if key.isdigit():
            continue  # an item of a list of sections: the same model
        info = node.model_fields.get(key) if isinstance(node, type) and issubclass(node, BaseModel) else None
        if info is None:
            return set()
        node = section_of(info.annotation)
    return set(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else set()


def section_of(annotation) -> type[Section] | None:
    """The Section class a field holds, alone, optional or as the items of a tuple; None for a value."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    for arg in typing.get_args(annotation):
        found = section_of(arg)
        if found is not None:
            return found
    return None
