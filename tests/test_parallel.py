"""kiln.train.parallel on one rank: torch.compile is applied block by block, as on several ranks and
as torchtitan does, and dynamo traces one graph that every block reuses (compile time independent of
depth). Several ranks: tests/test_distributed.py."""

from __future__ import annotations

import pytest
import torch

from kiln.config.models import model_config
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
    assert len(graphs) == 1, f"{len(graphs)} graphs for {len(model.blocks)} blocks"
    assert all(p.grad is not None for p in model.parameters())
