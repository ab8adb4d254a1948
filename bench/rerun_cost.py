"""What one changed setting costs on a finished run: a `--config` change, then `snakemake` again.

    python bench/rerun_cost.py                                      # the default run (config/config.yaml)
    python bench/rerun_cost.py --configfile tests/configs/tiny.yaml # the tests' tiny run (~2 min a case)
    python bench/rerun_cost.py --tree /tmp/kiln-old                 # the same, with an older Kiln checkout
    python bench/rerun_cost.py --quick                              # tests/bench/test_bench.py: two cheap cases, the leanest run

Finishes the run once in a work folder, then, for each case, copies the finished folder, changes one
setting on the command line as a user would (`--config train={log_every: 20}`) and reruns the whole
DAG, timing the rerun and listing the jobs it ran. `--tree` runs another Kiln checkout's Snakefile
and package (PYTHONPATH=<tree>/src) with this environment, so the cost before a change to Kiln is
measured on the same machine in the same run as the cost after it.

Prints a markdown table (the form docs/benchmarks.md records): case, change, the jobs that ran, the
rerun's seconds and its share of the first full run's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import yaml

ROOT = Path(__file__).resolve().parents[1]

# (case, --config arguments): the kinds of change issue 28 names, cheapest first.
CASES = [
    ("presentation (train.log_every)", ["train={log_every: 20}"]),
    ("retries (train.max_resubmits)", ["train={max_resubmits: 5}"]),
    ("wandb.mode", ["wandb={mode: %s}"]),  # %s: the mode the run does not use (_wandb_flip)
    ("price (smoke.price_per_gpu_hour)", ["smoke={price_per_gpu_hour: 2.5}"]),
    ("sample prompts (train.samples.prompts)", ["train={samples: {prompts: ['def main():\\n']}}"]),
    ("eval (eval.max_batches)", ["eval={max_batches: 10}"]),
    ("trajectory (train.lr)", ["train={lr: 0.004}"]),
]
QUICK = ("presentation (train.log_every)", "price (smoke.price_per_gpu_hour)")
QUICK_EVAL = {"eval": {"lm_eval": {"tasks": []}, "humaneval": {"problems": 0}, "humaneval_infill": {"problems": 0}}}


def _wandb_flip(configfile: Path) -> str:
    """The wandb mode a run does not use, so that the wandb case changes it (offline or disabled)."""
    mode = (yaml.safe_load(configfile.read_text(encoding="utf-8")).get("wandb") or {}).get("mode", "offline")
    return "disabled" if mode == "offline" else "offline"


def snakemake(tree: Path, workdir: Path, configfiles: list[Path], *extra: str) -> tuple[float, set[str]]:
    """Run the tree's Snakefile in workdir; (wall seconds, the rules that ran)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = f"{tree / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"  # its kiln, not this one's
    cmd = [sys.executable, "-m", "snakemake", "-s", str(tree / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--cores", "all", "--configfile", *map(str, configfiles), *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    spent = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    rules = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", done.stdout + done.stderr, flags=re.M)) - {"all"}
    return spent, rules


def main() -> None:
    parser = common.parser(
        __doc__, quick="the leanest run (tests/configs/tags.yaml), two cheap cases (tests/bench/test_bench.py)"
    )
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the Kiln checkout to run (default: this one)")
    parser.add_argument("--workdir", type=Path, help="where the runs go (default: a new temporary folder)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kiln-rerun-cost-"))
    configfiles = [args.configfile.resolve()]
    if args.quick:  # the leanest run without its evals' costliest parts, which neither quick case reruns
        args.configfile = ROOT / "tests" / "configs" / "tags.yaml"
        lean = workdir / "quick.yaml"
        lean.write_text(yaml.safe_dump(QUICK_EVAL), encoding="utf-8")
        configfiles = [args.configfile.resolve(), lean]
    cases = [(name, change) for name, change in CASES if not args.quick or name in QUICK]
    finished = workdir / "finished"
    print(f"finishing the run once ({args.configfile.name}, Kiln at {args.tree}) in {finished}", flush=True)
    full_s, _ = snakemake(args.tree, finished, configfiles)
    print(f"| case | change | jobs | rerun s | of the first run ({full_s:.0f} s) |\n|---|---|---|---:|---:|")
    for name, change in cases:
        change = [arg.replace("%s", _wandb_flip(args.configfile)) for arg in change]
        copy = workdir / re.sub(r"\W+", "-", name).strip("-")
        shutil.copytree(finished, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
        spent, rules = snakemake(args.tree, copy, configfiles, "--config", *change)
        jobs = ", ".join(sorted(rules)) or "none"
        print(f"| {name} | `--config {' '.join(change)}` | {jobs} | {spent:.1f} | {spent / full_s:.0%} |", flush=True)
        shutil.rmtree(copy)
    if args.workdir is None:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
