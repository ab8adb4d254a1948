"""The model shape a Hugging Face checkpoint folder describes, read from its config.json: what
kiln.hf.load builds before loading the weights, and what a run continuing a stock checkpoint
(train.init_from: {hf: FOLDER}) trains, so that its `model:` section need not copy the numbers:
kiln.config.validate replaces that section with the source's shape (model_section), the keys the
user wrote checked against it. Torch-free, in kiln.config for that reason: a config is validated
without torch.

Families (config.json's model_type):
    gpt2    GPT2LMHeadModel: Kiln's gpt2 family with biases (model.bias)
    llama   LlamaForCausalLM: Kiln's llama family; Llama 3.1/3.2's RoPE scaling (rope_type "llama3")
            becomes model.rope_scaling
    qwen2   Qwen2ForCausalLM (Qwen2, Qwen2.5): Llama's shape with biases on the query, key and value
            projections (model.qkv_bias)
    starcoder2  Starcoder2ForCausalLM: Kiln's starcoder2 family; use_bias is model.bias, and the
            sliding window (4096 in bigcode's checkpoints) is model.sliding_window: a run's context may
            not exceed it, since Kiln computes full attention (the same up to that length)
Anything Kiln does not implement (another activation, sliding-window attention, another RoPE type,
biases elsewhere) is an error naming the config.json field and what Kiln supports, never a model
that silently computes something else.

The vocabulary is the source's as it is (GPT-2's 50,257 rows, not padded): the weights fit it.
A run continuing the source trains with its own tokenizer's padded vocabulary; kiln.train.init_from
copies the source's rows into it (see there). The context is the source's max_position_embeddings
(GPT-2: n_positions; at most its sliding window); a run replaces it with its shards' seq_len. Dropout is a training choice, not
a shape: the config's model.dropout (default 0), whatever the source's config says.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kiln.config.models import ModelConfig, ModelConfigError, RopeScaling, _section_fields
from kiln.errors import KilnError

MODEL_TYPES = ("gpt2", "llama", "qwen2", "starcoder2")
ROPE_TYPES = ("default", "llama3")
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # both are the tanh GELU Kiln's GPT computes
NOT_SHAPE = ("dropout",)  # model keys a run sets for itself: never compared with the source


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
    keys += {"gpt2": ["max_positions", "bias"], "llama": ["rope_theta"]}.get(cfg.family, ["rope_theta", "bias"])
    out = {key: getattr(cfg, key) for key in keys}
    if cfg.sliding_window is not None:
        out["sliding_window"] = cfg.sliding_window
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = dataclasses.asdict(cfg.rope_scaling)
    if cfg.qkv_bias:
        out["qkv_bias"] = True
    return out | {key: section[key] for key in NOT_SHAPE if section and key in section}


def model_config_from_hf(hf: dict, where: Path | str) -> ModelConfig:
    """The ModelConfig a config.json (as a dict) describes; `where` names it in errors."""
    return from_hf(hf, where)[0]


def from_hf(hf: dict, where: Path | str) -> tuple[ModelConfig, dict[str, str]]:
    """The ModelConfig, and for each of its fields the config.json field it was read from."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise KilnError(f"{where}: model_type {kind!r} is not one Kiln imports (supported: {', '.join(MODEL_TYPES)})")
    read = {"gpt2": _gpt2, "starcoder2": _starcoder2}.get(kind, _llama)
    fields = read(hf, where, kind)
    return ModelConfig(**{k: v for k, (v, _) in fields.items()}), {k: name for k, (_, name) in fields.items()}


def _unsupported(where: Path | str, field: str, value: Any, supported: str) -> KilnError:
    return KilnError(f"{where}: {field} = {value!r} is not supported (Kiln supports {supported})")


def _gpt2(hf: dict, where: Path | str, kind: str) -> dict[str, tuple[Any, str]]:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise _unsupported(where, "activation_function", activation, " or ".join(GPT2_ACTIVATIONS))
    # GPT-2 variants Kiln's attention does not compute: unscaled or per-layer-scaled scores
    for field, plain in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(field, plain) != plain:
            raise _unsupported(where, field, hf[field], f"{plain} only")
    if hf.get("add_cross_attention"):
        raise _unsupported(where, "add_cross_attention", True, "decoder-only models: False")
    d_model = hf.get("n_embd", 768)
    return {
        "family": ("gpt2", "model_type 'gpt2', Kiln family"),
        "vocab_size": (hf["vocab_size"], "vocab_size"),
        "seq_len": (hf["n_positions"], "n_positions"),
        "n_layer": (hf["n_layer"], "n_layer"),
        "n_head": (hf["n_head"], "n_head"),
        "d_model": (d_model, "n_embd"),
        "d_ff": (hf.get("n_inner") or 4 * d_model, "n_inner"),
        "max_positions": (hf["n_positions"], "n_positions"),
        "norm_eps": (hf.get("layer_norm_epsilon", 1e-5), "layer_norm_epsilon"),
        "bias": (True, "model_type 'gpt2', biases"),  # transformers' GPT-2 always has them
        "tie_embeddings": (hf.get("tie_word_embeddings", True), "tie_word_embeddings"),
    }


def _rope(hf: dict, where: Path | str) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from transformers 5's rope_parameters or the older rope_theta and
    rope_scaling (whose type key may be "type")."""
    params = {"rope_theta": hf.get("rope_theta", 10000.0)} | (hf.get("rope_scaling") or {})
    params |= hf.get("rope_parameters") or {}
    section = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"  # the key the file has, for errors
    type_key = "rope_type" if "rope_type" in params else "type"
    rope_type = params.get(type_key, "default")
    if rope_type not in ROPE_TYPES:
        raise _unsupported(where, f"{section}.{type_key}", rope_type, ", ".join(ROPE_TYPES))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise _unsupported(where, f"{section}.partial_rotary_factor", params["partial_rotary_factor"], "1.0")
    if rope_type == "default":
        return float(params["rope_theta"]), None
    needed = ("factor", "low_freq_factor", "high_freq_factor")
    missing = [k for k in needed if k not in params]
    if missing:
        raise KilnError(f"{where}: rope_type 'llama3' needs {section}.{', '.join(missing)}")
    # transformers falls back to max_position_embeddings when the original context is not given
    original = params.get("original_max_position_embeddings", hf["max_position_embeddings"])
    scaling = RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(original),
    )
    return float(params["rope_theta"]), scaling


def _rope_decoder(hf: dict, where: Path | str) -> tuple[dict[str, tuple[Any, str]], RopeScaling | None]:
    """The fields Llama, Qwen2 and StarCoder2 configs spell alike, and the RoPE scaling (_rope)."""
    d_model, n_head = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, d_model // n_head):
        raise _unsupported(
            where, "head_dim", hf["head_dim"], f"hidden_size / num_attention_heads = {d_model // n_head}"
        )
    theta, scaling = _rope(hf, where)
    fields = {
        "vocab_size": (hf["vocab_size"], "vocab_size"),
        "n_layer": (hf["num_hidden_layers"], "num_hidden_layers"),
        "n_head": (n_head, "num_attention_heads"),
        "n_kv_head": (hf.get("num_key_value_heads") or n_head, "num_key_value_heads"),
        "d_model": (d_model, "hidden_size"),
        "d_ff": (hf["intermediate_size"], "intermediate_size"),
        "rope_theta": (theta, "rope_parameters.rope_theta" if "rope_parameters" in hf else "rope_theta"),
    }
    return fields, scaling


def _llama(hf: dict, where: Path | str, kind: str) -> dict[str, tuple[Any, str]]:
    if hf.get("hidden_act", "silu") != "silu":
        raise _unsupported(where, "hidden_act", hf["hidden_act"], "silu")
    if kind == "llama":  # Llama's attention_bias puts one on the output projection too; Kiln has none
        for field in ("attention_bias", "mlp_bias"):
            if hf.get(field):
                raise _unsupported(where, field, True, "False (qkv biases: model_type qwen2)")
    if kind == "qwen2" and hf.get("use_sliding_window"):
        raise _unsupported(where, "use_sliding_window", True, "full attention in every layer: False")
    fields, scaling = _rope_decoder(hf, where)
    rope_key = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"
    return fields | {
        "family": ("llama", f"model_type {kind!r}, Kiln family"),
        "seq_len": (hf["max_position_embeddings"], "max_position_embeddings"),
        "rope_scaling": (scaling, rope_key),
        "norm_eps": (hf.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        "tie_embeddings": (hf.get("tie_word_embeddings", False), "tie_word_embeddings"),
        # Qwen2's q, k, v always have biases; Llama's attention_bias (refused above) has one on o too
        "qkv_bias": (kind == "qwen2", "model_type 'qwen2', q/k/v biases" if kind == "qwen2" else "attention_bias"),
    }


def _starcoder2(hf: dict, where: Path | str, kind: str) -> dict[str, tuple[Any, str]]:
    activation = hf.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in GPT2_ACTIVATIONS:
        raise _unsupported(where, "hidden_act", activation, " or ".join(GPT2_ACTIVATIONS))
    # bigcode's own training code's switches, which transformers ignores: refuse any it would misread
    for field, plain in (("norm_type", "layer_norm"), ("mlp_type", "default")):
        if hf.get(field, plain) != plain:
            raise _unsupported(where, field, hf[field], repr(plain))
    fields, scaling = _rope_decoder(hf, where)
    if scaling is not None:
        raise _unsupported(where, "rope_scaling", "llama3", "plain RoPE for starcoder2")
    window = hf.get("sliding_window")
    context = hf["max_position_embeddings"] if window is None else min(window, hf["max_position_embeddings"])
    return fields | {
        "family": ("starcoder2", "model_type 'starcoder2', Kiln family"),
        "seq_len": (context, "max_position_embeddings, at most sliding_window"),
        "norm_eps": (hf.get("norm_epsilon", 1e-5), "norm_epsilon"),
        "bias": (hf.get("use_bias", True), "use_bias"),
        "tie_embeddings": (hf.get("tie_word_embeddings", True), "tie_word_embeddings"),
        "sliding_window": (window, "sliding_window"),
    }
