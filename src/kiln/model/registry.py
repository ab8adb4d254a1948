"""The model families by name (model.family): one `register` line each, at the bottom.

A family is one folder, kiln/model/<name>/ (docs/extending.md):

    spec.py    torch-free: what config and plan need of the family's shape (the Spec below: the
               fields it derives, its rules, its parameter count, its memory terms)
    hf.py      torch-free: its Hugging Face mapping both ways (the HF contract below: config.json to
               ModelConfig fields and back, Kiln's parameter names against transformers'); optional
               for a family with no transformers counterpart, which then cannot be exported or imported
    module.py  the nn.Module (torch), built by kiln.model.build

This module is torch-free and loads nothing at import: kiln.config validates a model section and
kiln.plan prices one through it without torch. A family's spec and hf modules are imported when first
asked for (they are torch-free too); its module.py only by kiln.model.build, with torch. The spec and
hf modules belong to kiln.config's layer (tests/unit/test_layers.py): they may import kiln.config,
never kiln.model's torch modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from kiln.errors import KilnError

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig


class Spec(Protocol):
    """What a family's spec.py defines (module-level functions; cfg is a ModelConfig whose sizes are
    positive: the rules every family shares are kiln.config.models', and come first)."""

    def default_d_ff(self, cfg: ModelConfig) -> int:
        """The MLP width when model.d_ff is unset."""

    def default_max_positions(self, cfg: ModelConfig) -> int | None:
        """Learned position rows when model.max_positions is unset; None for a family without them."""

    def problems(self, cfg: ModelConfig) -> list[str]:
        """The family's own rules, one line each naming its model.<key> (the shared ones are
        kiln.config.models'): options it lacks, shapes it cannot build."""

    def params(self, cfg: ModelConfig) -> Params:
        """The parameter count by part; ModelConfig.num_params adds the embedding and head. Must equal
        the built module's (tests/unit/config/test_registry.py, tests/unit/model/test_extending.py)."""

    def block_weights(self, cfg: ModelConfig) -> tuple[int, int]:
        """(matmul weights, all parameters) of one block, for kiln.plan.memory: the matmuls' bf16
        copies, Muon's matrices, a block's gradients and FSDP gathers."""

    def block_activation_bytes(self, cfg: ModelConfig, bf16: bool, compiled: bool, cuda: bool) -> int:
        """Bytes one block keeps for backward per token (its weight copies not included): what autograd
        saves, measured as tests/unit/plan/test_memory.py does."""

    def final_norm_bytes(self, cfg: ModelConfig) -> int:
        """Bytes per token the final norm keeps for backward, with its output (the chunked loss's input)."""


@dataclass(frozen=True)
class Params:
    """A family's parameters by part: one block's, the final norm's and the learned position table's
    (0 without one). The token table and an untied head are the same for every family."""

    block: int
    final_norm: int
    positions: int = 0


@dataclass(frozen=True)
class WeightNames:
    """Kiln's parameter names against a transformers class's: `top` outside the blocks, `block` inside
    block i (blocks.i.<ours> -> <prefix>.i.<theirs>), each with whether the tensor is stored transposed
    (GPT-2's Conv1D)."""

    top: Mapping[str, str]
    block: Mapping[str, tuple[str, bool]]
    prefix: str
    # transformers' class always has these weights: one the Kiln model lacks (a bias-free GPT-2's
    # biases) exports as zeros, where otherwise it is left out
    zeros_for_missing: bool = False
    # a checkpoint may name its weights without this prefix (OpenAI's own GPT-2 files: "transformer.")
    optional_prefix: str = ""


class HF(Protocol):
    """What a family's hf.py defines."""

    MODEL_TYPES: tuple[str, ...]  # config.json model_type values it imports (llama: llama, qwen2)
    # model section keys a continued checkpoint's shape states beyond those every family has
    # (kiln.config.hf_source.model_section)
    SECTION_KEYS: tuple[str, ...]

    def from_hf(self, hf: dict, where: str, kind: str) -> dict[str, tuple[Any, str]]:
        """The ModelConfig fields a config.json of model_type `kind` describes, each with the config.json
        field it was read from (for errors); anything Kiln does not compute is an error naming the field."""

    def to_hf(self, cfg: ModelConfig, common: dict) -> dict:
        """config.json for `cfg`: `common` (vocabulary, tied head, special token ids, dtype) and the family's."""

    def weight_names(self, cfg: ModelConfig) -> WeightNames:
        """Every parameter's name on both sides, for this shape (biases where it has them)."""


@dataclass(frozen=True)
class Family:
    """A registered family: its name, the package its spec.py, hf.py and module.py are in, and the
    nn.Module class in module.py."""

    name: str
    package: str  # "kiln.model.gpt2"
    model: str  # "GPT": kiln.model.build builds <package>.module.<model>(cfg)
    about: str  # one line for model.family's description (docs/settings.md)
    _loaded: dict[str, ModuleType | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def spec(self) -> Spec:
        return self._load("spec")

    @property
    def hf(self) -> HF:
        """The Hugging Face mapping, or an error naming the family that has none."""
        found = self._load("hf", optional=True)
        if found is None:
            raise KilnError(f"model.family {self.name}: no Hugging Face mapping ({self.package}.hf does not exist)")
        return found

    @property
    def has_hf(self) -> bool:
        return self._load("hf", optional=True) is not None

    @property
    def module(self) -> str:
        """The dotted name of module.py (torch), which only kiln.model.build imports."""
        return f"{self.package}.module"

    def _load(self, part: str, optional: bool = False) -> ModuleType | None:
        if part not in self._loaded:
            name = f"{self.package}.{part}"
            try:
                self._loaded[part] = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if not optional or exc.name != name:  # a missing module inside it is a real error
                    raise
                self._loaded[part] = None
        return self._loaded[part]


FAMILIES: dict[str, Family] = {}


def register(name: str, package: str, model: str, about: str) -> Family:
    """Add a family (its folder is `package`); a name registered twice is an error."""
    if name in FAMILIES:
        raise KilnError(f"model family {name!r} is registered twice ({FAMILIES[name].package}, {package})")
    FAMILIES[name] = Family(name, package, model, about)
    return FAMILIES[name]


def names() -> tuple[str, ...]:
    return tuple(FAMILIES)


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise KilnError(f"model.family: {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def model_types() -> tuple[str, ...]:
    """Every config.json model_type some family imports, in registration order."""
    return tuple(kind for f in FAMILIES.values() if f.has_hf for kind in f.hf.MODEL_TYPES)


def importing(kind: str) -> Family | None:
    """The family that imports config.json's model_type `kind`, if any."""
    return next((f for f in FAMILIES.values() if f.has_hf and kind in f.hf.MODEL_TYPES), None)


# One line per family (docs/extending.md).
register("gpt2", "kiln.model.gpt2", "GPT", "LayerNorm, GELU, learned positions")
register("llama", "kiln.model.llama", "Llama", "RMSNorm, SwiGLU, RoPE, grouped-query attention")
register("starcoder2", "kiln.model.starcoder2", "StarCoder2", "LayerNorm, GELU, RoPE, grouped-query attention")
