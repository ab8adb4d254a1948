"""Hugging Face config.json fields more than one family reads or writes, torch-free: the error for a
field Kiln does not compute, the tanh GELU's names, and the fields Llama, Qwen2 and StarCoder2 spell
alike (sizes and rotary parameters), both ways. Each family's own mapping is kiln.model.<family>.hf."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kiln.config.models import RopeScaling
from kiln.errors import KilnError

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig

ROPE_TYPES = ("default", "llama3")
GELU_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # both are the tanh GELU kiln.model.layers.GeluMLP computes


def unsupported(where: str, field: str, value: Any, supported: str) -> KilnError:
    return KilnError(f"{where}: {field} = {value!r} is not supported (Kiln supports {supported})")


def rope(hf: dict, where: str) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from transformers 5's rope_parameters or the older rope_theta and
    rope_scaling (whose type key may be "type")."""
    params = {"rope_theta": hf.get("rope_theta", 10000.0)} | (hf.get("rope_scaling") or {})
    params |= hf.get("rope_parameters") or {}
    section = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"  # the key the file has, for errors
    type_key = "rope_type" if "rope_type" in params else "type"
    rope_type = params.get(type_key, "default")
    if rope_type not in ROPE_TYPES:
        raise unsupported(where, f"{section}.{type_key}", rope_type, ", ".join(ROPE_TYPES))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise unsupported(where, f"{section}.partial_rotary_factor", params["partial_rotary_factor"], "1.0")
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


def rope_decoder_fields(hf: dict, where: str) -> tuple[dict[str, tuple[Any, str]], RopeScaling | None]:
    """The fields Llama, Qwen2 and StarCoder2 configs spell alike, and the RoPE scaling (rope)."""
    d_model, n_head = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, d_model // n_head):
        raise unsupported(where, "head_dim", hf["head_dim"], f"hidden_size / num_attention_heads = {d_model // n_head}")
    theta, scaling = rope(hf, where)
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


def rope_decoder_config(cfg: ModelConfig, common: dict) -> dict:
    """config.json's fields Llama, Qwen2 and StarCoder2 share, over `common`."""
    rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope_parameters = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, **dataclasses.asdict(cfg.rope_scaling)}
    return common | {
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "max_position_embeddings": cfg.seq_len,
        "rope_parameters": rope_parameters,
        "attention_dropout": cfg.dropout,
    }
