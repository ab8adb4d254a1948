"""StarCoder2 against transformers' Starcoder2ForCausalLM, torch-free (kiln.model.registry.HF):
config.json both ways and the parameter names. use_bias is model.bias; the sliding window (4096 in
bigcode's checkpoints) is model.sliding_window, and a run's context may not exceed it, since Kiln
computes full attention (the same up to that length)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.model.hf_fields import GELU_ACTIVATIONS, rope_decoder_config, rope_decoder_fields, unsupported
from kiln.model.registry import WeightNames

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig

MODEL_TYPES = ("starcoder2",)
SECTION_KEYS = ("rope_theta", "bias")

# Llama's names for the norms and attention, each with a bias, and GPT-2's MLP names
BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_norm.bias": "input_layernorm.bias",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp_norm.bias": "post_attention_layernorm.bias",
    **{f"attn.{p}.{kind}": f"self_attn.{p}_proj.{kind}" for p in "qkvo" for kind in ("weight", "bias")},
    "mlp.up.weight": "mlp.c_fc.weight",
    "mlp.up.bias": "mlp.c_fc.bias",
    "mlp.down.weight": "mlp.c_proj.weight",
    "mlp.down.bias": "mlp.c_proj.bias",
}
TOP = {
    "wte.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "norm.bias": "model.norm.bias",
    "lm_head.weight": "lm_head.weight",
}


def weight_names(cfg: ModelConfig) -> WeightNames:
    # biases only where config.bias puts them; the norms always have one
    own = {k: (v, False) for k, v in BLOCK.items() if cfg.bias or "norm" in k or k.endswith(".weight")}
    return WeightNames(TOP, own, "model.layers")


def to_hf(cfg: ModelConfig, common: dict) -> dict:
    return rope_decoder_config(cfg, common) | {
        "architectures": ["Starcoder2ForCausalLM"],
        "model_type": "starcoder2",
        "norm_epsilon": cfg.norm_eps,
        "hidden_act": "gelu_pytorch_tanh",
        "use_bias": cfg.bias,
        "sliding_window": cfg.sliding_window,
        "residual_dropout": cfg.dropout,
        "embedding_dropout": 0.0,  # Kiln's models drop nothing at the embedding
    }


def from_hf(hf: dict, where: str, kind: str) -> dict[str, tuple[Any, str]]:
    activation = hf.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in GELU_ACTIVATIONS:
        raise unsupported(where, "hidden_act", activation, " or ".join(GELU_ACTIVATIONS))
    # bigcode's own training code's switches, which transformers ignores: refuse any it would misread
    for field, plain in (("norm_type", "layer_norm"), ("mlp_type", "default")):
        if hf.get(field, plain) != plain:
            raise unsupported(where, field, hf[field], repr(plain))
    fields, scaling = rope_decoder_fields(hf, where)
    if scaling is not None:
        raise unsupported(where, "rope_scaling", "llama3", "plain RoPE for starcoder2")
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
