"""Run by test_distributed.py under torchrun (2 ranks): rank 1 stops taking part in the run, as a rank
stuck in a kernel or on a dead node would, and rank 0 must end within train.collective_timeout_s.

    torchrun --nproc_per_node 2 tests/stuck_rank_worker.py PLAN.json

PLAN.json: {"shards": DIR, "out": DIR, "sections": {...}, "stuck_s": seconds rank 1 sleeps,
"error_out": FILE where rank 0 writes the KilnError it ends with}. Both ranks build the Trainer
(joining the process group and DDP's initial broadcast); then rank 1 sleeps instead of training.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from kiln.errors import KilnError
from kiln.stage import run_main
from kiln.train.trainer import Trainer, run


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    sections, shards = plan["sections"], Path(plan["shards"])
    if int(os.environ["RANK"]) == 1:
        Trainer(sections, shards)
        time.sleep(plan["stuck_s"])  # never reaches the first step's all-reduce
        return
    try:
        run(sections, shards, Path(plan["out"]))
    except KilnError as exc:
        Path(plan["error_out"]).write_text(str(exc))
        raise  # and end as a stage script ends (kiln.stage.run_main)


if __name__ == "__main__":
    run_main(main)
