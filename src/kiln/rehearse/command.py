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
from kiln.config import settings
from kiln.config.run_config import RunConfig
from kiln.plan.peaks import planned_gpu
from kiln.plan.rehearsal import check, render


def _run(args: argparse.Namespace) -> int:
    from kiln.rehearse.run import rehearse  # torch: imported by this command only

    for cfg in forecast.experiment_of(args).runs.values():
        run = RunConfig.of(cfg)
        started = time.perf_counter()
        batches_on = settings.derived(cfg, "rehearse")["eval_batches_on"]  # as the rehearse rule's params carry it
        rehearsal = rehearse(run, forecast.model_of(cfg, run).vocab_size, planned_gpu(run.plan.gpu), batches_on)
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
