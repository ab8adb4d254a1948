"""Run under torchrun by test_optimizers.py: train.optimizer muon on 2 gloo ranks.

    torchrun --nproc_per_node 2 tests/muon_worker.py PLAN.json

PLAN.json: {"shards": DIR, "checks_out": FILE, "runs": [{"out": DIR, "sections": {...}, "resume_from":
DIR/checkpoints/step-N (optional: copied in and named by LATEST before the run)}]}. The checks: with
plain (replicated, as under DDP) matrices and under FSDP2 (every weight a row-sharded DTensor, one of
them in uneven halves), kiln.train.muon's step gives the weights and momenta torch.optim.Muon gives on
the whole matrices, bit for bit, a flagged step changes nothing, and each rank runs Newton-Schulz on
its share of the matrices only; in bf16 (torch's own) and in fp32 (an fp32 run's: what travels and
the iteration in fp32, torch's Muon given the same fp32 iteration).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import _muon as torch_muon

from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.model.build import build_model
from kiln.train import checkpoint, muon
from kiln.train.callbacks import default_callbacks
from kiln.train.distributed import init_distributed, shutdown
from kiln.train.muon import Muon
from kiln.train.optim import hidden_matrices
from kiln.train.parallel import parallelize
from kiln.train.trainer import Trainer

MUON = dict(lr=0.02, momentum=0.95, weight_decay=0.01, nesterov=True)
STEPS = 3


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


@contextlib.contextmanager
def _counted_newton_schulz():
    """Counts this rank's Newton-Schulz runs in kiln.train.muon (the name its several-rank step calls),
    with the dtypes the matrices came in (what travelled to the owner, and what it iterated in)."""
    calls, dtypes, original = [0], set(), muon._newton_schulz

    def counted(update, group):
        calls[0] += 1
        dtypes.add(str(update.dtype))
        return original(update, group)

    muon._newton_schulz = counted
    try:
        yield calls, dtypes
    finally:
        muon._newton_schulz = original


@contextlib.contextmanager
def _torch_muon_in(dtype: torch.dtype):
    """torch.optim.Muon as it is (bf16), or with its Newton-Schulz in fp32: kiln.train.muon's stacked
    iteration on a stack of one, which is what an fp32 run's owner rank calls."""
    if dtype == torch.bfloat16:
        yield
        return
    original = torch_muon._zeropower_via_newtonschulz

    def fp32(grad, ns_coefficients, ns_steps, eps):
        group = {"ns_coefficients": ns_coefficients, "ns_steps": ns_steps, "eps": eps}
        return muon._stacked_newton_schulz(grad.float()[None], group)[0]

    torch_muon._zeropower_via_newtonschulz = fp32
    try:
        yield
    finally:
        torch_muon._zeropower_via_newtonschulz = original


def _compare(ours, theirs, grad_for, dtype: torch.dtype) -> dict:
    """STEPS steps of our Muon (its iteration in `dtype`) on `ours` and torch's (the same iteration) on
    `theirs` (the whole matrices), the same gradients on every rank (grad_for: this rank's part of
    one); step 1 flagged, with an inf in a gradient, and not taken by torch's. Newton-Schulz runs per
    rank, gathered."""
    opt, ref = Muon(ours, dtype=dtype, **MUON), torch.optim.Muon(theirs, **MUON)

    def state() -> list[torch.Tensor]:
        return [_full(t).clone() for p in ours for t in (p, opt.state[p]["momentum_buffer"])]

    with _counted_newton_schulz() as (calls, dtypes), _torch_muon_in(dtype):
        for step in range(STEPS):
            flagged = step == 1
            gen = torch.Generator().manual_seed(step)
            for p, q in zip(ours, theirs):
                g = torch.randn(q.shape, generator=gen)  # the same on every rank
                if flagged:
                    g[0, 0] = float("inf")
                q.grad = g
                p.grad = grad_for(g, p)
            opt.found_inf = torch.tensor(float(flagged))
            if flagged:
                before = state()
                opt.step()
                unchanged = all(torch.equal(x, y) for x, y in zip(before, state()))
            else:
                opt.step()
                ref.step()
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, calls[0])
    return {
        "step_is_torch_muon": all(torch.equal(_full(p), q) for p, q in zip(ours, theirs)),
        "momentum_same": all(
            torch.equal(_full(opt.state[p]["momentum_buffer"]), ref.state[q]["momentum_buffer"])
            for p, q in zip(ours, theirs)
        ),
        "flagged_step_unchanged": unchanged,
        "matrices": len(ours),
        "newton_schulz_per_rank": [c / STEPS for c in counts],
        "newton_schulz_dtypes": sorted(dtypes),
    }


def _model():
    torch.manual_seed(0)
    # d_ff 35: gate and up are 35 x 32, sharded 18 + 17 rows
    return build_model(model_config({"family": "llama", "n_layer": 1, "n_head": 2, "d_model": 32, "d_ff": 35}, 64, 8))


def check_ddp_step(dtype: torch.dtype) -> dict:
    """Plain (replicated) matrices, as under DDP: each rank orthogonalises its share."""
    model = _model()
    whole = copy.deepcopy(model)
    return _compare(hidden_matrices(model), hidden_matrices(whole), lambda g, p: g.clone(), dtype)


def check_fsdp_step(d, dtype: torch.dtype) -> dict:
    model = _model()
    whole = copy.deepcopy(model)
    parallelize(model, d, strategy="fsdp", compile_model=False, activation_checkpointing="none", bf16=False)
    ours, theirs = hidden_matrices(model), hidden_matrices(whole)
    sharded = all(isinstance(p, DTensor) for p in ours)
    uneven = any(p._local_tensor.shape[0] * d.world != p.shape[0] for p in ours)
    compared = _compare(ours, theirs, lambda g, p: distribute_tensor(g, p.device_mesh, p.placements), dtype)
    return {"sharded": sharded, "uneven": uneven, **compared}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed()
    checks = {"world": d.world}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):  # the step's precision
        checks |= {f"ddp {name}": check_ddp_step(dtype), f"fsdp {name}": check_fsdp_step(d, dtype)}
    for spec in plan["runs"]:
        out = Path(spec["out"])
        if spec.get("resume_from") and d.is_main:
            source = Path(spec["resume_from"])
            shutil.copytree(source, out / "checkpoints" / source.name)
            (out / "checkpoints" / checkpoint.MARKER).write_text(source.name + "\n")
        dist.barrier()
        result = Trainer(RunConfig.of(spec["sections"]), Path(plan["shards"])).fit(out, callbacks=default_callbacks())
        if d.is_main:
            (out / "result.json").write_text(json.dumps({"losses": result.losses}))
    if d.is_main:
        Path(plan["checks_out"]).write_text(json.dumps(checks))
    shutdown(synced=True)


if __name__ == "__main__":
    main()
