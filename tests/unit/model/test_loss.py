"""The chunked loss (kiln.model.loss): equal to the plain cross-entropy and its gradients, never holding
the (N, V) logits at once, and the models' forward with targets returning no logits to keep alive."""

import pytest
import torch
import torch.nn.functional as F

from kiln.config.models import ModelConfig
from kiln.model.build import build_model
from kiln.model.loss import chunk_loss_sum, lm_loss
from kiln.train.cpu_memory import allocated_during

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: one thread (conftest.py)


def _plain(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What gpt.py and llama.py computed before: whole logits, upcast, one cross-entropy."""
    return F.cross_entropy(F.linear(h, w).float().flatten(0, 1), y.flatten())


def _inputs(B=3, T=37, C=16, V=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, C, generator=g, requires_grad=True)  # (B, T, C)
    w = (0.3 * torch.randn(V, C, generator=g)).requires_grad_()  # (V, C)
    y = torch.randint(0, V, (B, T), generator=g)
    return h, w, y


def _loss_and_grads(fn, h, w, y):
    h.grad = w.grad = None
    loss = fn(h, w, y)
    loss.backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 110, 111, 4096])  # uneven, exact, one chunk
def test_chunked_loss_and_gradients_equal_the_plain_ones(chunk_rows):
    h, w, y = _inputs()
    plain = _loss_and_grads(_plain, h, w, y)
    chunked = _loss_and_grads(lambda *a: lm_loss(*a, chunk_rows=chunk_rows), h, w, y)
    for name, a, b in zip(("loss", "grad hidden", "grad weight"), chunked, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_chunked_loss_under_bf16_autocast_matches_the_plain_one():
    """Each chunk runs the plain loss's ops for its rows (bf16 logits, fp32 cross-entropy): the loss
    differs by the fp32 sum's order only; gradients by bf16 rounding of partial sums."""
    h, w, y = _inputs(B=4, T=64, C=32, V=256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _loss_and_grads(_plain, h, w, y)
        chunked = _loss_and_grads(lambda *a: lm_loss(*a, chunk_rows=48), h, w, y)
    assert chunked[0].dtype == torch.float32
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(chunked[1:], plain[1:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize(
    "weight_dtype, compiled",
    [
        (torch.float32, False),
        (torch.bfloat16, False),
        pytest.param(torch.bfloat16, True, marks=pytest.mark.slow),
    ],
    ids=["plain-rank", "fsdp-param-dtype", "fsdp-param-dtype-compiled"],
)
def test_chunked_loss_sums_the_weight_gradient_in_fp32_under_bf16_autocast(weight_dtype, compiled):
    """32 chunks' (V, C) products summed in fp32 err against the fp32 loss's gradient as one chunk's
    single product does (measured 0.97x with an fp32 weight, 1.11x with a bf16 one: its gradient rounded
    to bf16 once more); summed in bf16, as autocast's cached copy of an fp32 weight or FSDP2's bf16
    weight made autograd do, 2.4x (docs/benchmarks.md, "The tied weight's gradient under bf16"). The
    compiled chunk (a compiled run's, aot_eager here) casts inside its graph: an fp32 weight's products
    came back fp32 there before too, a bf16 weight's did not."""
    chunk_loss = torch.compile(chunk_loss_sum, backend="aot_eager", dynamic=False) if compiled else chunk_loss_sum
    h, w, y = _inputs(B=1, T=512, C=32, V=256)
    reference = _loss_and_grads(_plain, h, w, y)[2]  # fp32 throughout
    w = w.detach().to(weight_dtype).requires_grad_()  # bf16: FSDP2's unsharded parameter under param_dtype

    def error(chunk_rows):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            grad = _loss_and_grads(lambda *a: lm_loss(*a, chunk_rows=chunk_rows, chunk_loss=chunk_loss), h, w, y)[2]
        assert grad.dtype == weight_dtype
        return ((grad.float() - reference).norm() / reference.norm()).item()

    one_chunk, chunked = error(512), error(16)
    assert chunked < 1.3 * one_chunk, (chunked, one_chunk)


def test_chunked_loss_never_holds_the_logits():
    """Forward and backward at N = 2,048 rows, V = 4,096: the plain loss peaks above two fp32 (N, V)
    tensors (the upcast logits and cross-entropy's saved log-softmax, 32 MiB each); chunks of 256
    rows peak near one chunk's few (N/8, V) tensors."""
    h, w, y = _inputs(B=2, T=1024, C=64, V=4096)
    logits_fp32 = 2 * 1024 * 4096 * 4

    def run(fn):
        return allocated_during(lambda: fn(h, w, y).backward())[1].peak

    plain = run(_plain)
    chunked = run(lambda *a: lm_loss(*a, chunk_rows=256))
    assert plain >= 2 * logits_fp32, plain
    assert chunked < logits_fp32 / 2, (chunked, plain)


MODELS = pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(family="gpt2", vocab_size=4096, seq_len=64, n_layer=2, n_head=2, d_model=32),
        ModelConfig(
            family="llama",
            vocab_size=4096,
            seq_len=64,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            d_model=32,
            tie_embeddings=False,
        ),
    ],
    ids=["gpt2", "llama-untied"],
)


@MODELS
def test_model_loss_and_gradients_equal_the_plain_loss_on_its_logits(cfg):
    torch.manual_seed(0)
    model = build_model(cfg).train()
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 2, cfg.seq_len))
    logits, loss = model(idx, targets)
    assert logits is None  # nothing of (B, T, V) handed back to keep alive through backward
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    plain = F.cross_entropy(model(idx)[0].float().flatten(0, 1), targets.flatten())
    plain.backward()
    torch.testing.assert_close(loss, plain, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-5, msg=name)


@MODELS
def test_model_forward_with_targets_keeps_no_logits_for_backward_unless_told_they_fit(cfg, monkeypatch):
    """What is alive between forward and backward (the activations the step keeps) is a fraction of
    one (B, T, V) fp32 tensor (33.6 MB here, at V 16,384, in chunks of 128 rows): the plain loss
    would keep two of them. With model.loss_rows at the micro-batch's rows (the trainer's pick where
    they fit, kiln.plan.memory.loss_rows) the loss is one chunk, not checkpointed: its logits are kept
    for backward, and the loss is the same."""
    import kiln.model.loss

    monkeypatch.setattr(kiln.model.loss, "loss_chunk_rows", lambda vocab: 128)  # 4 chunks of these 512 rows
    cfg = ModelConfig(**{**cfg.to_dict(), "vocab_size": 16384})
    torch.manual_seed(0)
    model = build_model(cfg).train()
    B = 8
    idx, targets = torch.randint(0, cfg.vocab_size, (2, B, cfg.seq_len))
    loss, alloc = allocated_during(lambda: model(idx, targets)[1])
    logits_fp32 = B * cfg.seq_len * cfg.vocab_size * 4
    assert alloc.end < logits_fp32 / 4, (alloc.end, logits_fp32)
    loss.backward()
    model.loss_rows = B * cfg.seq_len
    whole, alloc_whole = allocated_during(lambda: model(idx, targets)[1])
    assert alloc_whole.end >= logits_fp32, (alloc_whole.end, logits_fp32)
    torch.testing.assert_close(whole, loss, rtol=1e-5, atol=1e-5)
