"""Typed, frozen views of the run config's sections, read by attribute: the shared machinery (Section)
and the train and smoke sections; the others, and RunConfig holding them all, are in kiln.config.run_config.

The schema (workflow/schemas/config.schema.yaml, read by kiln.config.schema) owns every key's default and
description; these classes own none. A section is built (`of`) from the dict kiln.config.validate returned,
defaults already filled in, so a field with no key there, or a key with no field, is an error naming
it (tests/test_sections.py holds the fields in step with the schema's properties, their types too).
Code reads `train.micro_batch` where it read `train["micro_batch"]`, as it reads the model's
ModelConfig, and an override is `dataclasses.replace(train, precision="fp32")`, never a dict copy.

The stage interface stays plain JSON: `--params` carries a stage's sections as dicts and Trainer
takes them, so `as_dict` gives back exactly the validated dict: a key the schema leaves unset
(train.budget's units, train.init_from's sources: no default) is None here and absent there, a
tuple is a list again and a read-only mapping (pretokenize.mixture) a dict. dataclasses.asdict
would keep the unset keys as None, which changes the train fingerprint (kiln.train.fingerprint) a
checkpoint is resumed against.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping

from kiln.errors import KilnError

UNSET = "unset"  # field metadata: a key a validated config may lack, None here when it does


def unset():
    """A field for a key the schema gives no default, or only some variants of its section have:
    None when absent, and left out by as_dict."""
    return field(metadata={UNSET: True})


class Section:
    """The shared part: built from a validated dict, and back to it. KEY is the dotted config path."""

    KEY: ClassVar[str] = ""

    @classmethod
    def of(cls, data: Mapping, where: str | None = None):
        """The section a validated dict means; a KilnError naming each key that is missing or unknown."""
        where = cls.KEY if where is None else where
        if not isinstance(data, Mapping):
            raise KilnError(f"{where or '<root>'}: expected a mapping of settings, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in fields(cls)}
        problems = [
            f"{_path(where, k)}: unknown key, no field of {cls.__module__}.{cls.__name__} (a schema key needs one)"
            for k in sorted(set(data) - known)
        ]
        problems += [
            f"{_path(where, f.name)}: missing (build sections from a config kiln.config.validate returned: it fills "
            "the defaults)"
            for f in fields(cls)
            if f.name not in data and not f.metadata.get(UNSET)
        ]
        if problems:
            raise KilnError("; ".join(problems))
        return cls(**{f.name: _typed(hints[f.name], data.get(f.name), _path(where, f.name)) for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        """The validated dict this section was built from (after any replace): JSON-ready."""
        return {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)
            if not (f.metadata.get(UNSET) and getattr(self, f.name) is None)
        }


def section_types(hint) -> tuple[type, ...]:
    """The classes a field's annotation allows: int | None -> (int, NoneType); tuple[str, ...] -> (tuple,)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for arg in typing.get_args(hint) for t in section_types(arg))
    return (typing.get_origin(hint) or hint,)


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _section_class(hint) -> type[Section] | None:
    return next((t for t in section_types(hint) if isinstance(t, type) and issubclass(t, Section)), None)


def item_type(hint):
    """X of a tuple[X, ...] annotation, `| None` or not; None for any other."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is tuple:
            return typing.get_args(arg)[0]
    return None


def _typed(hint, value, where: str):
    if value is None:
        return None
    if section := _section_class(hint):
        return section.of(value, where)
    if item := item_type(hint):
        if item_section := _section_class(item):  # download.sources: each item a section
            return tuple(item_section.of(v, f"{where}.{i}") for i, v in enumerate(value))
        return tuple(value)
    if collections.abc.Mapping in section_types(hint):  # a free-form mapping: pretokenize.mixture
        return types.MappingProxyType(dict(value))
    return value


def _plain(value):
    if isinstance(value, Section):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


@dataclass(frozen=True)
class Budget(Section):
    """train.budget: exactly one unit is set (the schema says so)."""

    KEY: ClassVar[str] = "train.budget"
    minutes: float | None = unset()
    hours: float | None = unset()
    dollars: float | None = unset()


@dataclass(frozen=True)
class InitFrom(Section):
    """train.init_from: exactly one source is set (kiln.config.rules checks it)."""

    KEY: ClassVar[str] = "train.init_from"
    run: str | None = unset()
    checkpoint: str | None = unset()
    hf: str | None = unset()
    optimizer: bool
    warmup_from: float | str | None = unset()  # an LR, or "source": a run's or checkpoint's (init_from.source_last_lr)


@dataclass(frozen=True)
class Samples(Section):
    KEY: ClassVar[str] = "train.samples"
    prompts: tuple[str, ...]
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class NonFinite(Section):
    KEY: ClassVar[str] = "train.nonfinite"
    action: str
    max_skips: int


@dataclass(frozen=True)
class TrainSection(Section):
    """The `train` section; each key's meaning and default are in the schema."""

    KEY: ClassVar[str] = "train"
    nproc_per_node: int
    nnodes: int
    node_rank: int
    rdzv_endpoint: str
    device: str
    parallel: str
    collective_timeout_s: float
    first_step_timeout_s: float
    micro_batch: int | str  # "auto" until the smoke stage picks it (kiln.plan.autofit)
    seed: int
    batch_tokens: int | None
    max_steps: int | None
    budget: Budget | None
    init_from: InitFrom | None
    lr: float
    min_lr: float
    warmup_steps: int
    schedule: str
    decay_fraction: float
    cooldown: str
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    optimizer: str
    muon_lr: float
    muon_momentum: float
    muon_weight_decay: float
    muon_adjust_lr: str
    grad_clip: float
    precision: str
    compile: str | bool
    activation_checkpointing: str
    log_every: int
    eval_every: int
    eval_batches: int
    samples: Samples
    checkpoint_every: int
    keep_checkpoints: int
    keep_checkpoint_every: int
    checkpoint_format: str
    async_checkpoint: bool
    checkpoint_mirror: str | None
    max_resubmits: int
    nonfinite: NonFinite
    spike_factor: float

    @property
    def ranks(self) -> int:
        """Ranks of the whole run: nproc_per_node on each of nnodes."""
        return self.nproc_per_node * self.nnodes


@dataclass(frozen=True)
class Overfit(Section):
    KEY: ClassVar[str] = "smoke.overfit"
    rows: int
    max_steps: int
    max_loss: float


@dataclass(frozen=True)
class SmokeSection(Section):
    """The `smoke` section: the gate's thresholds and the probe's length; meanings in the schema."""

    KEY: ClassVar[str] = "smoke"
    steps: int
    warmup_steps: int
    min_loss_drop: float
    val_batches: int
    min_val_drop: float
    init_loss_tolerance: float
    causal_tolerance: float
    max_data_wait: float
    min_token_entropy: float
    overfit: Overfit
    gate: bool
    precision_steps: int
    price_per_gpu_hour: float | None
    profile_step: int | None
