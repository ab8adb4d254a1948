"""Run under torchrun by test_optimizers.py: train.optimizer muon on 2 gloo ranks.

    torchrun --nproc_per_node 2 tests/muon_worker.py PLAN.json

PLAN.json: {"shards": DIR, "checks_out": FILE, "runs": [{"out": DIR, "sections": {...}, "resume_from":
DIR/checkpoints/step-N (optional: copied in and named by LATEST before the run)}]}. The check: under
FSDP2 (every weight a row-sharded DTensor, one of them in uneven halves), kiln.train.muon's step gives
the weights and momenta torch.optim.Muon gives on the whole matrices, bit for bit.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from kiln.config.models import model_config
from kiln.model.build import build_model
from kiln.train import checkpoint
from kiln.train.distributed import init_distributed, shutdown
from kiln.train.muon import Muon
from kiln.train.optim import hidden_matrices
from kiln.train.parallel import parallelize
from kiln.train.trainer import Trainer

MUON = dict(lr=0.02, momentum=0.95, weight_decay=0.01, nesterov=True)


def check_fsdp_step(d) -> dict:
    torch.manual_seed(0)
    # d_ff 35: gate and up are 35 x 32, sharded 18 + 17 rows
    model = build_model(model_config({"family": "llama", "n_layer": 1, "n_head": 2, "d_model": 32, "d_ff": 35}, 64, 8))
    whole = copy.deepcopy(model)
    parallelize(model, d, strategy="fsdp", compile_model=False, activation_checkpointing="none", bf16=False)
    ours, theirs = hidden_matrices(model), hidden_matrices(whole)
    sharded = all(isinstance(p, DTensor) for p in ours)
    uneven = any(p._local_tensor.shape[0] * d.world != p.shape[0] for p in ours)
    opt, ref = Muon(ours, **MUON), torch.optim.Muon(theirs, **MUON)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for p, q in zip(ours, theirs):
            g = torch.randn(q.shape, generator=gen)  # the same on every rank
            q.grad = g
            p.grad = distribute_tensor(g, p.device_mesh, p.placements)
        opt.found_inf = torch.zeros(())
        opt.step()
        ref.step()
    same = all(torch.equal(p.full_tensor(), q) for p, q in zip(ours, theirs))
    same_momentum = all(
        torch.equal(opt.state[p]["momentum_buffer"].full_tensor(), ref.state[q]["momentum_buffer"])
        for p, q in zip(ours, theirs)
    )
    return {"sharded": sharded, "uneven": uneven, "fsdp_step_is_torch_muon": same, "momentum_same": same_momentum}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed()
    checks = {"world": d.world, **check_fsdp_step(d)}
    for spec in plan["runs"]:
        out = Path(spec["out"])
        if spec.get("resume_from") and d.is_main:
            source = Path(spec["resume_from"])
            shutil.copytree(source, out / "checkpoints" / source.name)
            (out / "checkpoints" / checkpoint.MARKER).write_text(source.name + "\n")
        dist.barrier()
        result = Trainer(spec["sections"], Path(plan["shards"])).fit(out)
        if d.is_main:
            (out / "result.json").write_text(json.dumps({"losses": result.losses}))
    if d.is_main:
        Path(plan["checks_out"]).write_text(json.dumps(checks))
    shutdown(d.world, synced=True)


if __name__ == "__main__":
    main()
