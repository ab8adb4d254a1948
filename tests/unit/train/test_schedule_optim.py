"""The LR schedules (warmup, then cosine, warmup-stable-decay or constant) and the AdamW parameter
groups."""

import pytest
import torch
from synthetic import train_sections

from kiln.config.models import ModelConfig
from kiln.config.train_sections import TrainSection
from kiln.model.gpt2.module import GPT
from kiln.model.llama.module import Llama
from kiln.train.optim import build_adamw
from kiln.train.schedule import lr_at, schedule_from_config

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


def _wsd(step: int, **kw) -> float:
    return _lr(step, kind="wsd", decay_fraction=0.2, **kw)


def test_wsd_holds_the_peak_then_cools_down_over_the_last_fraction():
    assert [_wsd(s) for s in range(WARMUP)] == [_lr(s) for s in range(WARMUP)]  # same warmup
    assert all(_wsd(s) == LR for s in range(WARMUP, 80))  # stable until the last 20% of 100 steps
    cooldown = [_wsd(s) for s in range(80, MAX)]
    assert cooldown[0] == LR and all(b < a for a, b in zip(cooldown, cooldown[1:]))
    assert _wsd(MAX) == MIN_LR and _wsd(MAX + 7) == MIN_LR
    # Linear: equal steps down, reaching min_lr at max_steps.
    assert _wsd(90) == pytest.approx(MIN_LR + 0.5 * (LR - MIN_LR))


def test_wsd_one_minus_sqrt_cooldown_drops_faster_early():
    linear, sqrt = _wsd(85), _wsd(85, cooldown="1-sqrt")
    assert sqrt < linear
    assert sqrt == pytest.approx(MIN_LR + (1 - (5 / 20) ** 0.5) * (LR - MIN_LR))
    assert _wsd(80, cooldown="1-sqrt") == LR and _wsd(MAX, cooldown="1-sqrt") == MIN_LR


def test_wsd_cooldown_never_starts_inside_warmup():
    values = [_lr(s, kind="wsd", decay_fraction=1.0) for s in range(MAX + 1)]
    assert values[:WARMUP] == [_lr(s) for s in range(WARMUP)]
    assert values[WARMUP] == LR and values[-1] == MIN_LR


def test_constant_after_warmup_ignores_min_lr():
    assert [_lr(s, kind="constant") for s in range(WARMUP)] == [_lr(s) for s in range(WARMUP)]
    assert {_lr(s, kind="constant") for s in range(WARMUP, MAX + 10)} == {LR}


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        _lr(WARMUP + 1, kind="linear")


def test_schedule_from_config_reads_the_train_section():
    train = TrainSection.of(train_sections()["train"]).replace(
        lr=LR,
        min_lr=MIN_LR,
        warmup_steps=WARMUP,
        schedule="wsd",
        decay_fraction=0.5,
        cooldown="1-sqrt",
    )
    lr_of = schedule_from_config(train, MAX)
    assert [lr_of(s) for s in range(MAX + 1)] == [
        lr_at(
            s,
            lr=LR,
            min_lr=MIN_LR,
            warmup_steps=WARMUP,
            max_steps=MAX,
            kind="wsd",
            decay_fraction=0.5,
            cooldown="1-sqrt",
        )
        for s in range(MAX + 1)
    ]
    assert lr_of(49) == LR and lr_of(51) < LR


TRAIN = TrainSection.of(train_sections()["train"]).replace(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_adamw_decays_matrices_only_and_covers_every_parameter_once(bias):
    torch.manual_seed(0)
    model = GPT(ModelConfig(family="gpt2", vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16, bias=bias))
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
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-6


def test_adamw_on_llama_decays_projections_and_tied_embedding_not_norms():
    torch.manual_seed(0)
    model = Llama(ModelConfig(family="llama", vocab_size=64, seq_len=8, n_layer=1, n_head=2, d_model=16))
    decay, no_decay = build_adamw(model, TRAIN, "cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == {
        "blocks.0.attn_norm.weight",
        "blocks.0.mlp_norm.weight",
        "norm.weight",
    }
    assert "wte.weight" in {names[id(p)] for p in decay["params"]}


def test_a_continuation_warms_up_from_the_sources_lr_not_from_zero():
    """train.init_from.warmup_from: the ramp starts at the source's last LR (step -1) and reaches lr
    at the end of warmup; the rest of the schedule is the plain one, and without it nothing moves."""
    from kiln.config.train_sections import InitFrom

    plain = TrainSection.of(train_sections()["train"]).replace(lr=LR, min_lr=MIN_LR, warmup_steps=WARMUP)
    init = InitFrom.of({"hf": "source", "optimizer": False, "warmup_from": MIN_LR})
    lr_of, base = schedule_from_config(plain.replace(init_from=init), MAX), schedule_from_config(plain, MAX)
    assert lr_of(0) == pytest.approx(MIN_LR + (LR - MIN_LR) / WARMUP)
    assert [lr_of(s) for s in range(WARMUP)] == pytest.approx(
        [MIN_LR + (LR - MIN_LR) * (s + 1) / WARMUP for s in range(WARMUP)]
    )
    assert [lr_of(s) for s in range(WARMUP, MAX + 1)] == [base(s) for s in range(WARMUP, MAX + 1)]
    unset = plain.replace(init_from=InitFrom.of({"hf": "source", "optimizer": False}))
    assert [schedule_from_config(unset, MAX)(s) for s in range(MAX + 1)] == [base(s) for s in range(MAX + 1)]
