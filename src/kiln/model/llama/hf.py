"""Llama against transformers' LlamaForCausalLM, Qwen2ForCausalLM (Qwen2, Qwen2.5: Llama's shape
with biases on the query, key and value projections, model.qkv_bias) and Qwen3ForCausalLM (Llama's shape
with RMSNorm on each head's query and key, model.qk_norm), torch-free (kiln.model.registry.HF):
config.json both ways and the parameter names. Llama 3.1/3.2's RoPE scaling (rope_type "llama3") is
model.rope_scaling; hidden_act relu2 is model.mlp_activation relu2."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.config.models import MLP_ACTIVATIONS
from kiln.errors import KilnError
from kiln.model.hf_fields import rope_decoder_config, rope_decoder_fields, unsupported
from kiln.model.registry import WeightNames

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig

MODEL_TYPES = ("llama", "qwen2", "qwen3")
SECTION_KEYS = ("rope_theta",)

# Our name inside block i -> theirs inside model.layers.i
BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight",
    "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight",
    "attn.o.weight": "self_attn.o_proj.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
QKV_BIAS = {  # Qwen2's, beside BLOCK
    "attn.q.bias": "self_attn.q_proj.bias",
    "attn.k.bias": "self_attn.k_proj.bias",
    "attn.v.bias": "self_attn.v_proj.bias",
}
QK_NORM = {  # Qwen3's, beside BLOCK
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
}
TOP = {
    "wte.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def weight_names(cfg: ModelConfig) -> WeightNames:
    block = BLOCK | (QKV_BIAS if cfg.qkv_bias else {}) | (QK_NORM if cfg.qk_norm else {})
    return WeightNames(TOP, {k: (v, False) for k, v in block.items()}, "model.layers")


def to_hf(cfg: ModelConfig, common: dict) -> dict:
    llama = rope_decoder_config(cfg, common) | {"rms_norm_eps": cfg.norm_eps, "hidden_act": cfg.mlp_activation}
    if cfg.qk_norm and cfg.qkv_bias:
        raise KilnError("model.qk_norm with model.qkv_bias: Qwen3's attention_bias puts a bias on the output too")
    if cfg.qk_norm:  # Qwen3: Llama's shape with q_norm and k_norm
        return llama | {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": cfg.head_dim,
            "attention_bias": False,
            "use_sliding_window": False,
        }
    if cfg.qkv_bias:  # Qwen2: q, k and v always have biases, nothing else does
        return llama | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False}
    return llama | {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "head_dim": cfg.head_dim,
        "attention_bias": False,
        "mlp_bias": False,
    }


def from_hf(hf: dict, where: str, kind: str) -> dict[str, tuple[Any, str]]:
    if hf.get("hidden_act", "silu") not in MLP_ACTIVATIONS:
        raise unsupported(where, "hidden_act", hf["hidden_act"], " or ".join(MLP_ACTIVATIONS))
    if kind == "qwen3" and hf.get("attention_bias"):
        raise unsupported(where, "attention_bias", True, "False")
    if kind == "llama":  # Llama's attention_bias puts one on the output projection too; Kiln has none
        for field in ("attention_bias", "mlp_bias"):
            if hf.get(field):
                raise unsupported(where, field, True, "False (qkv biases: model_type qwen2)")
    if kind in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise unsupported(where, "use_sliding_window", True, "full attention in every layer: False")
    fields, scaling = rope_decoder_fields(hf, where)
    rope_key = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"
    return fields | {
        "family": ("llama", f"model_type {kind!r}, Kiln family"),
        "seq_len": (hf["max_position_embeddings"], "max_position_embeddings"),
        "rope_scaling": (scaling, rope_key),
        "norm_eps": (hf.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        "tie_embeddings": (hf.get("tie_word_embeddings", False), "tie_word_embeddings"),
        # Qwen2's q, k, v always have biases; Llama's attention_bias (refused above) has one on o too
        "qkv_bias": (kind == "qwen2", "model_type 'qwen2', q/k/v biases" if kind == "qwen2" else "attention_bias"),
        "qk_norm": (kind == "qwen3", "model_type 'qwen3', q_norm and k_norm" if kind == "qwen3" else "model_type"),
        "mlp_activation": (hf.get("hidden_act", "silu"), "hidden_act"),
    }
