"""Run by test_distributed.py under torchrun (2 ranks): one training run (kiln.train.trainer.run), in
which rank 1 may stop taking part, as a rank stuck in a kernel or on a dead node would.

    torchrun --nproc_per_node 2 tests/rank_worker.py PLAN.json

PLAN.json: {"shards": DIR, "out": DIR, "sections": {...}, "stuck_s": seconds rank 1 sleeps instead of
training (optional), "error_out": FILE where rank 0 writes the KilnError it ends with, "result_out":
FILE where rank 0 writes its RunResult's mirror figures (optional)}. With stuck_s both ranks build the
Trainer (joining the process group and DDP's initial broadcast); then rank 1 sleeps instead of
training.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from train_stage import run

from kiln.config.run_config import RunConfig
from kiln.errors import KilnError
from kiln.stage import run_main
from kiln.train.trainer import Trainer


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    sections, shards = plan["sections"], Path(plan["shards"])
    rank = int(os.environ["RANK"])
    if rank == 1 and plan.get("stuck_s"):
        Trainer(RunConfig.of(sections), shards)
        time.sleep(plan["stuck_s"])  # never reaches the first step's all-reduce
        return
    try:
        result = run(RunConfig.of(sections), shards, Path(plan["out"]))
    except KilnError as exc:
        if rank == 0:
            Path(plan["error_out"]).write_text(str(exc))
        raise  # and end as a stage script ends (kiln.stage.run_main)
    if rank == 0 and plan.get("result_out"):
        Path(plan["result_out"]).write_text(
            json.dumps({"steps": result.steps, "mirror_failures": result.mirror_failures})
        )


if __name__ == "__main__":
    run_main(main)
