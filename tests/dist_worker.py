"""Run under torchrun by test_distributed.py: checks that need a real process group, then several
training runs in one launch (one process group, so the launch cost is paid once).

    torchrun --nproc_per_node 2 tests/dist_worker.py PLAN.json

(or on 2 "nodes" of 2 ranks: two torchruns with --nnodes 2, test_distributed's HSDP launch).

PLAN.json: {"shards": DIR, "checks_out": FILE, "runs": [{"out": DIR, "sections": {...},
"resume_from": DIR/checkpoints/step-N (optional: copied in and named by LATEST before the run)}],
"smoke": [{"out": DIR, "sections": {...}}]}. Training runs log greedy samples (synthetic.greedy_sampler);
smoke runs write report.json (the checks, the probe's figures and batch plan) from rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from kiln.data.loader import ShardRows, TrainBatches
from kiln.train import checkpoint
from kiln.train.distributed import init_distributed, shutdown
from kiln.train.parallel import grad_sync
from kiln.train.smoke import run_checks
from kiln.train.trainer import Trainer
from synthetic import greedy_sampler


def gathered(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def check_grad_sync(rank: int) -> dict:
    """Under grad_sync(sync=False) DDP leaves each rank its own gradient; with sync=True it averages."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 1, bias=False)
    ddp = DistributedDataParallel(layer)
    x = torch.full((1, 4), float(rank + 1))  # rank-dependent input: different local gradients
    with grad_sync(ddp, sync=False):
        ddp(x).sum().backward()
    local = gathered(layer.weight.grad)
    layer.weight.grad = None
    with grad_sync(ddp, sync=True):
        ddp(x).sum().backward()
    synced = gathered(layer.weight.grad)
    return {"local_differ": not torch.equal(local[0], local[1]),
            "synced_equal": torch.equal(synced[0], synced[1]),
            "synced_is_mean": torch.allclose(synced[0], (local[0] + local[1]) / 2)}


def check_disjoint_rows(shards: Path, rank: int, world: int) -> dict:
    """One epoch of this rank's batches shares no row with the other rank's; together they cover it."""
    rows = ShardRows(shards, "train")
    loader = TrainBatches(rows, micro_batch=4, seed=7, rank=rank, world=world)
    mine = torch.cat([loader.next() for _ in range(loader.per_epoch)])
    everyone = gathered(mine)
    seen = [set(map(tuple, t.tolist())) for t in everyone]
    return {"disjoint": not (seen[0] & seen[1]), "rows_covered": sum(len(t) for t in everyone)}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed()
    checks = {"world": d.world, **check_grad_sync(d.rank), **check_disjoint_rows(Path(plan["shards"]), d.rank, d.world)}
    for spec in plan["runs"]:
        out = Path(spec["out"])
        if spec.get("resume_from") and d.is_main:
            source = Path(spec["resume_from"])
            shutil.copytree(source, out / "checkpoints" / source.name)
            (out / "checkpoints" / checkpoint.MARKER).write_text(source.name + "\n")
        dist.barrier()
        trainer = Trainer(spec["sections"], Path(plan["shards"]))
        result = trainer.fit(out, sampler=greedy_sampler)
        param = next(trainer.model.parameters())
        mesh = param.device_mesh if isinstance(param, DTensor) else None  # FSDP's: 1-D, or 2-D for HSDP
        if d.is_main:
            (out / "result.json").write_text(json.dumps({
                "losses": result.losses, "sharded": isinstance(trainer.model, FSDPModule),
                "ddp": isinstance(trainer.wrapped, DistributedDataParallel), "nnodes": d.nnodes,
                "mesh": mesh and {"shape": list(mesh.shape), "dims": list(mesh.mesh_dim_names),
                                  "placements": [str(p) for p in param.placements]}}))
    for spec in plan.get("smoke", []):
        report = run_checks(spec["sections"], Path(plan["shards"]), Path(spec["out"]))
        if d.is_main:
            report["checks"] = [dataclasses.asdict(c) for c in report["checks"]]
            Path(spec["out"]).mkdir(parents=True, exist_ok=True)
            (Path(spec["out"]) / "report.json").write_text(json.dumps(report))
    if d.is_main:
        Path(plan["checks_out"]).write_text(json.dumps(checks))
    shutdown(d.world, synced=True)  # a normal end on every rank


if __name__ == "__main__":
    main()
