"""The recipe options (kiln.config.models.RECIPE_OPTIONS: QK-norm, ReLU^2, zero-initialised projections,
logit soft-capping, value embeddings): off, the model and its saved config are today's; on, each changes
the function, keeps the shapes and the parameter count the spec states, and decodes through the KV
cache as the full forward computes; a family that does not build one refuses it by name."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kiln.config.models import OPTIONS, ModelConfig, ModelConfigError
from kiln.model.build import build_model, load_model, save_model
from kiln.model.kv_cache import KVCache
from kiln.model.loss import lm_loss, softcap

BASE = ModelConfig(family="llama", vocab_size=128, seq_len=16, n_layer=3, n_head=4, n_kv_head=2, d_model=32)
ON = {
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(mlp_activation="relu2"),
    "zero_init": dict(zero_init_projections=True),
    "softcap": dict(logit_softcap=2.0),
    "value_embeddings": dict(value_embeddings=2),
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
    explicit = dataclasses.replace(
        BASE, qk_norm=False, mlp_activation="silu", zero_init_projections=False, logit_softcap=None, value_embeddings=0
    )
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
    cache = KVCache.for_model(model, torch.zeros(1, dtype=torch.long), 12)
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


def test_softcap_bounds_the_logits_in_forward():
    cap = 0.5
    model = _trained_looking(dataclasses.replace(BASE, logit_softcap=cap))
    with torch.no_grad():
        logits = model(_ids())[0]
        uncapped = model.lm_head(model.norm(_hidden(model, _ids())))
    assert logits.abs().max() < cap
    torch.testing.assert_close(logits, cap * torch.tanh(uncapped / cap))


def _hidden(model, idx):
    """The blocks' output before the final norm (the decoder's forward, without the head)."""
    x = model.wte(idx)
    cos, sin = model.rope_cos[: idx.size(1)], model.rope_sin[: idx.size(1)]
    for block, inputs in zip(model.blocks, model._block_inputs(idx)):
        x = block(x, cos, sin, None, **inputs)
    return x


@pytest.mark.parametrize("chunk_rows", [1, 7, 37, 4096])
def test_the_chunked_loss_with_a_cap_equals_the_plain_capped_loss(chunk_rows):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 37, 16, generator=g, requires_grad=True)
    w = (0.5 * torch.randn(96, 16, generator=g)).requires_grad_()
    y = torch.randint(0, 96, (3, 37), generator=g)
    plain = F.cross_entropy(softcap(F.linear(h, w).float(), 3.0).flatten(0, 1), y.flatten())
    plain.backward()
    grads = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    chunked = lm_loss(h, w, y, chunk_rows=chunk_rows, cap=3.0)
    chunked.backward()
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close((h.grad, w.grad), grads, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(lm_loss(h, w, y, chunk_rows=chunk_rows), plain)  # the cap mattered


def test_value_embeddings_are_tables_of_the_value_width_for_the_first_blocks():
    cfg = dataclasses.replace(BASE, value_embeddings=2)
    model = _model(cfg)
    assert len(model.value_embeds) == 2
    assert model.value_embeds[0].weight.shape == (cfg.vocab_size, cfg.n_kv_head * cfg.head_dim)
    inputs = model._block_inputs(_ids())
    assert [set(i) for i in inputs] == [{"value"}, {"value"}, set()]


@pytest.mark.parametrize("family", ["gpt2", "starcoder2"])
@EACH
def test_a_family_that_does_not_build_an_option_refuses_it_by_name(family, option):
    with pytest.raises(ModelConfigError, match=f"model.{next(iter(ON[option]))}: the {family} family"):
        ModelConfig(family=family, vocab_size=128, seq_len=16, n_layer=2, n_head=2, d_model=32, **ON[option])


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(mlp_activation="gelu"), "mlp_activation"),
        (dict(logit_softcap=0.0), "logit_softcap"),
        (dict(value_embeddings=4), "value_embeddings"),
    ],
)
def test_out_of_range_options_are_refused_by_name(bad, key):
    with pytest.raises(ModelConfigError, match=f"model.{key}"):
        dataclasses.replace(BASE, **bad)
