"""The tiny pipeline through profiles/slurm and the real snakemake-executor-plugin-slurm, on the
two-node cluster of tests/slurm/cluster.py (n1, n2, eight schedulable "GPUs" each).

One run of the whole DAG with two ranks per node, then train again on two nodes (one rank each),
cancelled with scancel after its first checkpoint and rerun through Snakemake. What is checked is
what a user on a cluster relies on: every rule ran as a Slurm job, GPU stages got the GPUs and nodes
the run's train section asks for and data stages none, the shards are byte-identical to a local
run's, a two-node train gives the loss curve of two ranks on one node, and a cancelled train resumes
from its checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import tiny_layout

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
VENV_BIN = str(Path(sys.executable).parent)
STAGES = {"download", "tokenizer", "pretokenize", "shard", "smoke", "train", "eval", "report"}
# One CPU thread per rank in both layouts (threads per rank = the job's threads / nproc_per_node):
# fp32 sums run in another order with another thread count, and the curves are compared.
ONE_NODE_TWO_RANKS = ("--config", "train={nproc_per_node: 2, micro_batch: 8}", "--set-threads", "smoke=2", "train=2")
TWO_NODES_ONE_RANK = ("--config", "train={nnodes: 2, micro_batch: 8}", "--set-threads", "smoke=1", "train=1")
HOLD_STEP = 150  # after the first checkpoint (100), before the last step (200); a log step

pytestmark = pytest.mark.slurm


def snakemake_argv(workdir: Path, *args: str, slurm: bool = True) -> list[str]:
    argv = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    if slurm:
        # the plugin's first status check waits 40 s by default; the cluster answers at once
        argv += ["--profile", str(ROOT / "profiles" / "slurm"), "--slurm-init-seconds-before-status-checks", "2"]
    else:
        argv += ["--cores", "2"]
    return [*argv, *args, "--configfile", str(TINY)]


def run(cluster, argv: list[str], log: Path) -> subprocess.CompletedProcess:
    env = cluster.env(dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"]))
    with log.open("w") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    result.stdout = log.read_text()
    return result


def submitted(output: str) -> dict[str, list[str]]:
    """rule -> the Slurm job ids Snakemake submitted for it, from its log lines."""
    jobs: dict[str, list[str]] = {}
    for jobid, rule in re.findall(r"SLURM jobid (\d+) \(log: \S*/rule_(\w+)/", output):
        jobs.setdefault(rule, []).append(jobid)
    return jobs


def tres(row: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in row["AllocTRES"].split(",") if "=" in item)


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def pipeline(slurm_cluster, tmp_path_factory):
    """The whole tiny DAG on Slurm (two ranks on one node), and the shards of a local run."""
    local = tmp_path_factory.mktemp("local")
    result = run(slurm_cluster, snakemake_argv(local, "--until", "shard", slurm=False), local / "snakemake.log")
    assert result.returncode == 0, result.stdout[-3000:]
    workdir = tmp_path_factory.mktemp("on-slurm")
    result = run(slurm_cluster, snakemake_argv(workdir, *ONE_NODE_TWO_RANKS), workdir / "snakemake.log")
    assert result.returncode == 0, result.stdout[-5000:]
    jobs = submitted(result.stdout)
    rows = {row["JobID"]: row for row in slurm_cluster.wait_done([j for ids in jobs.values() for j in ids])}
    return workdir, local, jobs, rows


def test_every_rule_ran_as_a_slurm_job(pipeline):
    workdir, _, jobs, rows = pipeline
    assert set(jobs) == STAGES and all(len(ids) == 1 for ids in jobs.values())
    assert {rule: rows[ids[0]]["State"] for rule, ids in jobs.items()} == dict.fromkeys(STAGES, "COMPLETED")
    assert (workdir / "results" / "tiny" / "report.md").is_file()


def test_gpu_stages_hold_the_gpus_and_nodes_of_the_train_section_and_data_stages_none(pipeline):
    _, _, jobs, rows = pipeline
    held = {rule: tres(rows[ids[0]]) for rule, ids in jobs.items()}
    for rule in ("smoke", "train"):  # nproc_per_node 2 on nnodes 1
        assert held[rule]["gres/gpu"] == "2" and held[rule]["node"] == "1", (rule, held[rule])
    assert held["eval"]["gres/gpu"] == "1" and held["eval"]["node"] == "1"  # one process
    for rule in ("download", "tokenizer", "pretokenize", "shard", "report"):
        assert "gres/gpu" not in held[rule], (rule, held[rule])


def test_shards_are_byte_identical_to_a_local_runs(pipeline):
    workdir, local, _, _ = pipeline
    on_slurm, here = tiny_layout(workdir).folder("shard"), tiny_layout(local).folder("shard")
    names = sorted(p.name for p in here.iterdir())
    assert names == sorted(p.name for p in on_slurm.iterdir()) and "manifest.json" in names
    for name in names:
        assert (on_slurm / name).read_bytes() == (here / name).read_bytes(), name


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster, pipeline, tmp_path_factory):
    """Train on two nodes from the pipeline's data stages; scancel it once its first checkpoint is
    on disk, then rerun the same command, as a user would. The first job holds at HOLD_STEP until
    scancel's SIGTERM reaches its ranks (KILN_FAULT hold): however fast this machine trains, it is
    still running when scancel comes, rather than done with its last 100 steps."""
    source, _, _, _ = pipeline
    workdir = tmp_path_factory.mktemp("two-nodes")
    keep = shutil.ignore_patterns("smoke", "train", "eval", "report.md", "loss.png")
    shutil.copytree(source / "results", workdir / "results", ignore=keep)  # copy2: mtimes kept, no rerun
    argv = snakemake_argv(workdir, "results/tiny/train/summary.json", *TWO_NODES_ONE_RANK)
    env = slurm_cluster.env(dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"]))
    first_log = workdir / "first.log"
    with first_log.open("w") as out:
        first = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True,
                                 env=dict(env, KILN_FAULT=f"hold@{HOLD_STEP}"))
        latest = workdir / "results" / "tiny" / "train" / "checkpoints" / "LATEST"
        deadline = time.monotonic() + 600
        while not latest.exists():
            assert first.poll() is None, first_log.read_text()[-5000:]
            assert time.monotonic() < deadline, "no checkpoint after 600 s"
            time.sleep(0.2)
        cancelled = submitted(first_log.read_text())["train"][0]
        slurm_cluster.run(["scancel", cancelled])
        slurm_cluster.wait_done([cancelled])
        # snakemake-executor-plugin-slurm 2.8.0 waits for the exact state CANCELLED, and sacct says
        # "CANCELLED by <uid>", so Snakemake never learns the job ended (README, "When a run dies"):
        # stop it as a user would, unlock the folder, and rerun.
        try:
            first.wait(timeout=20)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
    unlock = run(slurm_cluster, [*argv, "--unlock"], workdir / "unlock.log")
    assert unlock.returncode == 0, unlock.stdout[-3000:]
    second = run(slurm_cluster, argv, workdir / "second.log")
    assert second.returncode == 0, second.stdout[-5000:]
    resumed = submitted(second.stdout)["train"][0]
    rows = {row["JobID"]: row for row in slurm_cluster.wait_done([cancelled, resumed])}
    return workdir, rows[cancelled], rows[resumed]


def test_two_node_train_holds_both_nodes_with_their_gpus(two_nodes):
    _, _, resumed = two_nodes
    assert resumed["State"] == "COMPLETED" and resumed["NNodes"] == "2" and resumed["NodeList"] == "n[1-2]"
    assert tres(resumed)["node"] == "2" and tres(resumed)["gres/gpu"] == "2"  # 1 per node x 2 nodes


def test_cancelled_train_resumes_from_its_checkpoint(two_nodes):
    workdir, cancelled, _ = two_nodes
    assert cancelled["State"].startswith("CANCELLED")
    log = (workdir / "results" / "tiny" / "logs" / "train.log").read_text()
    assert re.search(r"resumed from step (\d+)", log) and "--rdzv_backend=c10d" in log
    steps = [json.loads(line)["step"] for line in (workdir / "results" / "tiny" / "train" / "metrics.jsonl")
             .read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 200  # no step lost or logged twice


def test_two_nodes_give_the_loss_curve_of_two_ranks_on_one_node(pipeline, two_nodes):
    one_node = losses(pipeline[0] / "results" / "tiny")
    run_dir = two_nodes[0] / "results" / "tiny"
    two_node = losses(run_dir)
    # The cancelled job saved where scancel's SIGTERM found it and logged that step too. A log line's
    # loss is the mean over the steps since the previous line, so the first line after the resume
    # averages fewer steps: every other line must be the same number.
    resumed = int(re.search(r"resumed from step (\d+)", (run_dir / "logs" / "train.log").read_text())[1])
    straddling = min(step for step in one_node if step > resumed)
    compared = [step for step in one_node if step != straddling]
    assert set(one_node) <= set(two_node) and len(compared) == len(one_node) - 1
    assert [two_node[step] for step in compared] == [one_node[step] for step in compared]
