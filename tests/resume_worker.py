"""Run by test_resume_ranks.py under torchrun (2 gloo ranks): kiln.train.checkpoint.resume_state on
checkpoint folders the test prepared, one case after another, each rank writing what it got.

    torchrun --nproc_per_node 2 tests/resume_worker.py PLAN.json

PLAN.json: {"out": DIR, "cases": [{"name", "root", "fingerprint", "requested" (optional),
"start_over_on": [ranks whose start_over is set]}]}. Each rank writes DIR/rank<R>.json:
{name: {"step": int or None} or {"error": message}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kiln.errors import KilnError
from kiln.train import checkpoint
from kiln.train.distributed import init_distributed, shutdown


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    d = init_distributed()
    got = {}
    for case in plan["cases"]:
        try:
            state = checkpoint.resume_state(
                case["root"],
                case["fingerprint"],
                case.get("requested"),
                rank=d.rank,
                world=d.world,
                start_over=d.rank in case.get("start_over_on", []),
            )
            got[case["name"]] = {"step": None if state is None else int(state["step"])}
        except KilnError as exc:
            got[case["name"]] = {"error": str(exc)}
    Path(plan["out"], f"rank{d.rank}.json").write_text(json.dumps(got))
    shutdown(synced=True)


if __name__ == "__main__":
    main()
