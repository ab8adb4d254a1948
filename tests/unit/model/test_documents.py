"""model.document_mask (kiln.model.documents): a packed row computes each of its documents as that
document alone would: for a RoPE family with its positions left as they are (RoPE is relative), for
gpt2 with its learned positions restarted at each document. On the path the CPU runs (the dense
mask); flex attention's block mask is checked against it at the attention itself (compiled by
inductor for the CPU: the GPU's Triton kernel is not run here)."""

import pytest
import torch
import torch.nn.functional as F

from kiln.config.models import ModelConfig, model_config
from kiln.errors import KilnError
from kiln.model.build import build_model
from kiln.model.documents import DocumentMask, document_ids, positions

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tiny tensors: one thread (conftest.py)
    # eager flex attention on the CPU says it materialises the scores: what this check wants
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

EOS, VOCAB, SEQ_LEN = 0, 128, 48
SHAPES = {
    "llama": {"family": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32},
    "starcoder2": {"family": "starcoder2", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32, "bias": True},
    "gpt2": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32},
}
# A row of 48: a document begun in the row before (no EOS of its own before it), whole ones, and one
# the row's end cuts; one is a lone EOS (an empty document).
LENGTHS = (7, 12, 1, 20, 8)


def _documents(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]
    for doc in docs[:-1]:
        doc[-1] = EOS  # every document but the row's last ends with EOS
    return docs


def _model(family: str, document_mask: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    section = SHAPES[family] | {"document_mask": document_mask}
    return build_model(model_config(section, VOCAB, SEQ_LEN, eos_id=EOS)).eval()


@pytest.mark.parametrize("family", SHAPES)
def test_a_packed_row_gives_each_document_the_logits_it_has_alone(family):
    model = _model(family)
    rows = [_documents(seed) for seed in (1, 2)]
    with torch.no_grad():
        packed, _ = model(torch.stack([torch.cat(docs) for docs in rows]))  # (2, 48, V)
        for r, docs in enumerate(rows):
            start = 0
            for doc in docs:
                alone, _ = model(doc[None])
                torch.testing.assert_close(packed[r, start : start + len(doc)], alone[0], rtol=1e-5, atol=1e-5)
                start += len(doc)


@pytest.mark.parametrize("family", SHAPES)
def test_without_the_setting_a_document_sees_the_one_before_it(family):
    """The reference above is not trivially met: plain causal attention gives other logits."""
    model = _model(family, document_mask=False)
    docs = _documents(1)
    with torch.no_grad():
        packed, _ = model(torch.cat(docs)[None])
        alone, _ = model(docs[1][None])
    assert (packed[0, 7:19] - alone[0]).abs().max() > 1e-3


def test_documents_end_at_their_eos_and_positions_restart_after_it():
    idx = torch.tensor([[5, 0, 7, 8, 0, 0, 9], [0, 3, 4, 5, 6, 0, 2]])
    docs = document_ids(idx, EOS)
    assert docs.tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 2]]
    assert positions(docs).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 0]]


@pytest.mark.parametrize("gqa", [False, True])
def test_flex_attentions_block_mask_attends_as_the_dense_mask_does(gqa):
    torch.manual_seed(0)
    B, H, T, D = 2, 4, 64, 16
    K = 2 if gqa else H
    idx = torch.stack([torch.cat(_documents(seed))[:T].clone() for seed in (1, 2)])
    idx = torch.cat([idx, torch.full((B, T - idx.size(1)), 3)], dim=1)
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, K, T, D), torch.randn(B, K, T, D)
    dense = DocumentMask(idx, EOS, torch.float32, flex=False).attend(q, k, v, dropout=0.0)
    flex = DocumentMask(idx, EOS, torch.float32, flex=True).attend(q, k, v, dropout=0.0)
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)
    # and both are each document's own causal attention
    docs = document_ids(idx, EOS)
    for b in range(B):
        for d in docs[b].unique():
            at = (docs[b] == d).nonzero()[:, 0]
            kk, vv = k[b][:, at].repeat_interleave(H // K, 0), v[b][:, at].repeat_interleave(H // K, 0)
            alone = F.scaled_dot_product_attention(q[b][:, at], kk, vv, is_causal=True)
            torch.testing.assert_close(dense[b][:, at], alone, rtol=1e-5, atol=1e-5)


def test_the_setting_needs_the_end_of_text_id_and_is_absent_from_a_config_without_it():
    section = SHAPES["llama"] | {"document_mask": True}
    with pytest.raises(KilnError, match="model.document_mask"):
        build_model(model_config(section, VOCAB, SEQ_LEN))  # a run priced before its shards exist
    on = model_config(section, VOCAB, SEQ_LEN, eos_id=EOS)
    assert on.to_dict()["eos_id"] == EOS and ModelConfig(**on.to_dict()) == on  # model_config.json round trip
    off = model_config(SHAPES["llama"], VOCAB, SEQ_LEN, eos_id=EOS)
    assert "document_mask" not in off.to_dict() and "eos_id" not in off.to_dict()  # fingerprints as before


def test_compiled_blocks_take_each_steps_block_mask_without_recompiling():
    """What train compiles on a GPU (fullgraph blocks, kiln.train.parallel.compile_blocks) with flex
    attention's block mask, one mask per forward: the graph compiled for the first serves the next,
    and the blocks attend as the eager dense path does. Forward only, with the aot_eager backend:
    flex attention has no backward on the CPU, and the GPU's Triton kernel is not run here."""
    import torch._dynamo

    eager, compiled = _model("llama"), _model("llama")  # the same weights (one seed)
    for block in compiled.blocks:
        block.compile(backend="aot_eager", fullgraph=True)
    cos, sin = eager.rope_cos, eager.rope_sin

    def hidden(model: torch.nn.Module, idx: torch.Tensor, flex: bool) -> torch.Tensor:
        x, mask = model.wte(idx), DocumentMask(idx, EOS, torch.float32, flex=flex)
        for block in model.blocks:
            x = block(x, cos, sin, mask)
        return x

    with torch.no_grad():
        hidden(compiled, torch.cat(_documents(1))[None], flex=True)  # compiles
        with torch._dynamo.config.patch(error_on_recompile=True):
            for seed in (2, 3):
                idx = torch.cat(_documents(seed)).flip(0)[None]  # other documents, other boundaries
                torch.testing.assert_close(
                    hidden(compiled, idx, flex=True), hidden(eager, idx, flex=False), rtol=1e-5, atol=1e-5
                )


def test_flex_runs_compiled_where_the_caller_turned_compiling_off(monkeypatch):
    """The smoke gate validates under torch.compiler.set_stance("force_eager") (kiln.gate.checks), which
    turns off every compile inside it, flex's own included: flex would then take its eager path, which
    materialises the scores, (B, H, T, T) fp32, 51.5 GB at seed 000's 6 x 32 x 8192^2, an OOM before
    the first training step. The document mask's flex kernel is compiled there all the same."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from kiln.model import documents

    monkeypatch.setattr(documents, "_compiled_flex", None)  # compiled afresh here, not from a cache
    torch._dynamo.reset()
    counters.clear()
    idx = torch.cat(_documents(1))[None, :32]
    q = k = v = torch.randn(1, 2, idx.size(1), 8)
    mask = DocumentMask(idx, EOS, torch.float32, flex=True)
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        out = mask.attend(q, k, v, dropout=0.0)
    assert counters["frames"]["ok"] >= 1, "flex ran eagerly under the force_eager stance"
    dense = DocumentMask(idx, EOS, torch.float32, flex=False).attend(q, k, v, dropout=0.0)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)
