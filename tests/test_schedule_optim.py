"""The LR schedule (linear warmup, cosine decay) and the AdamW parameter groups."""

import pytest
import torch

from kiln.model.gpt import GPT, GPTConfig
from kiln.train.optim import build_adamw
from kiln.train.schedule import lr_at

LR, MIN_LR, WARMUP, MAX = 1e-3, 1e-4, 10, 100


def _lr(step: int, **kw) -> float:
    args = dict(lr=LR, min_lr=MIN_LR, warmup_steps=WARMUP, max_steps=MAX) | kw
    return lr_at(step, **args)


def test_warmup_ramps_linearly_from_nonzero():
    assert _lr(0) > 0
    assert _lr(0) == pytest.approx(LR / WARMUP)
    values = [_lr(s) for s in range(WARMUP)]
    diffs = [b - a for a, b in zip(values, values[1:])]
    assert all(d == pytest.approx(LR / WARMUP) for d in diffs)


def test_peak_at_end_of_warmup():
    assert _lr(WARMUP - 1) == pytest.approx(LR)
    assert _lr(WARMUP) == pytest.approx(LR)
    assert max(_lr(s) for s in range(MAX + 5)) == pytest.approx(LR)


def test_reaches_min_lr_at_max_steps():
    assert _lr(MAX) == pytest.approx(MIN_LR)
    assert _lr(MAX + 50) == pytest.approx(MIN_LR)
    assert _lr(MAX - 1) > MIN_LR
    assert _lr(MAX - 1) == pytest.approx(MIN_LR, rel=1e-2)


def test_monotone_non_increasing_after_warmup():
    values = [_lr(s) for s in range(WARMUP, MAX + 3)]
    assert all(b <= a for a, b in zip(values, values[1:]))
    assert values[0] > values[-1]


def test_no_warmup_starts_at_peak():
    assert _lr(0, warmup_steps=0) == pytest.approx(LR)
    assert _lr(MAX, warmup_steps=0) == pytest.approx(MIN_LR)


TRAIN = {"lr": 1e-3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95}


@pytest.mark.parametrize("bias", [False, True])
def test_adamw_decays_matrices_only_and_covers_every_parameter_once(bias):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16, bias=bias))
    opt = build_adamw(model, TRAIN, "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])

    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(grouped) == len(set(grouped)), "a parameter sits in two groups"
    assert set(grouped) == {id(p) for p in model.parameters()}

    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert "wte.weight" in decayed and "wpe.weight" in decayed
    assert "blocks.0.attn.qkv.weight" in decayed and "blocks.1.mlp.down.weight" in decayed
    assert "ln_f.weight" in undecayed and "blocks.0.ln_1.weight" in undecayed
    if bias:
        assert "blocks.0.attn.qkv.bias" in undecayed and "ln_f.bias" in undecayed
    assert opt.defaults["betas"] == (0.9, 0.95)
