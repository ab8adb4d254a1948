"""`kiln rehearse`: a run's GPU-side work at its real shapes and world size, on this CPU, before
anything is downloaded or paid for (kiln.rehearse.run): each phase's per-rank peak against the card's
usable memory (plan.gpu), its largest tensor and the module that made it; exit 1 naming the first
phase that will not fit or not start, with the fix.

    kiln rehearse --configfile config/experiments/swallow-code-llama-1b.yaml
"""

from __future__ import annotations

import argparse
import time

from kiln import forecast
from kiln.config.run_config import RunConfig
from kiln.plan.memory import GIB
from kiln.plan.tables import aligned


def render(rehearsal) -> str:
    """A kiln.rehearse.run.Rehearsal as the terminal table the command prints."""
    rows = [("phase", "peak / rank", "largest tensor", "made by", "verdict")]
    for p in rehearsal.phases:
        largest = p.largest
        described = (largest.describe(), largest.made_by) if largest else ("", "")
        rows.append((p.name, f"{p.peak / GIB:,.2f} GiB", *described, p.verdict))
    usable = rehearsal.phases[0].usable / GIB if rehearsal.phases else 0
    head = (
        f"# Rehearsal of {rehearsal.run}: {rehearsal.layout} on {rehearsal.gpu.fragment} "
        f"({usable:.1f} of its {rehearsal.gpu.memory_gib:g} GiB a step may use), fake tensors, rank 0"
    )
    return "\n".join([head, "", *aligned(rows)])


def _run(args: argparse.Namespace) -> int:
    from kiln.rehearse.run import check, rehearse  # torch: imported by this command only

    for cfg in forecast.experiment_of(args).runs.values():
        run = RunConfig.of(cfg)
        started = time.perf_counter()
        rehearsal = rehearse(run, forecast.model_of(cfg, run).vocab_size, forecast.assumed_gpu(run))
        print(render(rehearsal) + f"\n\n({time.perf_counter() - started:.0f} s)\n")
        check(rehearsal)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rehearse",
        help="run a config's GPU-side work on fake tensors at its real shapes and world size: each phase's memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    forecast.add_run_arguments(parser)
    parser.set_defaults(run=_run)
