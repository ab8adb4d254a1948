"""Per-stage wall time, CPU time and peak memory of a finished run, from Snakemake's benchmark files.

    python bench/stage_times.py results/stdlib-code
    python bench/stage_times.py --quick     # a made-up run folder (every stage but report): tests/bench/test_bench.py

Prints a markdown table (the form docs/benchmarks.md records) with the total against the 15-minute
budget of the embedded default on a 2-core machine.
"""

from __future__ import annotations

import csv
import shutil
import tempfile
from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln import config as kiln_config
from kiln.layout import STAGES, Layout

BUDGET_S = 15 * 60
BENCHMARK_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time"  # Snakemake's


def made_up_run(root: Path) -> Path:
    """--quick: the embedded default's run folder under root with layout.json and a benchmark file
    of one second for every stage but the last (which reads as not run)."""
    paths = Layout(kiln_config.resolve(), root=root)
    paths.write()
    for stage in [s.name for s in STAGES][:-1]:
        path = Path(paths.benchmark(stage))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{BENCHMARK_HEADER}\n1.00\t0:00:01\t100.0\t200.0\t90.0\t95.0\t0.0\t0.0\t50.0\t0.50\n")
    return paths.run_dir


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("run_dir", type=Path, nargs="?", help="results/<run>")
    args = parser.parse_args()
    if args.quick:
        args.run_dir = made_up_run(Path(tempfile.mkdtemp(prefix="kiln-stage-times-")))
    if args.run_dir is None:
        parser.error("the run folder (results/<run>) is required")
    paths = Layout.read(args.run_dir)  # the data stages' benchmarks are in the shared folders it used
    print("| stage | wall s | CPU s | max RSS MiB |\n|---|---:|---:|---:|")
    total = 0.0
    for stage in (s.name for s in STAGES):
        if not Path(paths.benchmark(stage)).exists():
            print(f"| {stage} | not run | | |")
            continue
        # a scattered stage's plan and part jobs too (kiln.layout.SCATTER_JOBS): their sum, as run here
        rows = [next(csv.DictReader(path.open(), delimiter="\t")) for path in paths.benchmarks(stage)]
        wall, cpu = sum(float(r["s"]) for r in rows), sum(float(r["cpu_time"]) for r in rows)
        total += wall
        print(f"| {stage} | {wall:.1f} | {cpu:.1f} | {max(float(r['max_rss']) for r in rows):.0f} |")
    print(f"| **total** | **{total:.1f}** ({total / BUDGET_S:.0%} of the {BUDGET_S // 60}-minute budget) | | |")
    if args.quick:
        shutil.rmtree(args.run_dir.parent)


if __name__ == "__main__":
    main()
