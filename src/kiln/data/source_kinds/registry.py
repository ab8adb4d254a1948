"""The source kinds by name (download.sources[].kind): one `register` line each, at the bottom.

A kind is one folder, kiln/data/source_kinds/<name>/ (docs/extending.md):

    config.py  `Keys`: the kind's keys, each a field declared with kiln.config.declare's setting or
               optional (type, default, bounds, description); a key without a default is required.
               QUALITY names the quality filters its documents pass by default.
    reader.py  its files or stream, and their records as documents (kiln.data.sources.Reader), read by
               kiln.data.sources.SourceReader

This module loads the kinds' config.py (light: pydantic and kiln.config) and nothing else: kiln.config
builds download.sources' model from their keys without pyarrow, datasets or torch. A kind's reader.py
is imported when first asked for, by kiln.data. The config modules and this one belong to kiln.config's
layer (tests/unit/test_layers.py): they may import kiln.config, never kiln.data's modules.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from types import ModuleType
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kiln.config.declare import optional
from kiln.errors import KilnError


class Keys(BaseModel):
    """A kind's keys (beyond name, kind and those every source has: max_rows, max_bytes, sample, quality), each a
    field declared with setting(default, description, **bounds) or optional(description). Keys that
    several kinds share are declared once, on a base class they inherit (local's RowColumns)."""

    QUALITY: ClassVar[str]  # the download.filters family its documents pass unless a source says


@dataclass(frozen=True)
class Kind:
    """A registered kind: its name, the package its config.py and reader.py are in, and one line for
    download.sources[].kind's description."""

    name: str
    package: str  # "kiln.data.source_kinds.local"
    about: str
    _loaded: dict[str, ModuleType] = field(default_factory=dict, compare=False, repr=False)

    @property
    def keys(self) -> type[Keys]:
        return self._load("config").Keys

    @property
    def reader(self) -> ModuleType:
        """reader.py (kiln.data.sources.Reader), which only kiln.data imports (it may import pyarrow,
        datasets, ...)."""
        return self._load("reader")

    def required(self) -> tuple[str, ...]:
        return tuple(name for name, info in self.keys.model_fields.items() if info.is_required())

    def defaults(self) -> dict[str, Any]:
        """The values a source of this kind holds unless it sets them: its keys' defaults, its quality."""
        fields = self.keys.model_fields.items()
        keys = {name: info.default for name, info in fields if not info.is_required() and info.default is not None}
        return {**keys, "quality": self.keys.QUALITY}

    def _load(self, part: str) -> ModuleType:
        if part not in self._loaded:
            self._loaded[part] = importlib.import_module(f"{self.package}.{part}")
        return self._loaded[part]


KINDS: dict[str, Kind] = {}


def register(name: str, package: str, about: str) -> Kind:
    """Add a kind (its folder is `package`); a name registered twice is an error."""
    if name in KINDS:
        raise KilnError(f"source kind {name!r} is registered twice ({KINDS[name].package}, {package})")
    KINDS[name] = Kind(name, package, about)
    return KINDS[name]


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def get(name: str) -> Kind:
    if name not in KINDS:
        raise KilnError(f"download.sources: kind {name!r} is not one of {', '.join(KINDS)}")
    return KINDS[name]


def key_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """Every kind's keys as fields of download.sources' model (kiln.config.data_sections.Source): the
    kinds' own keys in registration order, then the keys several kinds share. Each is unset unless a
    source sets it or its kind's default fills it in; its description names the kinds that have it,
    and the defaults."""
    own = [name for kind in KINDS.values() for name in vars(kind.keys).get("__annotations__", {})]
    every = [name for kind in KINDS.values() for name in kind.keys.model_fields]
    fields = {}
    for name in dict.fromkeys(n for n in own + every if n in every):
        having = [kind for kind in KINDS.values() if name in kind.keys.model_fields]
        info = having[0].keys.model_fields[name]
        # the key's type with its bounds (min_length, pattern, ...), or nothing
        typed = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        about = f"({', '.join(k.name for k in having)}) {info.description}{_defaults(name, having)}"
        fields[name] = (typed | None, optional(about))
    return fields


def _defaults(name: str, having: list[Kind]) -> str:
    """What the description adds: ' Required.' or ' Default: "text".', by kind where they differ."""
    said = {k.name: "required" if name in k.required() else json.dumps(k.defaults().get(name)) for k in having}
    said = {kind: value for kind, value in said.items() if value != "null"}
    if not said:
        return ""
    if len(set(said.values())) == 1 and len(said) == len(having):
        value = next(iter(said.values()))
        return " Required." if value == "required" else f" Default: {value}."
    return " " + "; ".join(f"{kind}: {value}" for kind, value in said.items()) + "."


# One line per kind (docs/extending.md).
register("stdlib", "kiln.data.source_kinds.stdlib", "the Python files of the standard library Kiln runs on")
register("local", "kiln.data.source_kinds.local", "files on disk")
register("hf", "kiln.data.source_kinds.hf", "a Hugging Face dataset (or a json/parquet builder)")
