"""Run under torchrun by test_faults.py: training runs on 2 ranks with a non-finite step injected on
one rank only (KILN_FAULT), in skip mode; rank 0 writes what each run's ranks ended with.

    torchrun --nproc_per_node 2 tests/fault_worker.py BASE_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from synthetic import train_sections

from kiln.config.run_config import RunConfig
from kiln.train.callbacks import default_callbacks
from kiln.train.distributed import shutdown
from kiln.train.trainer import Trainer

FAULTS = "nan_loss@2:1,inf_grad@4:0"  # a NaN loss on rank 1 only, an inf gradient on rank 0 only


def main() -> None:
    base = Path(sys.argv[1])
    torch.set_num_threads(1)
    os.environ["KILN_FAULT"] = FAULTS
    out = {}
    for strategy in ("ddp", "fsdp"):
        sections = train_sections(
            nproc_per_node=2,
            parallel=strategy,
            micro_batch=4,
            batch_tokens=128,
            max_steps=6,
            log_every=3,
            checkpoint_every=6,
            nonfinite={"action": "skip", "max_skips": 2},
        )
        trainer = Trainer(RunConfig.of(sections), base / "shards")
        result = trainer.fit(base / strategy, callbacks=default_callbacks())
        params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in trainer.model.parameters()]
        total = float(sum(p.detach().double().sum() for p in params))
        finite = all(bool(torch.isfinite(p).all()) for p in params)
        ranks = [None] * trainer.dist.world
        dist.all_gather_object(ranks, {"weights_sum": total, "finite": finite, "skipped": trainer.skipped})
        adam_steps = sorted({int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()})
        out[strategy] = {"ranks": ranks, "adam_steps": adam_steps, "losses": result.losses}
    if dist.get_rank() == 0:
        (base / "result.json").write_text(json.dumps(out))
    shutdown(synced=True)


if __name__ == "__main__":
    main()
