"""The GPU check: the CUDA paths no CPU test reaches, on one H100/H200 in 9 minutes (enforced), as
one table. Run the folder, from the repository root of a clone (bench/common.py puts its src/ on
sys.path: no PYTHONPATH, no install):

    python bench/gpu_check                   # one GPU: the budgets sum to 493 s; 2+ GPUs: 533 s
    python bench/gpu_check --only flash,eval --budget-scale 2
    python bench/gpu_check --cpu-dry-run     # no GPU: what runs on the CPU, tiny shapes (CI: tests/bench/test_gpu_check.py)
    python bench/gpu_check --list-wheels     # what a node needs beside its torch (image), and how to carry it

Each check (checks.CHECKS) runs in a process forked from this one (torch imported once, CUDA first
touched in the child) under its own time budget (Check.budget_s), and the run as a whole under
DEADLINE_S: a check is given at most what is left of it, and one that cannot start in time gets its
rows, saying so. A hang, a crash or an OOM ends that check alone, as a FAIL with the reason (over
budget: with the last thing the check noted it was doing), and everything the check started is
ended with it, torchrun's ranks included, which sit in sessions of their own (procs), so the next
check starts on a free GPU. A check yields each row as its part ends, kept at once: a check stopped
short keeps the rows it finished, and only the row it was at and those after it read why. Checks that time steps take as many as their budget leaves room for. A
check's output goes to <out>/<check>.log; stdout gets one table, check | result | figure | expected,
with a row for every part whatever happened (stderr gets each check's rows as it ends, in case this
run is killed), and the exit status is 1 when any result is FAIL. A result is pass, FAIL, "measured"
(a figure with no pass mark: llm.c's tokens/s is a reference, not a Kiln target) or "skipped: <why>"
(no CUDA; one GPU where the two-rank check needs two). With --cpu-dry-run CUDA is hidden and every
check runs its CPU-capable part at tiny shapes: it FAILs if that part breaks, else reads "skipped: no
CUDA" with what the CPU part measured.

The folder: checks (every check and the CHECKS table), benches (the bench scripts' rows), llama
(issue 13's llama3.2-1b checks), ranks (the two-rank check and its torchrun worker), fsdp_one_rank
(FSDP2 and DCP on one GPU), seed_000 (seed 000's path at its shapes), shared (the checks' context
and helpers), procs (each check in a process of its own, and everything it started ended).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

if __package__ in (None, ""):  # `python bench/gpu_check` puts this folder first on sys.path: put bench/ there
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead, as for every bench script (gpu_check.*)

import common
import torch

from gpu_check import image
from gpu_check.checks import CHECKS, DEADLINE_S, ENVIRONMENT_S, MIN_START_S, Check
from gpu_check.procs import Outcome, run_isolated
from gpu_check.shared import NO_CUDA, Ctx
from kiln.train.launch import rank_environment


def environment() -> dict:
    """Whether CUDA sees a GPU, how many, and the machine in words (asked in a child: this process
    never touches CUDA, so that it can fork children that do)."""
    versions = f"torch {torch.__version__}"
    if not torch.cuda.is_available():
        return {"cuda": False, "gpus": 0, "about": f"CPU, {versions}"}
    props, gpus = torch.cuda.get_device_properties(0), torch.cuda.device_count()
    return {
        "cuda": True,
        "gpus": gpus,
        "about": f"{gpus} x {props.name}, {props.total_memory / 2**30:.0f} GiB, {versions}, CUDA {torch.version.cuda}",
    }


def isolated(check: Check | None, ctx: Ctx, out: Path, budget_s: float) -> Outcome:
    """The check's rows as it yields them (None: the environment probe, one item) from a process of
    its own under `budget_s`, everything it started ended after it (procs)."""
    slug = check.slug if check else "environment"

    def run() -> Iterable:
        ctx.work.mkdir(parents=True, exist_ok=True)
        return check.run(ctx) if check else [environment()]

    return run_isolated(run, out / f"{slug}.jsonl", out / f"{slug}.log", budget_s, ctx.work / Ctx.PROGRESS)


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_checks(chosen: list[Check], dry: bool, out: Path, deadline_s: float, scale: float) -> tuple[str, list]:
    """(the machine in words, the table's rows): every chosen check's rows, each with its result
    and figure or why it has none, within `deadline_s` of now."""
    deadline = time.monotonic() + deadline_s
    env, why = None, f"not started: the {deadline_s:.0f} s deadline"
    try:
        if deadline - time.monotonic() >= MIN_START_S:
            probe = isolated(None, Ctx(dry, out), out, min(ENVIRONMENT_S, deadline - time.monotonic()))
            env, why = (probe.items[0] if probe.items else None), probe.why  # interrupted: no env, and why
    except KeyboardInterrupt as exc:
        why = f"interrupted ({exc or 'SIGINT'})"
    table, stop = [], None
    for check in chosen:
        start = time.perf_counter()
        try:
            rows, stopped = _check_rows(check, env, why, stop, dry, out, deadline, deadline_s, scale)
        except KeyboardInterrupt as exc:  # SIGTERM too (_interrupted), outside a check's run
            stopped = f"interrupted ({exc or 'SIGINT'})"
            rows = [("FAIL", stopped)] * len(check.rows)
        stop = stop or stopped
        table += [
            (name, result, figure, expected)
            for name, (result, figure), expected in zip(check.rows, rows, check.expected)
        ]
        print(
            f"gpu_check: {check.slug} ({time.perf_counter() - start:.0f} s): "
            + "; ".join(f"{r}: {f}" for r, f in rows),
            file=sys.stderr,
            flush=True,
        )  # survives a kill of this run
    return (env or {}).get("about", "environment unknown"), table


def _check_rows(
    check: Check,
    env: dict | None,
    why: str | None,
    stop: str | None,
    dry: bool,
    out: Path,
    deadline: float,
    deadline_s: float,
    scale: float,
) -> tuple[list[tuple[str, str]], str | None]:
    """One check's (result, figure) rows: run, or why not; and why the run stops here (SIGTERM or
    SIGINT during the check), else None."""
    left = deadline - time.monotonic()
    if env is None:
        return [("FAIL", f"not run: the environment probe: {why}")] * len(check.rows), None
    if stop:
        return [("FAIL", f"not run: {stop}")] * len(check.rows), None
    if not (env["cuda"] or dry):
        return [(NO_CUDA, "")] * len(check.rows), None
    if not dry and env["gpus"] < check.gpus:
        return [(f"skipped: {env['gpus']} GPU, needs {check.gpus}", "")] * len(check.rows), None
    if left < MIN_START_S:
        return [("FAIL", f"not started: {max(left, 0):.0f} s left of the {deadline_s:.0f} s deadline")] * len(
            check.rows
        ), None
    budget = min(check.budget_s * scale, left)
    done = isolated(check, Ctx(dry, out / check.slug, deadline=time.monotonic() + budget), out, budget)
    return _kept(check, done), done.why if done.interrupted else None


def _kept(check: Check, done: Outcome) -> list[tuple[str, str]]:
    """The rows the check finished, then for the one it was at the reason it stopped, and for those
    after it that they were not reached."""
    rows = [tuple(row) for row in done.items[: len(check.rows)]]
    if len(rows) == len(check.rows):
        return rows
    at = check.rows[len(rows)]
    missing = [("FAIL", done.why or "the check returned without this row")]
    missing += [("FAIL", f"not reached: the check stopped at {at!r}")] * (len(check.rows) - len(rows) - 1)
    return rows + missing


def main() -> None:
    parser = common.parser(__doc__, quick="--cpu-dry-run, as every bench script spells it (tests/bench/test_bench.py)")
    parser.add_argument(
        "--cpu-dry-run", dest="quick", action="store_true", help="hide CUDA; run the CPU-capable parts at tiny shapes"
    )
    parser.add_argument(
        "--list-wheels",
        action="store_true",
        help="print the wheels a node needs beside its torch, and how to carry them",
    )
    parser.add_argument("--only", help=f"comma-separated checks: {', '.join(c.slug for c in CHECKS)}")
    parser.add_argument("--out", type=Path, help="logs and scratch files (default: a new temporary folder)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every check's time budget")
    parser.add_argument(
        "--deadline-s",
        type=float,
        help=f"stop starting checks after this many seconds (default {DEADLINE_S} x --budget-scale)",
    )
    args = parser.parse_args()
    if args.list_wheels:
        print(image.carry_commands())
        return
    only = set(args.only.split(",")) if args.only else {c.slug for c in CHECKS}
    if only - {c.slug for c in CHECKS}:
        parser.error(f"--only: unknown checks {', '.join(sorted(only - {c.slug for c in CHECKS}))}")
    chosen = [c for c in CHECKS if c.slug in only]
    if args.quick:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before any child touches CUDA (this process never does)
    os.environ.update(rank_environment(1))  # what a train job's ranks get (kiln.train.launch): the checks' children too
    out = args.out or Path(tempfile.mkdtemp(prefix="kiln-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupted)  # a session's end: still the table, the checks ended
    deadline_s = DEADLINE_S * args.budget_scale if args.deadline_s is None else args.deadline_s
    about, table = run_checks(chosen, args.quick, out, deadline_s, args.budget_scale)
    print(f"{about}{' (--cpu-dry-run: CUDA hidden)' if args.quick else ''}; logs in {out}\n")
    print("| check | result | figure | expected |\n|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    sys.exit(1 if any(result == "FAIL" for _, result, _, _ in table) else 0)


if __name__ == "__main__":
    main()
