"""The model shape a Hugging Face checkpoint folder describes, read from its config.json: what
kiln.hf.load builds before loading the weights, and what a run continuing a stock checkpoint
(train.init_from: {hf: FOLDER}) trains, so that its `model:` section need not copy the numbers:
kiln.config.validate replaces that section with the source's shape (model_section), the keys the
user wrote checked against it. Torch-free, in kiln.config for that reason: a config is validated
without torch.

Each family reads its own config.json (kiln.model.<family>.hf.from_hf; kiln.model.registry finds
the family that imports a model_type): gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM, and
Qwen2ForCausalLM as model.qkv_bias; Llama 3.1's RoPE scaling as model.rope_scaling), starcoder2
(Starcoder2ForCausalLM; its sliding window as model.sliding_window, which a run's context may not
exceed). Anything Kiln does not implement (another activation, sliding-window attention, another RoPE type,
biases elsewhere) is an error naming the config.json field and what Kiln supports, never a model
that silently computes something else.

The vocabulary is the source's as it is (GPT-2's 50,257 rows, not padded): the weights fit it.
A run continuing the source trains with its own tokenizer's padded vocabulary; kiln.train.init_from
copies the source's rows into it (see there). The context is the source's max_position_embeddings
(GPT-2: n_positions; at most its sliding window); a run replaces it with its shards' seq_len. Dropout is a training choice, not
a shape: the config's model.dropout (default 0), whatever the source's config says; so is
model.document_mask (kiln.model.documents).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kiln.config.models import RECIPE_OPTIONS, ModelConfig, ModelConfigError, RopeScaling, _section_fields
from kiln.errors import KilnError
from kiln.model import registry

# Model keys a run sets for itself, never compared with the source: what the same weights train with
# (dropout; attention within documents, which the source's config.json has no field for; how the
# projections were initialised, which the source's weights replace)
NOT_SHAPE = ("dropout", "document_mask", "zero_init_projections")


def read_config(folder: Path) -> dict:
    """The source's config.json, or an error naming the path."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise KilnError(f"{path}: not found; is {folder} a transformers model folder?")
    return json.loads(path.read_text(encoding="utf-8"))


def source_config(folder: Path, section: dict | None = None) -> ModelConfig:
    """The ModelConfig of the checkpoint in `folder`. `section`, a config's model section, may
    restate any of the source's fields (directly or through a flavour); one that contradicts the
    source is an error naming the config key, its value and the source's."""
    hf = read_config(folder)
    where = Path(folder) / "config.json"
    cfg, hf_keys = from_hf(hf, where)
    if not section:
        return cfg
    given = _section_fields(section) if "flavour" in section else dict(section)
    if isinstance(given.get("rope_scaling"), dict):  # as a section holds it
        given["rope_scaling"] = RopeScaling(**given["rope_scaling"])
    problems = [
        f"model.{key}: {value!r} in the config, but the source has {hf_keys.get(key, key)} = "
        f"{getattr(cfg, key)!r} ({where}); drop model.{key} to take the source's"
        for key, value in given.items()
        if key not in NOT_SHAPE and getattr(cfg, key, None) != value
    ]
    if problems:
        raise ModelConfigError(problems)
    return dataclasses.replace(cfg, **{k: given[k] for k in NOT_SHAPE if k in given})


def model_section(folder: Path, section: dict | None = None) -> dict:
    """The config's `model:` section for a run that continues the checkpoint in `folder`: the source's
    shape as the schema's keys (no flavour), `section`'s own keys checked against it (source_config)
    and its dropout kept. The vocabulary and context are not section keys: the run's tokenizer and
    shards give them, as for any run."""
    cfg = source_config(folder, section)
    keys = ["family", "n_layer", "n_head", "d_model", "n_kv_head", "d_ff", "norm_eps", "tie_embeddings"]
    keys += registry.get(cfg.family).hf.SECTION_KEYS
    out = {key: getattr(cfg, key) for key in keys}
    if cfg.sliding_window is not None:
        out["sliding_window"] = cfg.sliding_window
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = dataclasses.asdict(cfg.rope_scaling)
    if cfg.qkv_bias:
        out["qkv_bias"] = True
    out |= {key: value for key, value in cfg.to_dict().items() if key in RECIPE_OPTIONS}  # those set: qk_norm, relu2
    return out | {key: section[key] for key in NOT_SHAPE if section and key in section}


def model_config_from_hf(hf: dict, where: Path | str) -> ModelConfig:
    """The ModelConfig a config.json (as a dict) describes; `where` names it in errors."""
    return from_hf(hf, where)[0]


def from_hf(hf: dict, where: Path | str) -> tuple[ModelConfig, dict[str, str]]:
    """The ModelConfig, and for each of its fields the config.json field it was read from."""
    kind = hf.get("model_type")
    family = registry.importing(kind)
    if family is None:
        supported = ", ".join(registry.model_types())
        raise KilnError(f"{where}: model_type {kind!r} is not one Kiln imports (supported: {supported})")
    fields = family.hf.from_hf(hf, str(where), kind)
    return ModelConfig(**{k: v for k, (v, _) in fields.items()}), {k: name for k, (_, name) in fields.items()}
