"""Per-stage wall time, CPU time and peak memory of a finished run, from Snakemake's benchmark files.

    python bench/stage_times.py results/stdlib-code

Prints a markdown table (the form docs/benchmarks.md records) with the total against the 15-minute
budget of the embedded default on a 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from kiln.layout import STAGES, Layout

BUDGET_S = 15 * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="results/<run>")
    args = parser.parse_args()
    paths = Layout.read(args.run_dir)  # the data stages' benchmarks are in the shared folders it used
    print("| stage | wall s | CPU s | max RSS MiB |\n|---|---:|---:|---:|")
    total = 0.0
    for stage in (s.name for s in STAGES):
        path = Path(paths.benchmark(stage))
        if not path.exists():
            print(f"| {stage} | not run | | |")
            continue
        row = next(csv.DictReader(path.open(), delimiter="\t"))
        total += float(row["s"])
        print(f"| {stage} | {float(row['s']):.1f} | {float(row['cpu_time']):.1f} | {float(row['max_rss']):.0f} |")
    print(f"| **total** | **{total:.1f}** ({total / BUDGET_S:.0%} of the {BUDGET_S // 60}-minute budget) | | |")


if __name__ == "__main__":
    main()
