"""The GPT model: shapes, initial loss, causality, weight tying, parameter counts, determinism."""

import math

import pytest
import torch

from kiln.model.gpt import GPT, GPTConfig

CFG = GPTConfig(vocab_size=128, seq_len=16, n_layer=2, n_head=2, d_model=32)


def _model(cfg: GPTConfig = CFG, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).eval()


def _ids(B: int, T: int, vocab: int = CFG.vocab_size, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def test_forward_shapes():
    model = _model()
    idx = _ids(3, 10)
    logits, loss = model(idx)
    assert logits.shape == (3, 10, CFG.vocab_size)
    assert loss is None
    logits, loss = model(idx, _ids(3, 10, seed=2))
    assert logits.shape == (3, 10, CFG.vocab_size)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_loss_at_init_close_to_uniform():
    model = _model()
    with torch.no_grad():
        _, loss = model(_ids(4, CFG.seq_len), _ids(4, CFG.seq_len, seed=3))
    assert abs(loss.item() - math.log(CFG.vocab_size)) < 0.3


def test_causal_changing_a_token_leaves_earlier_positions_unchanged():
    model = _model()
    idx = _ids(2, CFG.seq_len)
    t = 9
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    # ...and the change is visible from position t on (the test would pass trivially otherwise).
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4


def test_lm_head_shares_storage_with_token_embedding():
    model = _model()
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    with torch.no_grad():
        model.wte.weight[0, 0] = 123.0
    assert model.lm_head.weight[0, 0].item() == 123.0


def test_num_params_counts_tied_weight_once_and_excludes_only_positions():
    model = _model()
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    total = sum(unique.values())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params(non_embedding=True) == total - CFG.seq_len * CFG.d_model
    # The token table (shared with the head) stays in the non-embedding count.
    assert model.num_params(non_embedding=True) > CFG.vocab_size * CFG.d_model


def test_sequence_longer_than_seq_len_raises():
    model = _model()
    model(_ids(1, CFG.seq_len))  # exactly seq_len is fine
    with pytest.raises(ValueError, match="seq_len"):
        model(_ids(1, CFG.seq_len + 1))


def test_same_seed_same_init_different_seed_different_init():
    a, b, c = _model(seed=5), _model(seed=5), _model(seed=6)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert not torch.equal(sa["wte.weight"], sc["wte.weight"])


def test_residual_projections_are_scaled_down():
    model = _model(GPTConfig(vocab_size=64, seq_len=8, n_layer=8, n_head=2, d_model=64))
    std_proj = model.blocks[0].attn.proj.weight.std().item()
    std_qkv = model.blocks[0].attn.qkv.weight.std().item()
    assert std_proj == pytest.approx(0.02 / math.sqrt(16), rel=0.2)
    assert std_qkv == pytest.approx(0.02, rel=0.2)
