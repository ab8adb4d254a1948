"""A sweep's wall time against the work it does: the data stages once plus every arm's smoke, train,
eval and report, in one run, from an empty working folder.

    python bench/sweep.py                                          # config/config.yaml + stdlib-lr-sweep.yaml
    python bench/sweep.py --configfile tests/configs/tiny.yaml config/experiments/stdlib-lr-sweep.yaml \
        --config 'train={budget: null}'                            # seconds, not minutes

Runs `snakemake --cores all` on the files in a scratch folder (--workdir, removed first), then reads
every job's benchmark file (kiln.layout says where): the sum of the stage times is what the sweep
had to do with the data built once; the wall time of the whole Snakemake call is what it took. A
ratio near 1 means nothing ran twice and little was lost between jobs; three separate runs (islands)
would have added the data stages twice more, which the last line prices from the same figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kiln import run_config
from kiln.io import benchmark_seconds as seconds
from kiln.layout import DATA_STAGES, RUN_STAGES, Layout, sweep_outputs

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--configfile",
        nargs="+",
        type=Path,
        default=[ROOT / "config" / "config.yaml", ROOT / "config" / "experiments" / "stdlib-lr-sweep.yaml"],
    )
    parser.add_argument("--config", nargs="*", default=[], help="Snakemake --config overrides")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kiln-sweep-bench"))
    args = parser.parse_args()
    files = [str(p.resolve()) for p in args.configfile]
    overrides = dict(text.split("=", 1) for text in args.config)
    experiment = run_config.resolve_experiment(files, overrides)
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
    work = sum(data.values()) + sum(sum(a.values()) for a in arms.values()) + sweep_s
    print("\n| job | s |\n|---|---:|")
    for stage, s in data.items():
        print(f"| {stage} (once) | {s:.1f} |")
    for run, stages in arms.items():
        print(f"| {run}: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + f" | {sum(stages.values()):.1f} |")
    if experiment.sweep:
        print(f"| sweep_report | {sweep_s:.1f} |")
    print(f"| **sum of the jobs** | **{work:.1f}** |")
    print(f"| **sweep wall time** (snakemake start to end) | **{wall:.1f}** ({wall / work:.3f}x the jobs' sum) |")
    islands = work + (len(arms) - 1) * sum(data.values())
    print(
        f"\n{len(arms)} separate runs would have done {islands:.1f} s of jobs "
        f"(the data stages {len(arms)} times): {islands / work:.2f}x this sweep's."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
