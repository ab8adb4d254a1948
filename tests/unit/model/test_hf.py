"""Hugging Face interop against transformers itself: an export loads with
AutoModelForCausalLM.from_pretrained and gives our logits (fp32, 1e-4); transformers' own models
import back; the exported tokenizer encodes as Kiln's does."""

import dataclasses
import json

import pytest
import torch
from conftest import typed_section
from hf_folder import write_hf_folder
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3ForCausalLM,
)

from kiln import hf
from kiln.config.models import model_config
from kiln.data.tokenizer import EOS, load_tokenizer
from kiln.data.tokenizer_build import build_tokenizer, write_tokenizer
from kiln.errors import KilnError
from kiln.io import write_json
from kiln.model.build import build_model

VOCAB, SEQ = 576, 32
SMALL = {  # registry flavours shrunk by overrides: the same code paths as the full sizes
    "gpt2-124m": {"flavour": "gpt2-124m", "n_layer": 2, "n_head": 4, "d_model": 64},
    "gpt2-custom": {"n_layer": 2, "n_head": 2, "d_model": 32},  # bias-free: exports zero biases
    "llama3.2-1b": {"flavour": "llama3.2-1b", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64, "d_ff": 96},
    "llama-untied": {"flavour": "debug", "n_layer": 1, "d_model": 64, "n_head": 4, "tie_embeddings": False},
    # the recipe options transformers has: QK-norm as Qwen3, squared ReLU as hidden_act relu2
    "llama-qk-norm-relu2": {
        "n_layer": 2,
        "n_head": 4,
        "d_model": 64,
        "family": "llama",
        "qk_norm": True,
        "mlp_activation": "relu2",
    },
    "llama-relu2": {"n_layer": 2, "n_head": 4, "d_model": 64, "family": "llama", "mlp_activation": "relu2"},
}
CLASSES = {"gpt2-124m": GPT2LMHeadModel, "gpt2-custom": GPT2LMHeadModel, "llama-qk-norm-relu2": Qwen3ForCausalLM}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def _trained_looking(section: dict):
    """A model whose biases and norm gains are not at their init values, so a mapping that dropped
    or swapped them would show in the logits."""
    torch.manual_seed(0)
    model = build_model(model_config(section, VOCAB, SEQ)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", SMALL)
def test_export_loads_in_transformers_with_matching_logits(name, tmp_path, tokenizer_path):
    model = _trained_looking(SMALL[name])
    hf.export(model, tmp_path / "hf", tokenizer_path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    family = model.config.family
    assert type(theirs) is CLASSES.get(name, LlamaForCausalLM)
    assert theirs.config.vocab_size == VOCAB
    assert theirs.num_parameters() >= model.num_params(non_embedding=False)  # + zero biases if bias-free
    idx = _ids()
    with torch.no_grad():
        ours = model(idx)[0]
        torch.testing.assert_close(theirs(idx).logits, ours, rtol=0, atol=1e-4)
        # ...and back again: the same model, bit for bit.
        back = hf.load(tmp_path / "hf")
        torch.testing.assert_close(back(idx)[0], ours, rtol=0, atol=1e-5)
    # The same shape (GPT-2's context is its position table; a bias-free GPT comes back with zero biases).
    expected = dataclasses.replace(model.config, seq_len=back.config.seq_len, bias=family == "gpt2")
    assert back.config == expected


def test_export_is_all_transformers_needs(tmp_path, tokenizer_path):
    hf.export(_trained_looking(SMALL["llama3.2-1b"]), tmp_path / "hf", tokenizer_path)
    files = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert files == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert config["eos_token_id"] == load_tokenizer(tokenizer_path).token_to_id(EOS)


def test_exported_tokenizer_encodes_as_kilns(tmp_path, tokenizer_path):
    hf.export(_trained_looking(SMALL["gpt2-custom"]), tmp_path / "hf", tokenizer_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_tokenizer(tokenizer_path)
    text = "def f(x):\n    return {'a': x}  # <|endoftext|> and <fim_prefix> are plain text here\n"
    assert theirs.encode(text) == ours.encode(text, add_special_tokens=False).ids
    assert theirs.decode(theirs.encode(text)) == text
    assert theirs.eos_token == EOS and theirs.eos_token_id == ours.token_to_id(EOS)
    assert "<fim_middle>" in theirs.all_special_tokens


def test_transformers_gpt2_imports_with_matching_logits(tmp_path):
    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=48, n_layer=2, n_head=3)).eval()
    theirs.save_pretrained(tmp_path)
    ours = hf.load(tmp_path)
    assert (ours.config.family, ours.config.max_positions, ours.config.bias) == ("gpt2", 64, True)
    assert ours.num_params(non_embedding=False) == theirs.num_parameters()
    idx = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], theirs(idx).logits, rtol=0, atol=1e-4)


def test_transformers_llama_imports_with_matching_logits(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        tie_word_embeddings=False,
    )
    theirs = LlamaForCausalLM(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = hf.load(tmp_path)
    assert (ours.config.n_kv_head, ours.config.rope_theta, ours.config.tie_embeddings) == (2, 1000.0, False)
    idx = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], theirs(idx).logits, rtol=0, atol=1e-4)


def test_import_errors_name_the_file_and_what_is_missing(tmp_path):
    with pytest.raises(KilnError, match="config.json: not found"):
        hf.load(tmp_path)
    config = {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KilnError, match="rope_type 'llama3' needs rope_parameters.low_freq_factor, high_freq_factor"):
        hf.load(tmp_path)
    v4_style = {k: v for k, v in config.items() if k != "rope_parameters"} | {
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0},
    }
    (tmp_path / "config.json").write_text(json.dumps(v4_style))
    with pytest.raises(
        KilnError, match=r"rope_scaling.rope_type = 'yarn' is not supported \(Kiln supports default, llama3\)"
    ):
        hf.load(tmp_path)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KilnError, match="model.safetensors: not found"):
        hf.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(
        KilnError,
        match=r"model_type 'bert' is not one Kiln imports \(supported: gpt2, llama, qwen2, qwen3, starcoder2\)",
    ):
        hf.load(tmp_path)


def test_a_run_on_an_hf_sources_tokenizer_exports_the_sources_rows_and_file(tmp_path, raw_dir):
    """A drop-in continuation's export: the tokenizer stage kept the source's tokenizer (nothing appended),
    the model trained at Kiln's padded rows, and the export has exactly the source's rows (an untied head
    too) and its tokenizer.json byte for byte; it loads back (kiln.hf.load, and transformers) with the
    model's logits over those rows."""
    source = write_hf_folder(tmp_path / "source", vocab_size=300, model=False)
    cfg = typed_section("tokenizer", {"kind": "hf", "path": str(source), "heldout_docs": 3})
    tokenizer, stats = build_tokenizer(raw_dir, cfg, 7, [EOS])
    path = tmp_path / "tokenizer" / "tokenizer.json"
    path.parent.mkdir()
    write_tokenizer(tokenizer, cfg, stats, path)
    write_json(path.with_name("stats.json"), stats)
    n = stats["source_vocab_size"]
    assert stats["padded_vocab_size"] > n  # the padding the export leaves behind
    torch.manual_seed(0)
    model = build_model(model_config(SMALL["llama-untied"], stats["padded_vocab_size"], SEQ)).eval()
    hf.export(model, tmp_path / "hf", path)
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == n
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_shape()[0] for k in ("model.embed_tokens.weight", "lm_head.weight")} == {n}
    idx = torch.randint(0, n, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(idx)[0][..., :n]
        back = hf.load(tmp_path / "hf")
        assert back.config.vocab_size == n
        torch.testing.assert_close(back(idx)[0], ours, rtol=0, atol=1e-5)
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(theirs(idx).logits, ours, rtol=0, atol=1e-4)
