"""Named flavours and ModelConfig: pinned parameter counts, derived fields, overrides, and errors
that name the model.<key> at fault."""

from pathlib import Path

import pytest
import torch

from kiln import config as kiln_config
from kiln.config.models import FLAVOURS, ModelConfig, ModelConfigError, check_section, model_config
from kiln.model.build import build_model


def _count(cfg: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: a 1.5B model costs no memory
        return build_model(cfg).num_params(non_embedding=False)


def test_gpt2_124m_has_gpt2s_parameter_count():
    """What "124M" means: OpenAI's GPT-2 with its unpadded 50,257-token vocabulary, 1,024 learned
    positions, biases everywhere and the head tied to the embedding."""
    cfg = model_config({"flavour": "gpt2-124m"}, vocab_size=50257, seq_len=1024)
    assert (cfg.bias, cfg.max_positions, cfg.tie_embeddings, cfg.d_ff) == (True, 1024, True, 3072)
    assert _count(cfg) == 124_439_808


def test_llama32_1b_has_the_count_seed_000_logged():
    cfg = model_config({"flavour": "llama3.2-1b"}, vocab_size=32768, seq_len=8192)
    assert (cfg.d_model, cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.d_ff) == (2048, 16, 32, 8, 8192)
    assert (cfg.rope_theta, cfg.tie_embeddings, cfg.head_dim) == (500000.0, True, 64)
    assert _count(cfg) == 1_040_254_976


@pytest.mark.parametrize(
    "name,count",
    [
        ("gpt2-350m", 354_823_168),
        ("gpt2-774m", 774_030_080),
        ("gpt2-1.5b", 1_557_611_200),
    ],
)
def test_larger_gpt2_flavours_match_openais_checkpoints(name, count):
    assert _count(model_config({"flavour": name}, vocab_size=50257, seq_len=1024)) == count


def test_every_flavour_names_its_source_and_builds():
    for name, flavour in FLAVOURS.items():
        assert flavour.source.startswith("https://"), name
        assert _count(model_config({"flavour": name}, vocab_size=512, seq_len=256)) > 0


def test_debug_flavour_is_torchtitans_debugmodel():
    cfg = model_config({"flavour": "debug"}, vocab_size=2048, seq_len=2048)
    assert (cfg.family, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.d_ff) == ("llama", 256, 6, 16, 768)


def test_section_overrides_a_flavour_and_plain_dims_mean_gpt2():
    cfg = model_config(
        {"flavour": "llama3.2-1b", "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "d_ff": 128},
        vocab_size=576,
        seq_len=32,
    )
    assert (cfg.family, cfg.n_layer, cfg.rope_theta, cfg.vocab_size, cfg.seq_len) == ("llama", 2, 500000.0, 576, 32)
    plain = model_config({"n_layer": 4, "n_head": 4, "d_model": 256}, vocab_size=8192, seq_len=256)
    assert (plain.family, plain.bias, plain.max_positions, plain.d_ff, plain.n_kv_head) == ("gpt2", False, 256, 1024, 4)


def test_saved_config_round_trips_with_every_field_concrete():
    cfg = model_config({"flavour": "debug"}, vocab_size=512, seq_len=64)
    assert None not in (cfg.n_kv_head, cfg.d_ff)
    assert ModelConfig(**cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "section,seq_len,message",
    [
        ({"n_layer": 2, "n_head": 3, "d_model": 64}, 64, "model.d_model: 64 is not divisible by model.n_head=3"),
        ({"flavour": "gpt3-175b"}, 64, "model.flavour: 'gpt3-175b' is not a known flavour (known: debug, gpt2-124m"),
        ({"flavour": "gpt2-124m"}, 2048, "model.max_positions: 1024 learned positions cannot cover shard.seq_len=2048"),
        ({"flavour": "debug", "n_kv_head": 5}, 64, "model.n_kv_head: model.n_head=16 is not a multiple of 5"),
        ({"flavour": "debug", "bias": True}, 64, "model.bias: llama has no biases"),
        ({"flavour": "debug", "family": "gpt2"}, 64, "model.family: flavour 'debug' is llama, not gpt2"),
        (
            {"family": "llama", "n_layer": 1, "n_head": 4, "d_model": 36},
            64,
            "model.n_head: RoPE needs an even head dim",
        ),
        ({"n_layer": 1, "n_head": 2, "d_model": 8, "n_kv_head": 1}, 64, "model.n_kv_head: gpt2 has one key/value head"),
        (
            {"family": "starcoder2", "n_layer": 1, "n_head": 2, "d_model": 8, "sliding_window": 32},
            64,
            "model.sliding_window: the source attends over the last 32 positions",
        ),
        (
            {"family": "starcoder2", "n_layer": 1, "n_head": 2, "d_model": 8, "qkv_bias": True},
            64,
            "model.qkv_bias: llama only (starcoder2's biases",
        ),
    ],
)
def test_bad_shapes_name_the_key(section, seq_len, message):
    assert any(message in p for p in check_section(section, seq_len)), check_section(section, seq_len)
    with pytest.raises(ModelConfigError, match="invalid model"):
        model_config(section, vocab_size=64, seq_len=seq_len)


def test_config_validation_reports_model_problems_and_accepts_flavours():
    base = kiln_config.load(Path(__file__).parents[2] / "configs" / "tiny.yaml")
    base.pop("model")
    ok = kiln_config.validate(base | {"model": {"flavour": "debug", "n_layer": 2}})
    assert ok["model"] == {"flavour": "debug", "n_layer": 2}  # no defaults filled over the flavour's
    with pytest.raises(kiln_config.ConfigError, match="model.flavour: 'nope' is not a known flavour"):
        kiln_config.validate(base | {"model": {"flavour": "nope"}})
    with pytest.raises(kiln_config.ConfigError, match="model: no flavour, so the shape itself: n_layer missing"):
        kiln_config.validate(base | {"model": {"n_head": 2, "d_model": 64}})


@pytest.mark.parametrize(
    "section",
    [
        {"flavour": "gpt2-124m"},
        {"flavour": "llama3.2-1b"},
        {"flavour": "debug"},
        {"flavour": "gpt2-124m", "tie_embeddings": False, "max_positions": 2048},
        {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "bias": True, "tie_embeddings": False},
        {"family": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64, "tie_embeddings": False},
        {"family": "starcoder2", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64, "bias": True},
        {"family": "starcoder2", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64, "tie_embeddings": False},
    ],
)
def test_parameter_count_from_the_shape_equals_the_built_model(section):
    """`kiln plan` counts parameters without building the model; the count must be the model's."""
    cfg = model_config(section, vocab_size=50304, seq_len=2048 if section.get("max_positions") else 1024)
    with torch.device("meta"):
        model = build_model(cfg)
    assert cfg.num_params(non_embedding=False) == model.num_params(non_embedding=False)
    assert cfg.num_params(non_embedding=True) == model.num_params(non_embedding=True)
