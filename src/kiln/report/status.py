"""`kiln status results/<run>`: where a run stands, for a login node while the stages run elsewhere
(Slurm jobs on other hosts). It reads only files that Snakemake and Kiln leave in the working
directory, the folder that holds results/, so it needs neither torch nor a Snakemake process:

- results/<run>/layout.json (kiln.layout, written when snakemake starts): where the run's data
  stages are (results/data/<stage>-<key>, shared with other runs); each stage's declared outputs
  there and under results/<run>/ (kiln.layout.STAGES, which the rules declare);
- Snakemake's incomplete markers, .snakemake/incomplete/<urlsafe base64 of the output path as the
  rule spells it>, written when a job starts (or is submitted to Slurm) and removed when it ends,
  each holding {"external_jobid": the Slurm job id, or null}; .snakemake/locks/ exists while a
  Snakemake process holds the folder;
- the slurm executor's job logs, .snakemake/slurm_logs/rule_<rule>/<jobid>.log (it deletes those of
  successful jobs unless told to keep them), and squeue/sacct when they are on PATH;
- each stage's log and benchmark, train/metrics.jsonl, train/checkpoints/LATEST and smoke/plan.json
  (max_steps, tokens per step).

`kiln status results/<sweep>` lists the sweep's arms, one line each. A run folder of an older Kiln
(its data stages inside it) reads as it was laid out.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kiln import layout as kiln_layout
from kiln.errors import KilnError
from kiln.io import benchmark_seconds, last_json_line
from kiln.layout import Layout
from kiln.plan.tables import aligned, format_eta

# Slurm states after which the job will never write its outputs.
SLURM_FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
LOG_TAIL_LINES = 12


@dataclasses.dataclass
class SlurmJob:
    id: str
    state: str | None = None  # squeue's or sacct's word; "unknown" when neither is on PATH
    nodes: str | None = None
    log: str | None = None


@dataclasses.dataclass
class StageStatus:
    name: str
    state: str = "pending"  # done | running | failed | pending
    seconds: float | None = None  # wall time once done (benchmark), since start while running
    job: SlurmJob | None = None
    progress: dict | None = None
    note: str = ""
    log: str | None = None
    log_tail: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)


def stage_seconds(paths: Layout, stage: str) -> float | None:
    """A done stage's time: its job's benchmark, plus its plan's and part jobs' for a scattered stage
    (their sum, the work it took: on a cluster the part jobs overlap); None without its own."""
    own = benchmark_seconds(Path(paths.benchmark(stage)))
    if own is None:
        return None
    return sum(filter(None, (benchmark_seconds(p) for p in paths.benchmarks(stage))))


def marker_path(workdir: Path, key: str) -> Path:
    """Where Snakemake's FilePersistence puts the incomplete marker of output `key`: names longer
    than NAME_MAX (255) - 1 are split into folders, all but the last prefixed with '@'."""
    name = base64.urlsafe_b64encode(key.encode()).decode()
    parts = [name[i : i + 254] for i in range(0, len(name), 254)]
    return workdir.joinpath(".snakemake", "incomplete", *["@" + p for p in parts[:-1]], parts[-1])


def query_slurm(job_id: str) -> tuple[str, str | None]:
    """(state, nodes) of a job: squeue knows queued and running jobs, sacct also finished ones."""
    commands = [
        ["squeue", "-h", "-j", job_id, "-o", "%T|%N"],
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,NodeList"],
    ]
    available = [c for c in commands if shutil.which(c[0])]
    for command in available:
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=15).stdout
        except (OSError, subprocess.TimeoutExpired):  # a hung controller must not hang the command
            continue
        line = next((x for x in out.splitlines() if x.strip()), "")
        if line:
            state, _, nodes = line.partition("|")
            nodes = nodes.strip()
            return state.split()[0], None if nodes in ("", "None assigned", "(null)") else nodes
    # "unknown": no Slurm client on this host; "unlisted": neither knows the job (any more)
    return "unknown" if not available else "unlisted", None


def mtime(path: Path) -> float | None:
    """None for a file gone since it was listed: a live run removes markers and logs at any time."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def find_slurm_job(workdir: Path, stage: str, job_id: str | None, newer_than: float) -> SlurmJob | None:
    """The stage's Slurm job: the id Snakemake recorded in its marker, else the newest job log."""
    folder = workdir / ".snakemake" / "slurm_logs" / f"rule_{stage}"
    logs = {p: mtime(p) or 0 for p in folder.rglob("*.log")} if folder.is_dir() else {}
    logs = {p: t for p, t in logs.items() if t >= newer_than}
    if job_id is None and not logs:
        return None
    log = max(logs, key=logs.get) if job_id is None else next((p for p in logs if p.stem == job_id), None)
    job = SlurmJob(id=job_id or log.stem, log=str(log.relative_to(workdir)) if log else None)
    job.state, job.nodes = query_slurm(job.id)
    return job


def json_or_empty(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def train_progress(paths: Layout) -> dict | None:
    train = paths.folder("train")
    record = last_json_line(train / kiln_layout.METRICS)
    if record is None:
        return None
    plan = json_or_empty(Path(paths.output("plan", "plan.json")))
    max_steps, rate = plan.get("max_steps"), record.get("tokens_per_s")
    tokens_per_step = plan.get("tokens_per_step") or record["tokens"] / max(record["step"], 1)
    checkpoint = kiln_layout.latest_step(train)
    return {
        "step": record["step"],
        "max_steps": max_steps,
        "loss": record.get("loss"),
        "val_loss": record.get("val_loss"),
        "tokens_per_s": rate,
        "eta_s": (max_steps - record["step"]) * tokens_per_step / rate if max_steps and rate else None,
        "checkpoint_step": checkpoint,
    }


def smoke_progress(log: Path) -> dict | None:
    """Smoke writes no metrics file; its log counts the probe's steps ("probe step 8/12")."""
    found = re.findall(r"probe step (\d+)/(\d+)", log.read_text(errors="replace")) if log.exists() else []
    return {"step": int(found[-1][0]), "max_steps": int(found[-1][1])} if found else None


def inspect_stage(
    workdir: Path, paths: Layout, name: str, upstream_done: bool, locked_since: float | None
) -> StageStatus:
    """done: every output there and none marked incomplete; running: marked (Slurm has not ended
    the job, or a Snakemake still holds the folder); failed: the job ended without its outputs;
    pending: not started, or failed before the Snakemake now running, which will redo it."""
    outputs = {Path(p).relative_to(workdir).as_posix(): Path(p) for p in paths.outputs(name)}
    # a scattered stage runs while its plan or any part job does (kiln.layout.SCATTER_JOBS)
    jobs = [*outputs, *(Path(p).relative_to(workdir).as_posix() for p in paths.scatter_outputs(name))]
    markers = {m: t for m in (marker_path(workdir, rel) for rel in jobs) if (t := mtime(m))}
    log = Path(paths.log(name))
    status = StageStatus(
        name,
        missing=[rel for rel, p in outputs.items() if not p.exists()],
        log=str(log.relative_to(workdir)) if log.exists() else None,
    )
    if markers:
        started = min(markers.values())  # Snakemake too takes a marker's mtime as the job's start
        job_id = json_or_empty(next(iter(markers))).get("external_jobid")
        status.job = find_slurm_job(workdir, name, job_id, started)
        status.state, status.seconds = "running", time.time() - started
        if status.job and status.job.state in SLURM_FAILED:
            status.state, status.note = "failed", f"Slurm job {status.job.state.lower()}"
        elif (status.job is None or status.job.state in ("unknown", "unlisted")) and locked_since is None:
            status.state = "failed"
            status.note = "interrupted: no Snakemake holds the folder; rerun with --rerun-incomplete"
    elif not status.missing:
        newest_output = max(mtime(p) or 0 for p in outputs.values())
        status.state, status.seconds = "done", stage_seconds(paths, name)
        status.job = find_slurm_job(workdir, name, None, newest_output)
    elif log.exists() and upstream_done and (locked_since is None or (mtime(log) or 0) >= locked_since):
        # A log older than the running Snakemake's lock is an earlier attempt that it will redo.
        status.state = "failed"
        status.job = find_slurm_job(workdir, name, None, 0)
    if name == "train":
        status.progress = train_progress(paths)
    elif name == "smoke" and status.state == "running":
        status.progress = smoke_progress(log)
    if status.progress and status.state != "running":
        status.progress["eta_s"] = None
    if status.state == "failed" and log.exists():
        status.log_tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return status


def inspect_run(workdir: Path, run_dir: Path) -> list[StageStatus]:
    paths = Layout.read(run_dir)
    locks = list((workdir / ".snakemake" / "locks").glob("*.lock"))
    locked_since = min((t for p in locks if (t := mtime(p))), default=None)
    stages: list[StageStatus] = []
    for stage in kiln_layout.STAGES:  # a chain: each stage needs every one before it, or those it names
        upstream_done = all(s.state == "done" for s in stages if stage.needs is None or s.name in stage.needs)
        stages.append(inspect_stage(workdir, paths, stage.name, upstream_done, locked_since))
    return stages


def describe_progress(progress: dict | None) -> str:
    if not progress:
        return ""
    step = f"step {progress['step']:,}" + (f"/{progress['max_steps']:,}" if progress.get("max_steps") else "")
    parts = [step]
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.2f}")
    if progress.get("tokens_per_s"):
        rate = progress["tokens_per_s"]
        parts.append(f"{rate / 1e6:.3g}M tok/s" if rate >= 1e6 else f"{rate / 1e3:.3g}k tok/s")
    if progress.get("eta_s") is not None:
        parts.append(f"ETA {format_eta(progress['eta_s'])}")
    if progress.get("checkpoint_step") is not None:
        parts.append(f"ckpt {progress['checkpoint_step']:,}")
    return " ".join(parts)


def describe_job(job: SlurmJob | None) -> str:
    if job is None:
        return ""
    return " ".join(x for x in (job.id, job.state, job.nodes) if x)


def overall(run_dir: Path, stages: list[StageStatus]) -> str:
    by_state = {s.state: s for s in reversed(stages)}  # the first stage in each state
    if "failed" in by_state:
        s = by_state["failed"]
        return f"{s.name} failed" + (f" ({s.note})" if s.note else "") + (f": see {s.log}" if s.log else "")
    if "running" in by_state:
        s, where = by_state["running"], ""
        if s.job:
            where = (f" on {s.job.nodes}" if s.job.nodes else "") + f" (job {s.job.id}"
            where += ", waiting in the queue)" if s.job.state == "PENDING" else ")"
        progress = describe_progress(s.progress)
        return f"{s.name} running{where}" + (f": {progress}" if progress else "")
    if "pending" not in by_state:
        total = sum(s.seconds or 0 for s in stages)
        return f"complete in {format_eta(total)}: {run_dir / 'report.md'}"
    done = [s.name for s in stages if s.state == "done"]
    if not done:
        return "nothing has run yet (snakemake --cores all)"
    return f"stopped after {done[-1]}; next: {by_state['pending'].name}"


def render_table(run_dir: Path, stages: list[StageStatus]) -> str:
    rows = [("stage", "state", "time", "slurm job", "progress")]
    for s in stages:
        seconds = format_eta(s.seconds) if s.seconds is not None else ""
        rows.append((s.name, s.state, seconds, describe_job(s.job), describe_progress(s.progress) or s.note))
    with_slurm = any(s.job for s in stages)  # no empty column on a machine without Slurm
    rows = [r[:3] + r[3 + (not with_slurm) :] for r in rows]
    lines = [f"run {run_dir.name} ({run_dir})", *aligned(rows)]
    lines += ["", overall(run_dir, stages)]
    for s in stages:
        if s.log_tail:
            lines += [f"last lines of {s.log}:"] + [f"  {line}" for line in s.log_tail]
    return "\n".join(lines)


def render_detail(stage: StageStatus) -> str:
    lines = [f"{stage.name}: {stage.state}" + (f" ({stage.note})" if stage.note else "")]
    if stage.seconds is not None:
        lines.append(f"  time: {format_eta(stage.seconds)}")
    if stage.job:
        lines.append(f"  slurm job: {describe_job(stage.job)}" + (f", log {stage.job.log}" if stage.job.log else ""))
        if stage.job.state == "unknown":
            lines.append("  (squeue and sacct are not on PATH here)")
    if stage.progress:
        lines.append(f"  progress: {describe_progress(stage.progress)}")
    lines.append(f"  missing outputs: {', '.join(stage.missing) or 'none'}")
    lines.append(f"  log: {stage.log or 'none yet'}")
    lines += [f"    {line}" for line in stage.log_tail]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    run_dir = (args.directory / args.run_dir).resolve()
    if not run_dir.is_dir():
        raise KilnError(
            f"{run_dir}: no such run folder; run `kiln status results/<run>` from the folder "
            "holding results/ (where snakemake ran), or pass --directory"
        )
    workdir = run_dir.parents[1]  # the Snakefile puts every run at results/<run> of the working directory
    arms = kiln_layout.read_sweep_index(run_dir)
    if arms is not None:
        return _sweep(args, workdir, run_dir, arms)
    stages = inspect_run(workdir, run_dir)
    summary = overall(run_dir, stages)
    if args.stage:
        stages = [s for s in stages if s.name == args.stage]
    if args.json:
        body = {
            "run": run_dir.name,
            "run_dir": str(run_dir),
            "workdir": str(workdir),
            "overall": summary,
            "stages": [dataclasses.asdict(s) for s in stages],
        }
        json.dump(body, sys.stdout, indent=1)
        print()
    else:
        print(render_detail(stages[0]) if args.stage else render_table(run_dir, stages))
        paths = Layout.read(run_dir)
        if paths.legacy:
            print("\n" + kiln_layout.legacy_message(run_dir, kiln_layout.legacy_data(run_dir)))
    return 0


def _sweep(args: argparse.Namespace, workdir: Path, sweep_dir: Path, arms: list[str]) -> int:
    """One line per arm: where it stands (the arm's own folder has the detail)."""
    rows = {}
    for arm in arms:
        arm_dir = sweep_dir.parent / arm
        try:
            rows[arm] = overall(arm_dir, inspect_run(workdir, arm_dir))
        except KilnError as exc:
            rows[arm] = str(exc).split(": ", 1)[-1]
    report = Path(kiln_layout.sweep_outputs(sweep_dir.name, sweep_dir.parent)["report"])
    summary = f"overlay report: {report}" if report.exists() else "overlay report: not yet (after every arm)"
    if args.json:
        json.dump({"sweep": sweep_dir.name, "arms": rows, "report": summary}, sys.stdout, indent=1)
        print()
        return 0
    width = max(len(arm) for arm in arms)
    print(f"sweep {sweep_dir.name} ({sweep_dir}): {len(arms)} arms")
    for arm, line in rows.items():
        print(f"  {arm.ljust(width)}  {line}")
    print(summary)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "status",
        help="where a run stands: each stage's state, Slurm job and progress",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("run_dir", metavar="run", help="the run's folder, results/<run_name> (or a sweep's)")
    parser.add_argument(
        "--directory",
        type=Path,
        default=Path("."),
        help="the working directory snakemake ran in, holding results/ (default: here)",
    )
    parser.add_argument(
        "--stage", choices=[stage.name for stage in kiln_layout.STAGES], help="show one stage in detail"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)
