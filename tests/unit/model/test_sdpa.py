"""kiln.model.sdpa: every attention call runs under torchtitan's kernel order, and the smoke stage can
name the kernel a training row gets."""

from __future__ import annotations

import dataclasses

import pytest
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


@pytest.mark.parametrize("seq_len, kv_heads", [(512, 4), (300, 2), (100, 1)])
def test_blockwise_causal_is_sdpas_causal_attention(seq_len, kv_heads):
    """kiln.model.sdpa.blockwise_causal, the CPU's compiled attention: SDPA's causal output in fp32
    (whole blocks, a short last block, one block; grouped-query heads), and in bf16 under autocast no
    further from the fp32 figure than SDPA's own bf16 kernel is."""
    torch.manual_seed(0)
    q = 2 * torch.randn(2, 4, seq_len, 32)
    k, v = 2 * torch.randn(2, kv_heads, seq_len, 32), torch.randn(2, kv_heads, seq_len, 32)
    gqa = kv_heads != 4
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    torch.testing.assert_close(sdpa_module.blockwise_causal(q, k, v), reference, rtol=1e-5, atol=1e-5)
    low = [x.bfloat16() for x in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = sdpa_module.blockwise_causal(*low)
    theirs = F.scaled_dot_product_attention(*low, is_causal=True, enable_gqa=gqa)
    assert ours.dtype == torch.bfloat16

    def error(x):
        return ((x.float() - reference).norm() / reference.norm()).item()

    assert error(ours) <= 1.2 * error(theirs)


def test_a_cpus_compiled_step_names_the_written_out_attention():
    cfg = model_config({"family": "llama", "n_layer": 1, "n_head": 4, "n_kv_head": 2, "d_model": 32}, 64, 16)
    cpu = torch.device("cpu")
    assert sdpa_module.kernel_name(cfg, cpu, torch.bfloat16, compiled=True) == "blockwise_causal"
    masked = model_config({"family": "llama", "n_layer": 1, "n_head": 4, "d_model": 32, "document_mask": True}, 64, 16)
    masked = dataclasses.replace(masked, eos_id=0)
    assert sdpa_module.kernel_name(masked, cpu, torch.bfloat16, compiled=True) != "blockwise_causal"
