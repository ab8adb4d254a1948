"""A sweep's wall time against the work it does: the data stages once plus every arm's smoke, train,
eval and report, in one run, from an empty working folder.

    python bench/sweep.py                                          # config/config.yaml + stdlib-lr-sweep.yaml
    python bench/sweep.py --configfile tests/configs/tiny.yaml config/experiments/stdlib-lr-sweep.yaml \
        --config 'train={budget: null}'                            # seconds, not minutes
    python bench/sweep.py --quick      # tiny.yaml + the sweep, download stage only: what tests/bench/test_bench.py runs

Runs `snakemake --cores all` on the files in a scratch folder (--workdir, removed first), then reads
every job's benchmark file (kiln.layout says where): the sum of the stage times is what the sweep
had to do with the data built once; the wall time of the whole Snakemake call is what it took. A
ratio near 1 means nothing ran twice and little was lost between jobs; three separate runs (islands)
would have added the data stages twice more, which the last line prices from the same figures.

--quick stops Snakemake after the download stage (--until download) of tests/configs/tiny.yaml's
sweep in a scratch folder: the table is printed with every later job "not run". Even the tiny run's
whole DAG takes over a minute on 2 cores (a process and its imports per job, torchrun for smoke and
train), too long for the test suite; the bench's own code (the experiment, the Snakemake call, the
layouts, the benchmark files, the table) runs all the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln import config as kiln_config
from kiln.io import benchmark_seconds as seconds
from kiln.layout import DATA_STAGES, RUN_STAGES, Layout, sweep_outputs

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = common.parser(__doc__, quick="the download stage of a tiny sweep only (see above)")
    parser.add_argument(
        "--configfile",
        nargs="+",
        type=Path,
        default=[ROOT / "config" / "config.yaml", ROOT / "config" / "experiments" / "stdlib-lr-sweep.yaml"],
    )
    parser.add_argument("--config", nargs="*", default=[], help="Snakemake --config overrides")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kiln-sweep-bench"))
    args = parser.parse_args()
    if args.quick:
        args.configfile = [ROOT / "tests" / "configs" / "tiny.yaml", args.configfile[-1]]
        args.workdir = Path(tempfile.mkdtemp(prefix="kiln-sweep-bench-"))
    files = [str(p.resolve()) for p in args.configfile]
    overrides = dict(text.split("=", 1) for text in args.config)
    experiment = kiln_config.resolve_experiment(files, overrides)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(args.workdir),
        "--cores",
        "all",
        "--configfile",
        *files,
    ]
    if args.config:
        cmd += ["--config", *args.config]
    if args.quick:
        cmd += ["--until", "download"]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # the jobs' python
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start

    results = args.workdir / "results"
    layouts = {run: Layout(cfg, root=results) for run, cfg in experiment.runs.items()}
    data = {stage: seconds(next(iter(layouts.values())).benchmark(stage)) for stage in DATA_STAGES}
    arms = {run: {stage: seconds(paths.benchmark(stage)) for stage in RUN_STAGES} for run, paths in layouts.items()}
    folders = {str(paths.folder(stage)) for paths in layouts.values() for stage in DATA_STAGES}
    assert len(folders) == len(DATA_STAGES), "the arms did not share their data stages"
    sweep_s = 0.0
    if experiment.sweep:
        sweep_s = seconds(
            Path(sweep_outputs(experiment.name, results)["report"]).parent / "benchmarks" / "sweep_report.tsv"
        )
    # a job that did not run (--quick) has no benchmark file: None, "not run", nothing in the sums
    work = _sum(data.values()) + sum(_sum(a.values()) for a in arms.values()) + _sum([sweep_s])
    print("\n| job | s |\n|---|---:|")
    for stage, s in data.items():
        print(f"| {stage} (once) | {_s(s)} |")
    for run, stages in arms.items():
        print(f"| {run}: " + ", ".join(f"{k} {_s(v)}" for k, v in stages.items()) + f" | {_sum(stages.values()):.1f} |")
    if experiment.sweep:
        print(f"| sweep_report | {_s(sweep_s)} |")
    print(f"| **sum of the jobs** | **{work:.1f}** |")
    print(f"| **sweep wall time** (snakemake start to end) | **{wall:.1f}** ({wall / work:.3f}x the jobs' sum) |")
    islands = work + (len(arms) - 1) * _sum(data.values())
    print(
        f"\n{len(arms)} separate runs would have done {islands:.1f} s of jobs "
        f"(the data stages {len(arms)} times): {islands / work:.2f}x this sweep's."
    )
    if args.quick:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


def _sum(seconds) -> float:
    return sum(s for s in seconds if s is not None)


def _s(seconds: float | None) -> str:
    return "not run" if seconds is None else f"{seconds:.1f}"


if __name__ == "__main__":
    sys.exit(main())
