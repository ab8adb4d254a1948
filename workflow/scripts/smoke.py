"""smoke stage: a short run on the full run's code path, model and parallelism; a gate for train.

Launch it the way train is launched (torchrun). Writes report.json with tokens/s, step time, MFU,
peak memory, data-wait fraction, the loss at the first and last step and the time the full run will
take at this speed, and exits non-zero (failing the DAG, so train never starts) when the loss is not
finite or does not fall by smoke.min_loss_drop.
"""

import json
import math
from pathlib import Path

import torch

from kiln.cli import run_main, stage_config, stage_parser
from kiln.io import write_json
from kiln.train.trainer import run


def health(losses: list[float], min_drop: float) -> tuple[bool, str]:
    """Loss finite at every step, and the last quarter's mean below the first quarter's by min_drop."""
    if not losses or not all(math.isfinite(x) for x in losses):
        return False, f"loss not finite: {losses[-5:]}"
    q = max(1, len(losses) // 4)
    first, last = sum(losses[:q]) / q, sum(losses[-q:]) / q
    drop = first - last
    if drop < min_drop:
        return False, f"loss did not fall: first-quarter mean {first:.4f}, last-quarter mean {last:.4f} (drop {drop:.4f} < {min_drop})"
    return True, f"loss fell by {drop:.4f} nats ({first:.4f} -> {last:.4f})"


def main() -> None:
    parser = stage_parser("smoke", __doc__)
    parser.add_argument("--shards", required=True, type=Path, help="shard stage output folder")
    parser.add_argument("--report", required=True, type=Path, help="output report.json")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: torch default)")
    args = parser.parse_args()
    cfg = stage_config(args, "smoke")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(cfg, args.shards, args.report.parent, max_steps=cfg["smoke"]["steps"], smoke=True)
    if not result.is_main:
        return
    passed, reason = health(result.losses, cfg["smoke"]["min_loss_drop"])
    report = {
        "passed": passed, "reason": reason, "steps": result.steps, "n_params": result.n_params,
        "loss_first": result.losses[0] if result.losses else None,
        "loss_last": result.losses[-1] if result.losses else None,
        "losses": result.losses, "tokens_per_s": result.tokens_per_s, "step_time_s": result.step_time_s,
        "data_wait_fraction": result.data_wait_fraction, "peak_memory_mb": result.peak_memory_mb,
        "mfu": result.mfu, "tflops": result.tflops, "tokens_per_step": result.tokens_per_step,
        "grad_accum": result.grad_accum,
        # The plan for train: its steps at the step time measured here.
        "train_eta_s": cfg["train"]["max_steps"] * result.step_time_s,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}, indent=2))
    if not passed:
        raise SystemExit(f"smoke: FAILED: {reason}")
    write_json(args.report, report)
    print(f"smoke: passed: {reason}")


if __name__ == "__main__":
    run_main(main)
