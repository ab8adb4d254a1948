"""Published checkpoints' config.json files (tests/hf_configs, sources in SOURCES.md) as Kiln's
loader reads them: the ones it imports give the shape the file states, the others are refused with
an error naming the field and why. Torch-free and fast: no model is built."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kiln.config.hf_source import model_config_from_hf, source_config
from kiln.config.models import RopeScaling
from kiln.errors import KilnError

HERE = Path(__file__).parents[2] / "hf_configs"


def read(name: str) -> dict:
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


# name -> the ModelConfig fields the file states (checked against the JSON itself below, too)
ACCEPTED = {
    "openai-community--gpt2": dict(
        family="gpt2",
        n_layer=12,
        n_head=12,
        n_kv_head=12,
        d_model=768,
        d_ff=3072,  # n_inner null: 4 * n_embd
        tie_embeddings=True,
        bias=True,
        qkv_bias=False,
        rope_scaling=None,
        vocab_size=50257,
        seq_len=1024,
        max_positions=1024,
        norm_eps=1e-5,
    ),
    "HuggingFaceTB--SmolLM2-135M": dict(
        family="llama",
        n_layer=30,
        n_head=9,
        n_kv_head=3,
        d_model=576,
        d_ff=1536,
        tie_embeddings=True,
        qkv_bias=False,
        rope_theta=100000.0,
        rope_scaling=None,
        vocab_size=49152,
        seq_len=8192,
        norm_eps=1e-5,
    ),
    "TinyLlama--TinyLlama-1.1B-Chat-v1.0": dict(
        family="llama",
        n_layer=22,
        n_head=32,
        n_kv_head=4,
        d_model=2048,
        d_ff=5632,
        tie_embeddings=False,
        qkv_bias=False,
        rope_theta=10000.0,
        rope_scaling=None,
        vocab_size=32000,
        seq_len=2048,
        norm_eps=1e-5,
    ),
    "meta-llama--Llama-3.2-1B": dict(
        family="llama",
        n_layer=16,
        n_head=32,
        n_kv_head=8,
        d_model=2048,
        d_ff=8192,
        tie_embeddings=True,
        qkv_bias=False,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(
            factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        ),
        vocab_size=128256,
        seq_len=131072,
        norm_eps=1e-5,
    ),
    "Qwen--Qwen2.5-0.5B": dict(
        family="llama",
        n_layer=24,
        n_head=14,
        n_kv_head=2,
        d_model=896,
        d_ff=4864,
        tie_embeddings=True,
        qkv_bias=True,  # model_type qwen2: biases on q, k, v
        bias=False,
        rope_theta=1000000.0,
        rope_scaling=None,
        vocab_size=151936,
        seq_len=32768,
        norm_eps=1e-6,
    ),
    "bigcode--starcoder2-15b": dict(
        family="starcoder2",
        n_layer=40,
        n_head=48,
        n_kv_head=4,
        d_model=6144,
        d_ff=24576,
        tie_embeddings=False,
        bias=True,  # use_bias: every Linear but the head
        qkv_bias=False,
        rope_theta=100000.0,
        rope_scaling=None,
        vocab_size=49152,
        seq_len=4096,  # max_position_embeddings is 16384; Kiln's full attention is exact up to the window
        sliding_window=4096,
        norm_eps=1e-5,
    ),
}

# name -> (regex the error must match: the field, its value, and what Kiln supports)
REFUSED = {
    "EleutherAI--pythia-1b": (
        r"model_type 'gpt_neox' is not one Kiln imports \(supported: gpt2, llama, qwen2, qwen3, starcoder2\)"
    ),
}


def test_every_saved_config_is_covered():
    assert {p.stem for p in HERE.glob("*.json")} == set(ACCEPTED) | set(REFUSED)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted(name):
    cfg = model_config_from_hf(read(name), f"{name}/config.json")
    for field, expected in ACCEPTED[name].items():
        assert getattr(cfg, field) == expected, field


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_numbers_are_the_files(name):
    """The expectations above restate the JSON, not what the loader happens to return."""
    hf, cfg = read(name), model_config_from_hf(read(name), name)
    rope_decoder = {
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_kv_head": "num_key_value_heads",
        "d_model": "hidden_size",
        "d_ff": "intermediate_size",
        "tie_embeddings": "tie_word_embeddings",
        "rope_theta": "rope_theta",
    }
    if hf["model_type"] == "gpt2":
        stated = {"n_layer": "n_layer", "n_head": "n_head", "d_model": "n_embd", "seq_len": "n_positions"}
    elif hf["model_type"] == "starcoder2":  # the context Kiln computes exactly is the sliding window
        stated = rope_decoder | {
            "seq_len": "sliding_window",
            "sliding_window": "sliding_window",
            "bias": "use_bias",
            "norm_eps": "norm_epsilon",
        }
    else:
        stated = rope_decoder | {"seq_len": "max_position_embeddings", "norm_eps": "rms_norm_eps"}
    stated["vocab_size"] = "vocab_size"
    for field, key in stated.items():
        assert getattr(cfg, field) == hf[key], (field, key)


def test_source_config_reads_a_folder(tmp_path):
    """The folder path (source_config) gives what the dict path does, for a file as published."""
    for name in ("openai-community--gpt2", "meta-llama--Llama-3.2-1B"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(HERE / f"{name}.json", folder / "config.json")
        assert source_config(folder) == model_config_from_hf(read(name), name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused(name):
    with pytest.raises(KilnError, match=REFUSED[name]):
        model_config_from_hf(read(name), f"{name}/config.json")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_through_the_folder(name, tmp_path):
    shutil.copy(HERE / f"{name}.json", tmp_path / "config.json")
    with pytest.raises(KilnError, match=re.escape(f"{tmp_path / 'config.json'}: ") + REFUSED[name]):
        source_config(tmp_path)
