"""train.activation_checkpointing, applied by kiln.train.parallel to the blocks: every mode gives the
plain gradients (dropout included: the recompute replays the RNG), keeps the parameter names, and
keeps less between forward and backward the more blocks it recomputes."""

import pytest
import torch

from kiln.config.models import ModelConfig
from kiln.model.build import build_model
from kiln.plan.memory import AC_MODES, checkpointed_blocks
from kiln.train.cpu_memory import allocated_during
from kiln.train.parallel import apply_activation_checkpointing

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(family="gpt2", vocab_size=128, seq_len=32, n_layer=4, n_head=2, d_model=32, dropout=0.1),
        ModelConfig(family="llama", vocab_size=128, seq_len=32, n_layer=4, n_head=4, n_kv_head=2, d_model=32),
    ],
    ids=["gpt2-dropout", "llama"],
)


def _model(cfg: ModelConfig, mode: str):
    torch.manual_seed(0)
    model = build_model(cfg).train()
    apply_activation_checkpointing(model, mode)
    return model


def test_which_blocks_each_mode_recomputes():
    assert checkpointed_blocks("none", 5) == []
    assert checkpointed_blocks("full", 5) == [0, 1, 2, 3, 4]
    assert checkpointed_blocks("selective", 5) == [1, 3]  # torchtitan's every 2nd block
    with pytest.raises(ValueError, match="activation_checkpointing"):
        checkpointed_blocks("true", 5)


@CONFIGS
def test_every_mode_gives_the_plain_gradients(cfg):
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 4, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    grads = {}
    for mode in AC_MODES:
        model = _model(cfg, mode)
        torch.manual_seed(5)  # the same dropout draws in every mode's forward
        model(idx, targets)[1].backward()
        grads[mode] = {n: p.grad for n, p in model.named_parameters()}
        assert list(model.state_dict()) == list(build_model(cfg).state_dict())  # names untouched
    for mode in ("full", "selective"):
        for name, grad in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], grad, rtol=0, atol=1e-6, msg=f"{mode}: {name}")


@CONFIGS
def test_more_recompute_keeps_less_for_backward(cfg):
    """Bytes alive between forward and backward (torch's CPU profiler): full keeps each block's input
    only, selective half the blocks' activations, none all of them."""
    cfg = ModelConfig(**{**cfg.to_dict(), "dropout": 0.0, "seq_len": 128, "max_positions": None})
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 8, cfg.seq_len))
    kept = {}
    for mode in AC_MODES:
        model = _model(cfg, mode)
        loss, alloc = allocated_during(lambda: model(idx, targets)[1])
        kept[mode] = alloc.end
        loss.backward()
    assert kept["full"] < 0.3 * kept["none"], kept
    assert 0.4 * kept["none"] < kept["selective"] < 0.7 * kept["none"], kept


@CONFIGS
def test_eval_and_no_grad_forward_run_plainly(cfg):
    model = _model(cfg, "full").eval()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with torch.no_grad():
        logits, _ = model(idx)
    assert logits.shape == (2, cfg.seq_len, cfg.vocab_size)
