"""The recipe options (kiln.config.models.RECIPE_OPTIONS: QK-norm, ReLU^2, zero-initialised projections):
off, the model and its saved config are today's; on, each changes
the function, keeps the shapes and the parameter count the spec states, and decodes through the KV
cache as the full forward computes; a family that does not build one refuses it by name."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kiln.config.models import OPTIONS, ModelConfig, ModelConfigError
from kiln.model.build import build_model, load_model, save_model
from kiln.model.kv_cache import KVCache

BASE = ModelConfig(family="llama", vocab_size=128, seq_len=16, n_layer=3, n_head=4, n_kv_head=2, d_model=32)
ON = {
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(mlp_activation="relu2"),
    "zero_init": dict(zero_init_projections=True),
}
EACH = pytest.mark.parametrize("option", ON)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def _model(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def _trained_looking(cfg: ModelConfig) -> torch.nn.Module:
    """Weights moved off their init (zero projections included), so each option shows in the logits."""
    model = _model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _ids(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(seed))


def test_options_at_their_defaults_are_todays_model_and_config():
    explicit = dataclasses.replace(BASE, qk_norm=False, mlp_activation="silu", zero_init_projections=False)
    assert explicit == BASE
    saved = BASE.to_dict()
    assert not set(saved) & set(OPTIONS)  # model_config.json and the fingerprint as before the options
    ours, before = _model(BASE).state_dict(), _model(explicit).state_dict()
    assert list(ours) == list(before) and not any("norm" in k and "attn." in k for k in ours)
    assert all(torch.equal(ours[k], before[k]) for k in ours)


@EACH
def test_an_option_on_changes_the_logits_not_the_shapes(option):
    cfg = dataclasses.replace(BASE, **ON[option])
    idx = _ids()
    with torch.no_grad():
        on, off = _trained_looking(cfg)(idx)[0], _trained_looking(BASE)(idx)[0]
    assert on.shape == off.shape == (2, 16, 128)
    assert not torch.allclose(on, off, atol=1e-4)


@EACH
def test_the_spec_counts_the_built_parameters(option):
    cfg = dataclasses.replace(BASE, **ON[option])
    model = _model(cfg)
    assert cfg.num_params(non_embedding=False) == model.num_params(non_embedding=False)
    assert cfg.num_params(non_embedding=True) == model.num_params(non_embedding=True)


@EACH
def test_a_saved_model_keeps_its_option(option, tmp_path):
    cfg = dataclasses.replace(BASE, **ON[option])
    model = _trained_looking(cfg)
    assert set(ON[option]) <= set(cfg.to_dict())
    save_model(cfg, model.state_dict(), tmp_path)
    back = load_model(tmp_path)
    assert back.config == cfg
    with torch.no_grad():
        assert torch.equal(back(_ids())[0], model(_ids())[0])


@EACH
@torch.no_grad()
def test_cached_decoding_matches_the_full_forward(option):
    model = _trained_looking(dataclasses.replace(BASE, **ON[option]))
    ids = _ids(1, 12)
    full, _ = model(ids)
    cache = KVCache.for_model(model, [0], 12)
    for start, end in [(0, 5), (5, 6), (6, 12)]:
        logits, _ = model(ids[:, start:end], cache=cache)
        torch.testing.assert_close(logits[0, 0], full[0, end - 1], rtol=0, atol=1e-5)


def test_qk_norm_normalises_each_heads_query_and_key():
    model = _trained_looking(dataclasses.replace(BASE, qk_norm=True))
    attn = model.blocks[0].attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (BASE.head_dim,)
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, args, out: seen.setdefault("q", out))
    model(_ids())
    rms = (seen["q"] / attn.q_norm.weight).pow(2).mean(-1).sqrt()  # (B, T, H): each head's query, normed
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-3)


def test_relu2_squares_the_gates_relu():
    mlp = _model(dataclasses.replace(BASE, mlp_activation="relu2")).blocks[0].mlp
    x = torch.randn(2, 5, BASE.d_model)
    expected = mlp.down(F.relu(mlp.gate(x)) ** 2 * mlp.up(x))
    torch.testing.assert_close(mlp(x), expected, rtol=0, atol=0)


def test_zero_init_projections_start_every_block_as_the_identity():
    model = _model(dataclasses.replace(BASE, zero_init_projections=True))
    for block in model.blocks:
        assert not block.attn.o.weight.any() and not block.mlp.down.weight.any()
    idx = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], model.lm_head(model.norm(model.wte(idx))), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "starcoder2"])
@EACH
def test_a_family_that_does_not_build_an_option_refuses_it_by_name(family, option):
    with pytest.raises(ModelConfigError, match=f"model.{next(iter(ON[option]))}: the {family} family"):
        ModelConfig(family=family, vocab_size=128, seq_len=16, n_layer=2, n_head=2, d_model=32, **ON[option])


def test_an_unknown_activation_is_refused_by_name():
    with pytest.raises(ModelConfigError, match="model.mlp_activation: 'gelu' is not one of silu, relu2"):
        dataclasses.replace(BASE, mlp_activation="gelu")
