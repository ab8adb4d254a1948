"""The shipped CPU learning-rate sweep (config/experiments/stdlib-lr-sweep.yaml) over the tiny run,
through profiles/slurm on the two-node test cluster (tests/slurm/cluster.py), as a user runs it:

    snakemake --profile profiles/slurm --configfile tests/configs/tiny.yaml \\
        config/experiments/stdlib-lr-sweep.yaml --config 'train={budget: null}'

(`budget: null` drops the sweep's 2-minute budget, so each arm keeps tiny's 200 steps.) What a user
of a sweep on a cluster relies on, and what is checked: the three arms share one copy of the data,
built once; every arm's smoke, train and eval is its own Slurm job (three of each, one per arm, with
distinct job ids), so the arms run side by side on the cluster; every job COMPLETED per sacct; each
arm has its own results/<arm>/ with a trained model; and the overlay report results/stdlib-lr-sweep/
sweep.md names all three arms and marks one **best** (the one with the lowest held-out loss).

Why it is shaped this way (measured on 2 cores, the wall time of the Snakemake runs):
- The data stages run here first (`--cores 2 --until shard`, ~7 s) and the sweep on Slurm then finds
  them built and submits none. On Slurm, four chained sub-second jobs cost ~56 s of scheduling and
  status polling, and what the test is about is the arms, not the data stages (test_pipeline_on_slurm
  runs those as Slurm jobs). That the data is built once for three arms shows as well this way: one
  job per data stage in the local run, one folder per stage under results/data/, no data job on Slurm.
- `--set-threads smoke=1 train=1 eval=1`: the cluster's nodes declare 32 CPUs each but share this
  machine's 2 cores, and the three arms' jobs run at once; at Snakemake's 2 threads each, three jobs'
  OpenMP pools (six threads) contend for 2 cores and the Slurm part took ~350 s (train 80-130 s and
  40-53 CPU seconds per arm), at one thread each ~185 s (train ~25 s and 9 CPU seconds). Threads
  change no path, no job and no Slurm request (the profile's CPUs per task stay as they are).
- No lm-eval tasks in the arms' evals (`eval={lm_eval: {tasks: []}}`): their set-up was most of
  each eval (~50 s for the three side by side) and the harness is tested elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
SWEEP_FILE = ROOT / "config" / "experiments" / "stdlib-lr-sweep.yaml"
VENV_BIN = str(Path(sys.executable).parent)
SWEEP = "stdlib-lr-sweep"
ARMS = [f"{SWEEP}-lr-0.002", f"{SWEEP}-lr-0.008", f"{SWEEP}-lr-0.02"]
DATA_STAGES = ("download", "tokenizer", "pretokenize", "shard")
DATA_FOLDERS = ("raw", "tokenizer", "tokens", "shards")  # kiln.layout: results/data/<folder>-<key>
ARM_STAGES = ("smoke", "train", "eval", "report")
ONE_THREAD = ("--set-threads", "smoke=1", "train=1", "eval=1")
NO_LM_EVAL = "eval={lm_eval: {tasks: []}}"  # lm-eval's set-up is most of a tiny eval; this is about the sweep

pytestmark = pytest.mark.slurm


def snakemake_argv(workdir: Path, *args: str, slurm: bool) -> list[str]:
    argv = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    if slurm:
        # the plugin's first status check waits 40 s by default; the cluster answers at once
        argv += ["--profile", str(ROOT / "profiles" / "slurm"), "--slurm-init-seconds-before-status-checks", "2"]
    else:
        argv += ["--cores", "2"]
    return [*argv, "--configfile", str(TINY), str(SWEEP_FILE), "--config", "train={budget: null}", NO_LM_EVAL, *args]


def run(cluster, argv: list[str], log: Path) -> subprocess.CompletedProcess:
    env = cluster.env(dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"]))
    env.pop("KILN_FAULT", None)
    with log.open("w") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    result.stdout = log.read_text()
    return result


def submitted(output: str) -> dict[str, dict[str, str]]:
    """rule -> {the job's wildcards folder (the arm's run name; "" for none): Slurm job id}, from
    Snakemake's log lines `... SLURM jobid 12 (log: .../slurm_logs/rule_train/<run>/12.log)`.
    A rule submitted twice for one arm fails the test here."""
    jobs: dict[str, dict[str, str]] = {}
    pattern = r"SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/(?:([^/\s]+)/)?\d+\.log\)"
    for jobid, rule, wildcards in re.findall(pattern, output):
        arms = jobs.setdefault(rule, {})
        assert wildcards not in arms, f"{rule} for {wildcards!r} submitted twice: {arms[wildcards]}, {jobid}"
        arms[wildcards] = jobid
    return jobs


def ran_locally(output: str) -> dict[str, int]:
    """rule -> how many jobs of it a local Snakemake run finished (`Finished jobid: 4 (Rule: shard)`)."""
    counts: dict[str, int] = {}
    for rule in re.findall(r"^Finished jobid: \d+ \(Rule: (\w+)\)$", output, flags=re.M):
        counts[rule] = counts.get(rule, 0) + 1
    return counts


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory):
    """The data stages here, then the whole sweep on Slurm; the Slurm jobs by rule and arm, and
    their sacct rows once all have ended."""
    workdir = tmp_path_factory.mktemp("sweep")
    local = run(slurm_cluster, snakemake_argv(workdir, "--until", "shard", slurm=False), workdir / "local.log")
    assert local.returncode == 0, local.stdout[-3000:]
    result = run(slurm_cluster, snakemake_argv(workdir, *ONE_THREAD, slurm=True), workdir / "snakemake.log")
    assert result.returncode == 0, result.stdout[-5000:]
    jobs = submitted(result.stdout)
    rows = {row["JobID"]: row for row in slurm_cluster.wait_done([j for arms in jobs.values() for j in arms.values()])}
    return workdir, ran_locally(local.stdout), jobs, rows


def test_the_data_stages_ran_once_for_all_three_arms(sweep):
    workdir, local, jobs, _ = sweep
    assert {stage: local.get(stage) for stage in DATA_STAGES} == dict.fromkeys(DATA_STAGES, 1), local
    assert not set(jobs) & set(DATA_STAGES), jobs  # found built: no data job on Slurm
    data = workdir / "results" / "data"
    folders = sorted(p.name.rsplit("-", 1)[0] for p in data.iterdir() if p.name not in ("logs", "benchmarks"))
    assert folders == sorted(DATA_FOLDERS), sorted(p.name for p in data.iterdir())  # one shared copy
    for arm in ARMS:  # no arm kept data stages of its own
        assert not {"raw", "tokenizer", "tokens", "shards"} & {p.name for p in (workdir / "results" / arm).iterdir()}


def test_each_arm_ran_its_own_smoke_train_and_eval_jobs(sweep):
    workdir, _, jobs, _ = sweep
    assert set(jobs) == {*ARM_STAGES, "sweep_report"}, jobs
    for stage in ARM_STAGES:
        assert sorted(jobs[stage]) == sorted(ARMS), (stage, jobs[stage])
    assert list(jobs["sweep_report"]) == [""]
    ids = [jobid for arms in jobs.values() for jobid in arms.values()]
    assert len(ids) == len(set(ids)) == 4 * len(ARMS) + 1, jobs  # every job its own
    for arm in ARMS:
        summary = json.loads((workdir / "results" / arm / "train" / "summary.json").read_text())
        assert summary["val_losses"][-1][0] == 200, (arm, summary["val_losses"])  # tiny's max_steps
        assert (workdir / "results" / arm / "train" / "model.safetensors").is_file()
        assert (workdir / "results" / arm / "eval" / "metrics.json").is_file()
        assert (workdir / "results" / arm / "report.md").is_file()


def test_every_job_completed(sweep):
    _, _, jobs, rows = sweep
    states = {(rule, arm): rows[jobid]["State"] for rule, arms in jobs.items() for arm, jobid in arms.items()}
    assert set(states.values()) == {"COMPLETED"}, states


def test_the_overlay_report_names_every_arm_and_marks_the_best(sweep):
    workdir, _, _, _ = sweep
    report = (workdir / "results" / SWEEP / "sweep.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith(f"| {SWEEP}-")]
    assert sorted(row.split("|")[1].replace("**best**", "").strip() for row in rows) == sorted(ARMS), report
    [best_row] = [row for row in rows if "**best**" in row]
    best = best_row.split("|")[1].replace("**best**", "").strip()
    # the best is the arm with the lowest held-out loss, as sweep.json and the report's summary say
    table = json.loads((workdir / "results" / SWEEP / "sweep.json").read_text())
    losses = {arm["run"]: arm["val_loss"] for arm in table["arms"]}
    assert sorted(losses) == sorted(ARMS) and len(set(losses.values())) == len(ARMS)  # three trajectories
    assert best == table["best"] == min(losses, key=losses.get)
    assert f"**{best}**" in report.split("|", 1)[0]
    assert (workdir / "results" / SWEEP / "sweep.png").is_file()
