"""A train job that reaches its Slurm time limit saves a checkpoint, and the same snakemake command
resubmits it and finishes the run unattended, on the two-node test cluster (tests/slurm/cluster.py)
through profiles/slurm as a user runs it.

The profile asks Slurm for SIGTERM before train's time limit (`slurm_extra: --signal=TERM@<s>`);
here the limit is cut to 2 minutes and the signal to 60 s before it. Slurm signals every process of
the job step: the ranks (directly, and again through torchrun) agree on a step, save it and exit 75,
before the limit. Snakemake resubmits the job (train.max_resubmits; kiln.train.launch lets a
resubmission train only after a preemption), which resumes at the next step and finishes.

The first train job holds (KILN_FAULT=hold@<step>, kiln.train.faults: both ranks sleep at that step
until the signal reaches them) rather than training "long enough": how many steps outlast 2 minutes
depends on the machine (2500 took 60-90 s on one and about a minute on a faster one, which then
finished inside its limit), while a held job runs until it is signalled on any machine, and the run
stays a few hundred steps, so the resubmission finishes inside its own 2 minutes (the environment,
and so the fault, goes with it, but it resumes past the held step); on a machine too slow for that
it is signalled in turn and resubmitted again, which the test allows.

Not 1 minute: slurmctld sends the warning at its first time-limit check (every 30 s) once at most
the warning + 30 s are left, which for a 1-minute job is any time from its start, before the ranks
are up. With 2 minutes and 60 s it comes 30-60 s in, the ranks training since ~10 s (9 s from
submission to the first step here, idle): the one speed this test still needs is a start under 30 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
VENV_BIN = str(Path(sys.executable).parent)
MAX_STEPS = 300
HOLD_STEP = 20  # a log step: the ranks read the signal's flag at that step, not one late
TRAIN = (f"train={{nproc_per_node: 2, micro_batch: 8, max_steps: {MAX_STEPS}, log_every: 10, eval_every: 1000, "
         "checkpoint_every: 100000}")

pytestmark = pytest.mark.slurm


def profile(tmp: Path, runtime_min: int, signal_s: int) -> Path:
    """profiles/slurm with train's time limit and warning signal changed, and nothing else."""
    cfg = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert cfg["set-resources"]["train"]["slurm_extra"] == "'--signal=TERM@300'"  # what a user gets
    cfg["set-resources"]["train"].update(runtime=runtime_min, slurm_extra=f"'--signal=TERM@{signal_s}'")
    folder = tmp / f"profile-{runtime_min}min"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


def snakemake(cluster, workdir: Path, profile_dir: Path | None, log: Path, fault: str | None = None
              ) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    if profile_dir is None:
        argv += ["--cores", "2", "results/tiny/smoke/report.json"]
    else:
        argv += ["--profile", str(profile_dir), "--slurm-init-seconds-before-status-checks", "2",
                 "results/tiny/train/summary.json"]
    argv += ["--configfile", str(TINY), "--config", TRAIN]
    env = cluster.env(dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"]))
    env.pop("KILN_FAULT", None)
    if fault:  # sbatch passes the environment on to the job (the plugin submits with --export=ALL)
        env["KILN_FAULT"] = fault
    with log.open("w") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    result.stdout = log.read_text()
    return result


def train_jobs(output: str) -> list[str]:
    return re.findall(r"SLURM jobid (\d+) \(log: \S*/rule_train/", output)


def test_a_train_job_at_its_time_limit_saves_and_is_resubmitted_until_it_finishes(slurm_cluster, tmp_path):
    workdir = tmp_path / "run"
    local = snakemake(slurm_cluster, workdir, None, tmp_path / "local.log")  # data and smoke, here
    assert local.returncode == 0, local.stdout[-3000:]
    train_dir = workdir / "results" / "tiny" / "train"

    # One command, left to itself: the first job holds until its time-limit warning, saves and exits
    # 75; Snakemake resubmits it (train.max_resubmits, default 3) with the same limit and environment,
    # and the resubmission resumes past the held step and finishes.
    result = snakemake(slurm_cluster, workdir, profile(tmp_path, 2, 60), tmp_path / "snakemake.log",
                       fault=f"hold@{HOLD_STEP}")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "exit status 75" in result.stdout and "Trying to restart job" in result.stdout
    job_ids = train_jobs(result.stdout)
    records = [json.loads(line) for line in (train_dir / "jobs.jsonl").read_text().splitlines()]
    # A start line and an end line per job: every job but the last preempted (exit 75: a slow machine
    # may see the resubmission signalled too, and resubmitted again), the last finished.
    assert [(r["attempt"], r["slurm_job"]) for r in records] == [(n // 2 + 1, job_ids[n // 2]) for n in range(len(records))]
    codes = [r["code"] for r in records[1::2]]
    assert len(codes) >= 2 and codes[-1] == 0 and set(codes[:-1]) == {75}, records
    assert all(r["code"] is None for r in records[0::2]), records

    # The first job's own log, kept (Snakemake deletes logs/train.log before the next attempt).
    log = (workdir / records[1]["log"]).read_text()
    saved = re.findall(r"SIGTERM: every rank saved step (\d+)", log)
    assert saved, log[-4000:]
    step = int(saved[0])
    assert 1 <= step <= HOLD_STEP, log[-4000:]  # held there until the signal: never went past it
    assert re.findall(r"every rank saved step (\d+)", log) == [str(step)] * 2, log[-4000:]  # both ranks, one step
    assert "the ranks exited with code 75 (PREEMPTED)" in log
    # FAILED: it ended itself (exit 75) on the profile's warning signal, before the limit. Under load
    # slurmctld has been seen to send no warning and only the time limit's own SIGTERM (state TIMEOUT,
    # then SIGKILL after KillWait): the ranks save on that one just the same, as asserted above.
    first, *_, last = sorted(slurm_cluster.wait_done(job_ids), key=lambda row: int(row["JobID"]))
    assert first["State"] in ("FAILED", "TIMEOUT"), first
    assert last["State"] == "COMPLETED", last
    assert (train_dir / "checkpoints" / f"step-{step:07d}" / "complete.json").is_file()

    final_log = (workdir / "results" / "tiny" / "logs" / "train.log").read_text()  # the last job's
    before = int(re.findall(r"every rank saved step (\d+)", (workdir / records[-3]["log"]).read_text())[0])
    assert final_log.count(f"resumed from step {before} ") == 2, final_log[-4000:]
    rows = [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == MAX_STEPS
