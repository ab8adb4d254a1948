"""kiln.train.parallel on one rank: torch.compile is applied block by block, as on several ranks and
as torchtitan does, and dynamo traces one graph that every block reuses (compile time independent of
depth). Several ranks: tests/process/test_distributed.py."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch

from kiln.config.models import model_config
from kiln.errors import ConfigError
from kiln.model.build import build_model
from kiln.train import parallel
from kiln.train.distributed import Dist

ONE_RANK = Dist(rank=0, local_rank=0, world=1, device=torch.device("cpu"))
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)  # inductor's
LLAMA = {"family": "llama", "n_layer": 3, "n_head": 2, "n_kv_head": 1, "d_model": 32}


def test_one_rank_compiles_each_block_not_the_whole_model():
    model = build_model(model_config(LLAMA, 64, 16))
    wrapped = parallel.parallelize(
        model, ONE_RANK, strategy="ddp", compile_model=True, activation_checkpointing="none", bf16=False
    )
    assert wrapped is model  # nothing to replicate on one rank
    assert model._compiled_call_impl is None  # the whole model is not one graph ...
    assert all(block._compiled_call_impl is not None for block in model.blocks)  # ... each block is compiled
    assert all("_orig_mod" not in name for name in model.state_dict())


def test_compiling_on_a_cpu_without_a_cpp_compiler_names_the_setting():
    """Inductor builds a CPU's kernels with the host's C++ compiler: with none on the machine (here:
    the only compiler inductor searches for does not exist), compile_blocks says so by train.compile
    before anything is compiled, instead of the first step failing inside torch."""
    from torch._inductor import config as inductor_config
    from torch._inductor.cpp_builder import cpp_compiler_search

    model = build_model(model_config(LLAMA, 64, 16))
    cpp_compiler_search.cache_clear()  # its answer for the real search is cached
    try:
        with inductor_config.patch({"cpp.cxx": ("kiln-no-such-compiler",)}):
            with pytest.raises(ConfigError, match=r"^train\.compile: .*C\+\+ compiler.*train\.compile: false"):
                parallel.compile_blocks(model)
    finally:
        cpp_compiler_search.cache_clear()
    assert all(block._compiled_call_impl is None for block in model.blocks)


def test_the_blocks_share_one_graph():
    torch._dynamo.reset()
    graphs = []

    def recorder(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = build_model(model_config(LLAMA, 64, 16))
    parallel.compile_blocks(model, backend=recorder)
    idx = torch.randint(0, 64, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    blocks = [gm for gm in graphs if "cross_entropy" not in str(gm.code)]
    assert len(blocks) == 1, f"{len(blocks)} graphs for {len(model.blocks)} blocks"
    assert len(graphs) == 2  # and the loss's own (one chunk here)
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("mode, block_graphs", [("none", 1), ("selective", 2), ("full", 1)])
def test_checkpointed_blocks_do_not_recompile_block_by_block(mode, block_graphs):
    """Activation checkpointing wraps each chosen block's forward in a closure of its own
    (parallel.apply_activation_checkpointing); dynamo guards on the closure's code, not its identity,
    so four blocks trace one graph per kind of block (selective: checkpointed and plain), plus the
    loss's, and a second step traces none."""
    torch._dynamo.reset()
    graphs = []

    def recorder(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = build_model(model_config(LLAMA | {"n_layer": 4}, 64, 16))
    parallel.apply_activation_checkpointing(model, mode)
    parallel.compile_blocks(model, backend=recorder)
    idx = torch.randint(0, 64, (2, 16))
    for _ in range(2):
        model(idx, idx)[1].backward()
    assert len(graphs) == block_graphs + 1


def test_the_compiled_loss_equals_the_eager_one_with_its_gradients():
    """compile_blocks compiles the chunked loss's per-chunk function (kiln.model.loss): several
    chunks and a shorter last one, the loss and every gradient as the eager model's."""
    torch.manual_seed(0)
    eager = build_model(model_config(LLAMA, 64, 16))
    compiled = build_model(model_config(LLAMA, 64, 16))
    compiled.load_state_dict(eager.state_dict())
    parallel.compile_blocks(compiled, backend="aot_eager")
    assert compiled.chunk_loss is not eager.chunk_loss
    idx = torch.randint(0, 64, (3, 16))
    with patch("kiln.model.loss.loss_chunk_rows", return_value=20):  # 48 rows: chunks of 20, 20 and 8
        losses = [model(idx, idx)[1] for model in (eager, compiled)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0])
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_inductor_on_a_cpu_writes_attention_out_and_computes_the_same_loss_and_gradients():
    """compile_blocks with inductor on a CPU turns each block's attention to blockwise_causal (kiln.model.sdpa),
    which the traced graph takes instead of SDPA; another backend (bench/gpu_check's dry run) keeps SDPA.
    Traced with aot_eager here (inductor's kernels would only add minutes): the loss and every gradient
    as the eager model's with SDPA, over rows of 300 (two blocks of queries, the second short) and
    grouped-query heads."""
    torch.manual_seed(0)
    cfg = model_config(LLAMA, 64, 300)
    eager, compiled = build_model(cfg), build_model(cfg)
    compiled.load_state_dict(eager.state_dict())
    parallel.compile_blocks(compiled)  # inductor: blockwise on, nothing compiled until called
    assert all(block.attn.blockwise for block in compiled.blocks)
    parallel.compile_blocks(eager, backend="aot_eager")
    assert not any(block.attn.blockwise for block in eager.blocks)
    torch._dynamo.reset()
    for block in compiled.blocks:
        block.compile(backend="aot_eager", fullgraph=True)  # the same graph, traced without inductor
    idx = torch.randint(0, 64, (2, 300))
    with patch(
        "torch.nn.functional.scaled_dot_product_attention", wraps=torch.nn.functional.scaled_dot_product_attention
    ) as sdpa:
        compiled_loss = compiled(idx, idx)[1]
    assert sdpa.call_count == 0  # the written-out attention was traced
    eager_loss = eager(idx, idx)[1]
    for loss in (eager_loss, compiled_loss):
        loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name, rtol=1e-4, atol=1e-5)
