"""Run under torchrun by test_distributed.py: checks that need a real process group, then several
training runs in one launch (one process group, so the launch cost is paid once).

    torchrun --nproc_per_node 2 tests/dist_worker.py PLAN.json

(or on 2 "nodes" of 2 ranks: two torchruns with --nnodes 2, test_distributed's HSDP launch).

PLAN.json: {"shards": DIR, "checks_out": FILE, "runs": [{"out": DIR, "sections": {...},
"resume_from": DIR/checkpoints/step-N (optional: copied in and named by LATEST before the run)}],
"smoke": [{"out": DIR, "sections": {...}}]}. Training runs log greedy samples (synthetic.greedy_sampler);
smoke runs write report.json (the checks, the probe's figures and batch split) from rank 0. Each rank of
a run writes resume-rank<R>.json: the files it sha256'd through kiln.train.checkpoint, and, for the
state it resumed from, how many of its tensors there were and whether each lay in a memory mapping of
that checkpoint's state.pt (/proc/self/maps), rather than in memory of its own.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from synthetic import SAMPLE_PROMPTS, greedy_sampler
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.data.loader import ShardRows, TrainBatches
from kiln.gate.checks import run_checks
from kiln.model.build import build_model
from kiln.train import checkpoint
from kiln.train.callbacks import default_callbacks
from kiln.train.distributed import init_distributed, shutdown
from kiln.train.parallel import grad_sync, parallelize
from kiln.train.trainer import Trainer


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
    return {
        "local_differ": not torch.equal(local[0], local[1]),
        "synced_equal": torch.equal(synced[0], synced[1]),
        "synced_is_mean": torch.allclose(synced[0], (local[0] + local[1]) / 2),
    }


def check_ddp_buffers(d) -> dict:
    """parallelize's DDP broadcasts no buffers before a forward (llama's RoPE tables are derived on
    every rank alike): a table changed on rank 1 after wrapping is still rank 1's own after a step."""
    torch.manual_seed(0)
    model = build_model(
        model_config({"family": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 16}, 64, 8)
    )
    ddp = parallelize(model, d, strategy="ddp", compile_model=False, activation_checkpointing="none", bf16=False)
    if d.rank == 1:
        model.rope_cos.add_(1.0)
    idx = torch.arange(8)[None]
    ddp(idx, idx)[1].backward()
    tables = gathered(model.rope_cos)
    return {"buffers_kept": not torch.equal(tables[0], tables[1])}


def check_disjoint_rows(shards: Path, rank: int, world: int) -> dict:
    """One epoch of this rank's batches shares no row with the other rank's; together they cover it."""
    rows = ShardRows(shards, "train")
    loader = TrainBatches(rows, micro_batch=4, seed=7, rank=rank, world=world)
    mine = torch.cat([loader.next() for _ in range(loader.per_epoch)])
    everyone = gathered(mine)
    seen = [set(map(tuple, t.tolist())) for t in everyone]
    return {"disjoint": not (seen[0] & seen[1]), "rows_covered": sum(len(t) for t in everyone)}


HASHED: list[str] = []  # the files this rank sha256'd through kiln.train.checkpoint, in order
RESUMED: list[dict] = []
RESUMING: dict = {}  # "state": the state.pt of the checkpoint this run is to resume from


def _count_hashes() -> None:
    real = checkpoint.sha256_file

    def sha256_file(path, *args, **kwargs):
        HASHED.append(str(Path(path).resolve()))
        return real(path, *args, **kwargs)

    checkpoint.sha256_file = sha256_file


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process mapped from `path`."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            lo, hi = fields[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _record_resumes() -> None:
    real = Trainer.load_state_dict

    def load_state_dict(self, state):
        mapped = _file_mappings(RESUMING["state"]) if "state" in RESUMING else []
        tensors = [t for part in ("model", "optimizer") for t in _tensors(state.get(part, {}))]
        RESUMED.append(
            {
                "tensors": len(tensors),
                "sharded": checkpoint.SHARDS in state,
                "mapped": sum(any(lo <= t.data_ptr() < hi for lo, hi in mapped) for t in tensors),
            }
        )
        return real(self, state)

    Trainer.load_state_dict = load_state_dict


def _tensors(tree) -> list[torch.Tensor]:
    if torch.is_tensor(tree):
        return [tree] if tree.numel() else []
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else []
    return [t for item in items for t in _tensors(item)]


def check_sampling_agrees(sections: dict, shards: Path, d) -> dict:
    """Under FSDP every forward is collective. Each rank samples with its own seed here, as numerics
    that differ between devices would make it, and stop ids are half the vocabulary: without
    Trainer._sample's agree the ranks would stop at different steps, one waiting in a forward the
    other never joins. With it each rank decodes rank 0's tokens: the same rows, the same stops."""
    from kiln.generate.decode import generate

    trainer = Trainer(RunConfig.of(sections), shards)
    generator = torch.Generator().manual_seed(1000 + d.rank)

    def sampler(model, agree=None) -> list[dict]:
        stops = frozenset(range(0, 64, 2))
        new = generate(model, SAMPLE_PROMPTS, 12, temperature=1.0, stop_ids=stops, generator=generator, agree=agree)
        return [{"completion": row} for row in new]

    rows = trainer.sample(sampler)
    every = [None] * d.world
    dist.all_gather_object(every, rows)
    return {"fsdp_samples": every, "fsdp_sampled": isinstance(trainer.model, FSDPModule)}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed()
    _count_hashes()
    _record_resumes()
    checks = {
        "world": d.world,
        **check_grad_sync(d.rank),
        **check_ddp_buffers(d),
        **check_disjoint_rows(Path(plan["shards"]), d.rank, d.world),
    }
    for spec in plan["runs"]:
        out = Path(spec["out"])
        if spec.get("resume_from") and d.is_main:
            source = Path(spec["resume_from"])
            shutil.copytree(source, out / "checkpoints" / source.name)
            (out / "checkpoints" / checkpoint.MARKER).write_text(source.name + "\n")
        dist.barrier()
        trainer = Trainer(RunConfig.of(spec["sections"]), Path(plan["shards"]))
        HASHED.clear(), RESUMED.clear(), RESUMING.clear()
        if spec.get("resume_from"):
            RESUMING["state"] = out / "checkpoints" / Path(spec["resume_from"]).name / checkpoint.STATE
        result = trainer.fit(out, callbacks=default_callbacks(greedy_sampler))
        (out / f"resume-rank{d.rank}.json").write_text(json.dumps({"hashed": HASHED, "resumed": RESUMED}))
        param = next(trainer.model.parameters())
        mesh = param.device_mesh if isinstance(param, DTensor) else None  # FSDP's: 1-D, or 2-D for HSDP
        if d.is_main:
            (out / "result.json").write_text(
                json.dumps(
                    {
                        "losses": result.losses,
                        "sharded": isinstance(trainer.model, FSDPModule),
                        "ddp": isinstance(trainer.wrapped, DistributedDataParallel),
                        "nnodes": d.nnodes,
                        "mesh": mesh
                        and {
                            "shape": list(mesh.shape),
                            "dims": list(mesh.mesh_dim_names),
                            "placements": [str(p) for p in param.placements],
                        },
                    }
                )
            )
    if plan.get("sampling"):
        checks |= check_sampling_agrees(plan["sampling"], Path(plan["shards"]), d)
        compiled = Trainer(
            RunConfig.of(
                dict(plan["sampling"], train=plan["sampling"]["train"] | {"parallel": "ddp", "compile": True})
            ),
            Path(plan["shards"]),
        )
        checks["ddp_compiled_blocks_unsplit"] = torch._dynamo.config.optimize_ddp is False and all(
            block._compiled_call_impl is not None for block in compiled.model.blocks
        )
    for spec in plan.get("smoke", []):
        report = run_checks(RunConfig.of(spec["sections"]), Path(plan["shards"]), Path(spec["out"]))
        if d.is_main:
            report["checks"] = [dataclasses.asdict(c) for c in report["checks"]]
            Path(spec["out"]).mkdir(parents=True, exist_ok=True)
            (Path(spec["out"]) / "report.json").write_text(json.dumps(report))
    if d.is_main:
        Path(plan["checks_out"]).write_text(json.dumps(checks))
    shutdown(synced=True)  # a normal end on every rank


if __name__ == "__main__":
    main()
