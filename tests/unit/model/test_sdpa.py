"""kiln.model.sdpa: every attention call runs under torchtitan's kernel order, and the smoke stage can
name the kernel a training row gets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from kiln.config.models import model_config
from kiln.model import sdpa as sdpa_module
from kiln.model.build import build_model


def test_every_attention_call_runs_under_the_kernel_order_and_computes_the_same(monkeypatch):
    default_order = torch._C._get_sdp_priority_order()
    seen = []
    real = F.scaled_dot_product_attention

    def watched(*args, **kwargs):
        seen.append(torch._C._get_sdp_priority_order())
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", watched)
    wanted = [int(b) for b in sdpa_module.SDPA_PRIORITY]
    for family in ("gpt2", "llama", "starcoder2"):
        model = build_model(model_config({"family": family, "n_layer": 2, "n_head": 4, "d_model": 32}, 64, 16))
        model(torch.randint(0, 64, (2, 16)))
        assert len(seen) == 2 and all(order[: len(wanted)] == wanted for order in seen), family
        seen.clear()
    assert torch._C._get_sdp_priority_order() == default_order  # set for the call, then restored
    q = torch.randn(2, 4, 16, 8)
    assert torch.equal(sdpa_module.sdpa(q, q, q, is_causal=True), real(q, q, q, is_causal=True))


def test_the_kernel_a_training_row_gets_is_named():
    cfg = model_config({"family": "llama", "n_layer": 1, "n_head": 4, "n_kv_head": 2, "d_model": 32}, 64, 16)
    name = sdpa_module.kernel_name(cfg, torch.device("cpu"), torch.float32)
    assert name in set(SDPBackend.__members__) - {"ERROR"}  # CPU: FLASH_ATTENTION (its CPU kernel) or MATH
