"""Hugging Face transformers interop: export to GPT2LMHeadModel / LlamaForCausalLM /
Qwen2ForCausalLM / Starcoder2ForCausalLM folders that `AutoModelForCausalLM.from_pretrained(dir)`
loads, and import such folders back, stock checkpoints too (their shape read by kiln.config.hf_source). A llama-family model
with q/k/v biases (model.qkv_bias) is Qwen2's architecture and exports as one; Llama 3.1's RoPE
scaling (model.rope_scaling) exports as rope_type "llama3".

An export holds config.json, model.safetensors (a tied head stored once, as transformers does) and,
given the run's tokenizer.json, the tokenizer as a PreTrainedTokenizerFast with Kiln's special
tokens. Weights are renamed, and for GPT-2 transposed (its Conv1D stores (in, out)); no model is
instantiated on the way out, so exporting costs one copy of the weights.

It sits above model and data rather than in model/: the tokenizer it writes is kiln.data's, and the
model package imports no data code.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kiln.config.hf_source import model_config_from_hf, read_config
from kiln.config.models import ModelConfig
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.tokenizer import EOS, bos_id, bos_token, load_tokenizer, role_id, token_roles
from kiln.errors import KilnError
from kiln.io import atomic_dir
from kiln.model.build import build_model
from kiln.model.gpt import GPT
from kiln.model.llama import Llama

# Our parameter name -> Hugging Face's: *_BLOCK inside block i (blocks.i. on our side,
# transformer.h.i. / model.layers.i. on theirs), *_TOP outside the blocks. True marks GPT-2's Conv1D
# weights, stored transposed.
GPT2_BLOCK = {
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
GPT2_TOP = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
    "lm_head.weight": "lm_head.weight",
}
LLAMA_BLOCK = {
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
QKV_BIAS = {  # Qwen2's, beside LLAMA_BLOCK
    "attn.q.bias": "self_attn.q_proj.bias",
    "attn.k.bias": "self_attn.k_proj.bias",
    "attn.v.bias": "self_attn.v_proj.bias",
}
LLAMA_TOP = {
    "wte.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
# StarCoder2: Llama's names for the norms and attention, each with a bias, and GPT-2's MLP names
STARCODER2_BLOCK = {
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
STARCODER2_TOP = LLAMA_TOP | {"norm.bias": "model.norm.bias"}


def _name_map(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """Every Kiln parameter name -> (Hugging Face name, transposed)."""
    if cfg.family == "gpt2":
        top, block, prefix = GPT2_TOP, GPT2_BLOCK, "transformer.h"
    else:
        if cfg.family == "starcoder2":  # biases only where config.bias puts them; norms always have one
            top = STARCODER2_TOP
            own = {k: v for k, v in STARCODER2_BLOCK.items() if cfg.bias or "norm" in k or k.endswith(".weight")}
        else:
            top, own = LLAMA_TOP, LLAMA_BLOCK | (QKV_BIAS if cfg.qkv_bias else {})
        block, prefix = {k: (v, False) for k, v in own.items()}, "model.layers"
    names = {ours: (theirs, False) for ours, theirs in top.items()}
    for i in range(cfg.n_layer):
        names.update({f"blocks.{i}.{ours}": (f"{prefix}.{i}.{theirs}", t) for ours, (theirs, t) in block.items()})
    return names


def hf_config(cfg: ModelConfig, eos_id: int = 0, bos_id: int | None = None) -> dict:
    """config.json for a Kiln model."""
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eos_id if bos_id is None else bos_id,  # a source's BOS, which starts every sample
        "eos_token_id": eos_id,
        "dtype": "float32",
    }
    if cfg.family == "gpt2":
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
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta, **dataclasses.asdict(cfg.rope_scaling)}
    rope_decoder = common | {  # the fields Llama, Qwen2 and StarCoder2 share
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "max_position_embeddings": cfg.seq_len,
        "rope_parameters": rope,
        "attention_dropout": cfg.dropout,
    }
    if cfg.family == "starcoder2":
        return rope_decoder | {
            "architectures": ["Starcoder2ForCausalLM"],
            "model_type": "starcoder2",
            "norm_epsilon": cfg.norm_eps,
            "hidden_act": "gelu_pytorch_tanh",
            "use_bias": cfg.bias,
            "sliding_window": cfg.sliding_window,
            "residual_dropout": cfg.dropout,
            "embedding_dropout": 0.0,  # Kiln's models drop nothing at the embedding
        }
    llama = rope_decoder | {"rms_norm_eps": cfg.norm_eps, "hidden_act": "silu"}
    if cfg.qkv_bias:  # Qwen2: q, k and v always have biases, nothing else does
        return llama | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False}
    return llama | {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "head_dim": cfg.head_dim,
        "attention_bias": False,
        "mlp_bias": False,
    }


def export(model: GPT | Llama, out_dir: Path, tokenizer_json: Path | None = None) -> None:
    """Write a transformers folder for `model` (and its tokenizer) to out_dir, atomically."""
    cfg = model.config
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        ours.pop("lm_head.weight")  # transformers re-ties it from the embedding on load
    hf_state = {}
    for name, (theirs, transposed) in _name_map(cfg).items():
        if name in ours:
            hf_state[theirs] = (ours.pop(name).t() if transposed else ours.pop(name)).contiguous()
        elif name.endswith(".bias") and cfg.family == "gpt2":
            # GPT-2 in transformers always has biases: a bias-free Kiln GPT exports zeros.
            weight = name[: -len("bias")] + "weight"
            rows = model.get_parameter(weight).shape[0] if "ln_" not in name else cfg.d_model
            hf_state[theirs] = torch.zeros(rows)
    if ours:
        raise KilnError(f"export: no Hugging Face name for {sorted(ours)}")
    tokenizer = None if tokenizer_json is None else load_tokenizer(tokenizer_json)
    eos_id = 0 if tokenizer is None else role_id(tokenizer, EOS)
    bos = None if tokenizer is None else bos_id(tokenizer)
    with atomic_dir(out_dir) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg, eos_id, bos), indent=2) + "\n", encoding="utf-8")
        save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer_json is not None:
            hf_tokenizer(tokenizer_json).save_pretrained(str(tmp))


def hf_tokenizer(tokenizer_json: Path):
    """Kiln's tokenizer as a PreTrainedTokenizerFast. split_special_tokens: text that spells a
    special token encodes as ordinary text, as in Kiln (kiln.data.tokenizer). Each role is the
    run's token for it: a source's own (tokenizer kind hf, e.g. </s>) or Kiln's spelling. The BOS is
    the source's when it starts every document with one (kiln.data.tokenizer.bos_token: the tokenizer.json
    keeps the source's post-processor, which adds it), else the end-of-text token, as before."""
    from transformers import PreTrainedTokenizerFast

    roles = token_roles(tokenizer_json)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json),
        bos_token=bos_token(tokenizer_json) or roles[EOS],
        eos_token=roles[EOS],
        unk_token=roles[EOS],
        pad_token=roles[EOS],
        additional_special_tokens=[roles[t] for t in SPECIAL_TOKENS[1:]],
        split_special_tokens=True,
    )


def _read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    state = {}
    for name in files:
        path = model_dir / name
        if not path.is_file():
            raise KilnError(f"{path}: not found (only safetensors checkpoints are read)")
        with safe_open(str(path), framework="pt") as f:
            state.update({k: f.get_tensor(k) for k in f.keys()})
    return state


def load(model_dir: Path) -> GPT | Llama:
    """A Kiln model from a transformers folder (an export of ours, or a GPT-2, Llama, Qwen2 or
    StarCoder2 checkpoint: kiln.config.hf_source.MODEL_TYPES), its shape read from config.json."""
    model_dir = Path(model_dir)
    cfg = model_config_from_hf(read_config(model_dir), model_dir / "config.json")
    theirs = _read_hf_weights(model_dir)
    if cfg.family == "gpt2":  # OpenAI's own files name the weights without the "transformer." prefix
        theirs = {
            (k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v for k, v in theirs.items()
        }
    state = {}
    for ours, (name, transposed) in _name_map(cfg).items():
        if ours == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if name not in theirs:
            raise KilnError(f"{model_dir}: weight {name} is missing")
        state[ours] = (theirs[name].t() if transposed else theirs[name]).float()
    if cfg.tie_embeddings:  # one tensor under both names, as a tied model's state_dict has it
        state["lm_head.weight"] = state["wte.weight"]
    model = build_model(cfg)
    model.load_state_dict(state)
    return model.eval()
