"""`kiln rehearse`: a run's GPU-side work at its real shapes and world size, on this CPU, before
anything is downloaded or paid for (kiln.rehearse.run): each phase's per-rank peak against the card's
usable memory (plan.gpu), its largest tensor and the module that made it; exit 1 naming the first
phase that will not fit or not start, with the fix.

    kiln rehearse --configfile config/experiments/swallow-code-llama-1b.yaml
"""

from __future__ import annotations

import argparse
import time

from kiln import config as kiln_config
from kiln import forecast
from kiln.config.run_config import RunConfig


def _table(rehearsal) -> str:
    from kiln.plan.memory import GIB

    rows = [("phase", "peak / rank", "largest tensor", "made by", "verdict")]
    for p in rehearsal.phases:
        largest = p.largest
        rows.append(
            (
                p.name,
                f"{p.peak / GIB:,.2f} GiB",
                largest.describe() if largest else "",
                largest.made_by if largest else "",
                p.verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    usable = rehearsal.phases[0].usable / GIB if rehearsal.phases else 0
    head = (
        f"# Rehearsal of {rehearsal.run}: {rehearsal.layout} on {rehearsal.gpu.fragment} "
        f"({usable:.1f} of its {rehearsal.gpu.memory_gib:g} GiB a step may use), fake tensors, rank 0"
    )
    return "\n".join([head, "", *lines])


def _run(args: argparse.Namespace) -> int:
    from kiln.rehearse.run import check, rehearse

    overrides: dict = {}
    for text in args.config or []:
        overrides |= forecast._override(text)
    experiment = kiln_config.resolve_experiment(args.configfile or [], overrides)
    for name, cfg in experiment.runs.items():
        run = RunConfig.of(cfg)
        started = time.perf_counter()
        rehearsal = rehearse(run, forecast._model(cfg, run).vocab_size, forecast._assumed_gpu(run))
        print(_table(rehearsal) + f"\n\n({time.perf_counter() - started:.0f} s)\n")
        check(rehearsal)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rehearse",
        help="run a config's GPU-side work on fake tensors at its real shapes and world size: each phase's memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--configfile", nargs="+", metavar="FILE", help="run files, as given to snakemake (none: the embedded default)"
    )
    parser.add_argument("--config", nargs="+", metavar="KEY=VALUE", help="overrides, as given to snakemake")
    parser.set_defaults(run=_run)
