"""Hugging Face transformers interop: export to folders that `AutoModelForCausalLM.from_pretrained(dir)`
loads (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Starcoder2ForCausalLM), and import such
folders back, stock checkpoints too (their shape read by kiln.config.hf_source). What is each family's
(its config.json, its parameter names) is its mapping, kiln.model.<family>.hf: a llama-family model
with q/k/v biases (model.qkv_bias) exports as Qwen2, one with QK-norm (model.qk_norm) as Qwen3, Llama
3.1's RoPE scaling (model.rope_scaling) as rope_type "llama3".

An export holds config.json, model.safetensors (a tied head stored once, as transformers does) and,
given the run's tokenizer.json, the tokenizer as a PreTrainedTokenizerFast with Kiln's special
tokens. Weights are renamed, and transposed where the family's mapping says (GPT-2's Conv1D stores
(in, out)); no model is instantiated on the way out, so exporting costs one copy of the weights. A run
on an hf source's tokenizer (tokenizer kind hf) exports its tokenizer.json as the run has it, byte for
byte, and the source's vocab_size rows (more only for tokens the run appended): Kiln's padding to a
multiple of 64 stays behind (kiln.data.tokenizer.export_vocab_size), so a continuation with FIM off is
a drop-in replacement for its source. `load` builds a model of the rows a folder has.

It sits above model and data rather than in model/: the tokenizer it writes is kiln.data's, and the
model package imports no data code.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kiln.config.hf_source import model_config_from_hf, read_config
from kiln.config.models import ModelConfig
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.tokenizer import (
    EOS,
    bos_id,
    bos_token,
    export_vocab_size,
    load_tokenizer,
    role_id,
    source_tokenizer_sha256,
    token_roles,
)
from kiln.errors import KilnError
from kiln.io import atomic_dir
from kiln.model import registry
from kiln.model.build import build_model

VOCABULARY_ROWS = ("wte.weight", "lm_head.weight")  # a row per token id, in every family (kiln.model.decoder)


def _name_map(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """Every Kiln parameter name -> (Hugging Face name, transposed), from the family's mapping."""
    names = registry.get(cfg.family).hf.weight_names(cfg)
    out = {ours: (theirs, False) for ours, theirs in names.top.items()}
    for i in range(cfg.n_layer):
        out.update(
            {f"blocks.{i}.{ours}": (f"{names.prefix}.{i}.{theirs}", t) for ours, (theirs, t) in names.block.items()}
        )
    return out


def hf_config(cfg: ModelConfig, eos_id: int = 0, bos_id: int | None = None) -> dict:
    """config.json for a Kiln model: what every family writes, then the family's own fields."""
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eos_id if bos_id is None else bos_id,  # a source's BOS, which starts every sample
        "eos_token_id": eos_id,
        "dtype": "float32",
    }
    return registry.get(cfg.family).hf.to_hf(cfg, common)


def export(model: torch.nn.Module, out_dir: Path, tokenizer_json: Path | None = None) -> None:
    """Write a transformers folder for `model` (and its tokenizer) to out_dir, atomically."""
    padded = model.config.vocab_size
    rows = padded if tokenizer_json is None else export_vocab_size(tokenizer_json, padded)
    cfg = dataclasses.replace(model.config, vocab_size=rows)
    hf_config(cfg)  # first: a model transformers cannot represent is refused, naming the setting
    zeros_for_missing = registry.get(cfg.family).hf.weight_names(cfg).zeros_for_missing
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if rows < padded:  # Kiln's padding rows, which no token has, stay behind
        ours.update({name: ours[name][:rows].clone() for name in VOCABULARY_ROWS})
    if cfg.tie_embeddings:
        ours.pop("lm_head.weight")  # transformers re-ties it from the embedding on load
    hf_state = {}
    for name, (theirs, transposed) in _name_map(cfg).items():
        if name in ours:
            hf_state[theirs] = (ours.pop(name).t() if transposed else ours.pop(name)).contiguous()
        elif name.endswith(".bias") and zeros_for_missing:
            # transformers' class always has the bias (GPT-2's): a bias-free Kiln model exports zeros,
            # one per row of the weight beside it (a LayerNorm's gain: d_model)
            hf_state[theirs] = torch.zeros(model.get_parameter(name[: -len("bias")] + "weight").shape[0])
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
            if source_tokenizer_sha256(tokenizer_json):  # an hf source's tokenizer: its file as the run has it
                shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")


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
        additional_special_tokens=[roles[t] for t in SPECIAL_TOKENS[1:] if t in roles],  # those it holds
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


def load(model_dir: Path) -> torch.nn.Module:
    """A Kiln model from a transformers folder (an export of ours, or a checkpoint of a model_type some
    family imports: kiln.model.registry.model_types), its shape read from config.json."""
    model_dir = Path(model_dir)
    cfg = model_config_from_hf(read_config(model_dir), model_dir / "config.json")
    theirs = _read_hf_weights(model_dir)
    root = registry.get(cfg.family).hf.weight_names(cfg).optional_prefix
    # a checkpoint may name its weights without the root (OpenAI's GPT-2 files: "transformer."); the head
    # is top-level in every transformers class
    if root:
        theirs = {(k if k.startswith((root, "lm_head.")) else f"{root}{k}"): v for k, v in theirs.items()}
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
