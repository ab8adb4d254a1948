"""The train stage against its time budget (kiln.train.budget), on a quiet machine and with a CPU hog
started half-way through it: where each ends against its budget, and the steps the smoke stage planned
against those the re-planning trained.

    python bench/budget.py            # the embedded default (7-minute budget), quiet then hogged: ~20 min on 2 cores
    python bench/budget.py --quick    # a slice of the standard library, a tiny model, a 1-minute budget, quiet arm: ~75 s
    python bench/budget.py --config 'train={budget: {minutes: 3}}'   # any --config override

Both arms are one run (run name budget-bench, or budget-bench-quick; the default's data folders are
shared): Snakemake runs the data stages and the smoke gate (forced, so the budget is planned on this
machine now) with the first train stage, then the train stage again, forced (it sets the first's
checkpoints aside as a finished run's, under train/superseded/). --quick checks that the bench runs:
at 30 s the start-up and the exit are most of the budget, and the end's reserve (a log window and the
end, kept for a slow-down after the last decision; kiln.train.budget) a large share of it, so its
figures mean little. 30 s, not less: a loaded or slow machine's start-up alone has taken 21 s, and the
budget must still buy steps. For the hogged arm the bench
waits until the launcher has started the stage (its line in train/jobs.jsonl) and half the budget has
passed, then starts one process spinning on every core until the stage ends.

The stage's wall time is the launcher's (kiln.train.launch's start and end lines in train/jobs.jsonl:
from before torchrun starts to after every rank has exited), the figure the budget bounds; train's own
(summary.json spent_s, written after the export, before the processes exit) is printed beside it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln import config as kiln_config
from kiln.layout import TRAIN_JOBS, Layout

ROOT = Path(__file__).resolve().parent.parent
QUICK = [
    "download={sources: [{name: stdlib, kind: stdlib, include: ['json/*.py', 'email/*.py', 'http/*.py']}], "
    "rows_per_part: 20}",
    "tokenizer={vocab_size: 512, heldout_docs: 5}",
    "pretokenize={val_tokens: 20000}",
    "shard={seq_len: 64}",
    "model={n_layer: 2, n_head: 2, d_model: 64}",
    "smoke={steps: 12, min_loss_drop: 0.05, overfit: {rows: 4, max_steps: 150, max_loss: 1.5}}",
    "train={budget: {minutes: 1}, micro_batch: 16, batch_tokens: 1024, precision: fp32, compile: false, "
    "warmup_steps: 2, log_every: 10, eval_every: 100, eval_batches: 4, checkpoint_every: 200, "
    "samples: {prompts: ['import json\\n'], max_new_tokens: 8}}",
    "wandb={mode: disabled}",
]


def spin() -> None:
    while True:
        pass


def snakemake(args, targets: list[str], *extra: str) -> None:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "all", *targets, *extra, "--configfile", str(args.configfile)]
    cmd += ["--config", f"run_name={args.run_name}", *args.config]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL if args.quiet else None)


def job_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def hog_halfway(jobs: Path, before: int, budget_s: float, done: threading.Event, started: list) -> None:
    """Once the launcher's start line of the new train job is in jobs.jsonl and half the budget has
    passed since, one spinning process per core until `done`."""
    while not done.is_set() and len(job_lines(jobs)) <= before:
        time.sleep(0.05)
    if done.is_set():
        return
    start = job_lines(jobs)[before]["time"]
    done.wait(max(0.0, start + budget_s / 2 - time.time()))
    if done.is_set():
        return
    procs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in procs:
        p.start()
    started.append(time.time() - start)
    done.wait()
    for p in procs:  # ours: ended by their own handles
        p.terminate()
        p.join()


def train_arm(args, paths: Layout, hog: bool) -> dict:
    """One train stage, forced; the quiet arm forces the smoke stage too (the budget planned on this
    machine now), in the same Snakemake start (each start costs seconds: Snakemake's own)."""
    train_dir = ROOT / paths.folder("train")
    jobs = train_dir / TRAIN_JOBS
    before = len(job_lines(jobs))
    done, started = threading.Event(), []
    if hog:
        budget_s = json.loads((ROOT / paths.output("plan", "plan.json")).read_text())["budget_s"]
        thread = threading.Thread(target=hog_halfway, args=(jobs, before, budget_s, done, started))
        thread.start()
    try:
        # the plan rule prices the smoke measurements train plans from: its plan.json is train's plan
        targets = [paths.output("train", "summary.json"), paths.output("plan", "plan.json")]
        snakemake(args, targets, "--forcerun", "train" if hog else "smoke")
    finally:
        done.set()
        if hog:
            thread.join()
    plan = json.loads((ROOT / paths.output("plan", "plan.json")).read_text())
    start, end = job_lines(jobs)[before], job_lines(jobs)[-1]
    summary = json.loads((train_dir / "summary.json").read_text())
    return {
        "arm": f"hog from {started[0]:.0f} s" if started else "quiet",
        "budget_s": plan["budget_s"],
        "launcher_s": end["time"] - start["time"],
        "spent_s": summary.get("spent_s"),
        "planned": plan["max_steps"],
        "final": summary["steps"],
        "replans": summary.get("replans"),
        "decisions": summary.get("decisions"),
    }


def main() -> None:
    parser = common.parser(__doc__, quick="a slice of the stdlib, a tiny model, a 1-minute budget, the quiet arm only")
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--config", nargs="*", default=[], help="--config overrides (after --quick's)")
    parser.add_argument("--run-name", default=None)
    parser.add_argument("--no-hog", action="store_true", help="the quiet arm only")
    parser.add_argument("--quiet", action="store_true", help="Snakemake's output not shown")
    args = parser.parse_args()
    args.run_name = args.run_name or ("budget-bench-quick" if args.quick else "budget-bench")
    args.config = (QUICK if args.quick else []) + args.config
    overrides = dict(text.split("=", 1) for text in args.config) | {"run_name": args.run_name}
    paths = Layout(kiln_config.resolve([args.configfile], overrides))  # relative to ROOT, as Snakemake's targets
    hog = not (args.no_hog or args.quick)  # at 1 minute a hog's figure means nothing; --quick checks the bench runs
    rows = [train_arm(args, paths, hog=False)] + ([train_arm(args, paths, hog=True)] if hog else [])
    print(
        "\n| arm | budget s | stage s (launcher) | of budget | train's own s | steps planned (smoke) | "
        "steps trained | re-plans / decisions |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        own = "" if r["spent_s"] is None else f"{r['spent_s']:.1f}"
        print(
            f"| {r['arm']} | {r['budget_s']:.0f} | {r['launcher_s']:.1f} | {r['launcher_s'] / r['budget_s']:.1%} | "
            f"{own} | {r['planned']:,} | {r['final']:,} | {r['replans']} / {r['decisions']} |"
        )


if __name__ == "__main__":
    main()
