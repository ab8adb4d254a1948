"""Every model family: shapes, initial loss, causality, weight tying, parameter counts,
determinism, save/load (activation checkpointing: tests/unit/train/test_activation_checkpointing.py)."""

import math

import pytest
import torch

from kiln.config.models import ModelConfig
from kiln.model.build import build_model, load_model, save_model
from kiln.model.gpt2.module import GPT
from kiln.model.layers import apply_rope, rope_tables
from kiln.model.llama.module import Llama
from kiln.model.starcoder2.module import StarCoder2

GPT_CFG = ModelConfig(family="gpt2", vocab_size=128, seq_len=16, n_layer=2, n_head=2, d_model=32)
LLAMA_CFG = ModelConfig(family="llama", vocab_size=128, seq_len=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
STARCODER2_CFG = ModelConfig(
    family="starcoder2", vocab_size=128, seq_len=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32, bias=True
)
CONFIGS = pytest.mark.parametrize("cfg", [GPT_CFG, LLAMA_CFG, STARCODER2_CFG], ids=["gpt2", "llama", "starcoder2"])


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def _model(cfg: ModelConfig, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def _ids(B: int, T: int, vocab: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def test_build_model_picks_the_family():
    assert type(build_model(GPT_CFG)) is GPT and type(build_model(LLAMA_CFG)) is Llama
    assert type(build_model(STARCODER2_CFG)) is StarCoder2


@CONFIGS
def test_forward_shapes(cfg):
    model = _model(cfg)
    idx = _ids(3, 10)
    logits, loss = model(idx)
    assert logits.shape == (3, 10, cfg.vocab_size)
    assert loss is None
    logits, loss = model(idx, _ids(3, 10, seed=2))
    assert logits is None  # the loss is computed in chunks, without the logits (tests/unit/model/test_loss.py)
    assert loss.ndim == 0 and torch.isfinite(loss)


@CONFIGS
def test_loss_at_init_close_to_uniform(cfg):
    model = _model(cfg)
    with torch.no_grad():
        _, loss = model(_ids(4, cfg.seq_len), _ids(4, cfg.seq_len, seed=3))
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.3


@CONFIGS
def test_causal_changing_a_token_leaves_earlier_positions_unchanged(cfg):
    model = _model(cfg)
    idx = _ids(2, cfg.seq_len)
    t = 9
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    # ...and the change is visible from position t on (the test would pass trivially otherwise).
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4


@CONFIGS
def test_lm_head_shares_storage_with_token_embedding(cfg):
    model = _model(cfg)
    assert model.lm_head.weight is model.wte.weight
    with torch.no_grad():
        model.wte.weight[0, 0] = 123.0
    assert model.lm_head.weight[0, 0].item() == 123.0


def test_untied_head_is_its_own_matrix_and_counts_once_more():
    tied, untied = _model(LLAMA_CFG), _model(ModelConfig(**LLAMA_CFG.to_dict() | {"tie_embeddings": False}))
    assert untied.lm_head.weight is not untied.wte.weight
    table = LLAMA_CFG.vocab_size * LLAMA_CFG.d_model
    assert untied.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + table
    # The untied table is only looked up: it leaves the FLOPs count; the head stays in it.
    assert untied.num_params(non_embedding=True) == tied.num_params(non_embedding=True)


def test_gpt_num_params_counts_tied_weight_once_and_excludes_only_positions():
    model = _model(GPT_CFG)
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    total = sum(unique.values())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params(non_embedding=True) == total - GPT_CFG.seq_len * GPT_CFG.d_model
    # The token table (shared with the head) stays in the non-embedding count.
    assert model.num_params(non_embedding=True) > GPT_CFG.vocab_size * GPT_CFG.d_model


def test_llama_grouped_query_attention_shapes():
    attn = _model(LLAMA_CFG).blocks[0].attn
    D = LLAMA_CFG.head_dim
    assert attn.q.weight.shape == (4 * D, 32) and attn.k.weight.shape == (2 * D, 32)
    assert attn.v.weight.shape == (2 * D, 32) and attn.o.weight.shape == (32, 4 * D)


def test_rope_rotates_by_relative_position():
    """A rotation: norms kept, and the q.k score depends only on the distance between positions."""
    cos, sin = rope_tables(head_dim=8, seq_len=12, theta=10000.0)
    torch.manual_seed(0)
    q, k = torch.randn(8), torch.randn(8)
    rq = apply_rope(q.expand(1, 1, 12, 8), cos, sin)[0, 0]  # q at every position
    rk = apply_rope(k.expand(1, 1, 12, 8), cos, sin)[0, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(12))
    torch.testing.assert_close(rq[0], q)  # position 0 is not rotated
    torch.testing.assert_close(rq[5] @ rk[2], rq[9] @ rk[6], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(rq[5] @ rk[2], rq[5] @ rk[3])


@CONFIGS
def test_sequence_longer_than_the_context_raises(cfg):
    model = _model(cfg)
    model(_ids(1, cfg.seq_len))  # exactly seq_len is fine
    with pytest.raises(ValueError, match="positions"):
        model(_ids(1, cfg.seq_len + 1))


@CONFIGS
def test_same_seed_same_init_different_seed_different_init(cfg):
    sa, sb, sc = (_model(cfg, seed=s).state_dict() for s in (5, 5, 6))
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert not torch.equal(sa["wte.weight"], sc["wte.weight"])


@pytest.mark.parametrize("family,proj", [("gpt2", "attn.proj"), ("llama", "attn.o")])
def test_residual_projections_are_scaled_down(family, proj):
    model = _model(ModelConfig(family=family, vocab_size=64, seq_len=8, n_layer=8, n_head=2, d_model=64))
    std_proj = model.blocks[0].get_parameter(f"{proj}.weight").std().item()
    std_in = model.blocks[0].get_parameter("attn.qkv.weight" if family == "gpt2" else "attn.q.weight").std().item()
    assert std_proj == pytest.approx(0.02 / math.sqrt(16), rel=0.2)
    assert std_in == pytest.approx(0.02, rel=0.2)


@CONFIGS
def test_save_and_load_round_trip(cfg, tmp_path):
    model = _model(cfg)
    save_model(cfg, model.state_dict(), tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config == cfg and not loaded.training
    assert loaded.lm_head.weight is loaded.wte.weight  # tying survives the save/load
    idx = _ids(2, cfg.seq_len)
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)
