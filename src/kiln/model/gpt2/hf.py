"""GPT-2 against transformers' GPT2LMHeadModel, torch-free (kiln.model.registry.HF): config.json both
ways, and the parameter names (its Conv1D layers store the transpose of Kiln's Linear weights).
transformers' GPT-2 always has biases: a bias-free Kiln GPT exports zeros for them, and a checkpoint
imports with model.bias true."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.model.hf_fields import GELU_ACTIVATIONS, unsupported
from kiln.model.registry import WeightNames

if TYPE_CHECKING:
    from kiln.config.models import ModelConfig

MODEL_TYPES = ("gpt2",)
SECTION_KEYS = ("max_positions", "bias")

# Our name inside block i -> (theirs inside transformer.h.i, stored transposed)
BLOCK = {
    "ln_1.weight": ("ln_1.weight", False),
    "ln_1.bias": ("ln_1.bias", False),
    "attn.qkv.weight": ("attn.c_attn.weight", True),
    "attn.qkv.bias": ("attn.c_attn.bias", False),
    "attn.proj.weight": ("attn.c_proj.weight", True),
    "attn.proj.bias": ("attn.c_proj.bias", False),
    "ln_2.weight": ("ln_2.weight", False),
    "ln_2.bias": ("ln_2.bias", False),
    "mlp.up.weight": ("mlp.c_fc.weight", True),
    "mlp.up.bias": ("mlp.c_fc.bias", False),
    "mlp.down.weight": ("mlp.c_proj.weight", True),
    "mlp.down.bias": ("mlp.c_proj.bias", False),
}
TOP = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
    "lm_head.weight": "lm_head.weight",
}


def weight_names(cfg: ModelConfig) -> WeightNames:
    # OpenAI's own files name the weights without the "transformer." prefix
    return WeightNames(TOP, BLOCK, "transformer.h", zeros_for_missing=True, optional_prefix="transformer.")


def to_hf(cfg: ModelConfig, common: dict) -> dict:
    return common | {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_positions": cfg.max_positions,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.d_ff,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
    }


def from_hf(hf: dict, where: str, kind: str) -> dict[str, tuple[Any, str]]:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GELU_ACTIVATIONS:
        raise unsupported(where, "activation_function", activation, " or ".join(GELU_ACTIVATIONS))
    # GPT-2 variants Kiln's attention does not compute: unscaled or per-layer-scaled scores
    for field, plain in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(field, plain) != plain:
            raise unsupported(where, field, hf[field], f"{plain} only")
    if hf.get("add_cross_attention"):
        raise unsupported(where, "add_cross_attention", True, "decoder-only models: False")
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
