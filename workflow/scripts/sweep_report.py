"""sweep report: results/<sweep>/sweep.md, sweep.png and sweep.json, the arms of a sweep side by side
(kiln.report.sweep): validation curves against tokens and wall time, final figures, the best
arm, and for a ladder the fit of loss against parameters and compute.

Under Snakemake it receives the sweep as JSON (--sweep: its name, the sweep section and every arm's
validated config); by hand, --config with a sweep config file.
"""

import argparse
import json
from pathlib import Path

from kiln import config as kiln_config
from kiln.config.sweep import varied_keys
from kiln.io import atomic_file, write_json
from kiln.report.sweep import collect, ladder_fit, plot, render, table
from kiln.stage import run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sweep", help="{name, sweep, runs} as JSON; this is how Snakemake calls the script")
    source.add_argument("--config", type=Path, help="a Kiln config file with a sweep section")
    parser.add_argument("--results", type=Path, default=Path("results"), help="the results folder")
    parser.add_argument("--report", required=True, type=Path, help="output sweep.md")
    parser.add_argument("--plot", required=True, type=Path, help="output sweep.png")
    parser.add_argument("--table", required=True, type=Path, help="output sweep.json")
    args = parser.parse_args()
    if args.sweep:
        spec = json.loads(args.sweep)
    else:
        experiment = kiln_config.resolve_experiment([args.config])
        spec = {"name": experiment.name, "sweep": experiment.sweep, "runs": experiment.runs}
    varied = varied_keys(spec["sweep"] or {})
    arms, curves = collect(spec["runs"], varied, args.results)
    fit = ladder_fit(arms)
    with atomic_file(args.plot) as tmp:
        plot(arms, curves, tmp)
    write_json(args.table, table(arms, fit))
    with atomic_file(args.report) as tmp:
        tmp.write_text(render(spec["name"], arms, varied, fit, args.plot.name), encoding="utf-8")
    print(f"sweep report: {args.report.resolve()}")


if __name__ == "__main__":
    run_main(main)
