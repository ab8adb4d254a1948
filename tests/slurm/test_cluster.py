"""The test cluster is what the Slurm pipeline tests rely on: two nodes that one job spans, GPUs per
node on partition gpu, none on partition cpu, and sacct records of finished jobs."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.slurm


def srun(cluster, *args: str, timeout: float = 60) -> tuple[str, str]:
    """Run srun with these arguments; return (job id, stdout)."""
    proc = subprocess.run(
        ["srun", "--verbose", *args], env=cluster.env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"jobid (\d+)", proc.stderr)  # "srun: jobid 12: nodes(2):`n[1-2]', ..."
    assert job_id, proc.stderr
    return job_id.group(1), proc.stdout


def test_one_task_on_each_of_two_nodes(slurm_cluster):
    _, out = srun(
        slurm_cluster,
        "-N2",
        "--ntasks-per-node=1",
        "bash",
        "-c",
        "echo $SLURM_NODEID $SLURMD_NODENAME $SLURM_JOB_NODELIST",
    )
    lines = sorted(out.split("\n")[:-1])
    assert lines == ["0 n1 n[1-2]", "1 n2 n[1-2]"]


def test_gpus_per_node_on_partition_gpu(slurm_cluster):
    job_id, out = srun(
        slurm_cluster, "-p", "gpu", "-N1", "--gpus-per-node=4", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES"
    )
    assert out.strip().split(",") == ["0", "1", "2", "3"]
    [row] = slurm_cluster.wait_done([job_id])
    assert "gres/gpu=4" in row["AllocTRES"].split(","), row


def test_partition_cpu_has_no_gpus(slurm_cluster):
    job_id, out = srun(slurm_cluster, "-p", "cpu", "bash", "-c", "echo ${CUDA_VISIBLE_DEVICES-unset}")
    assert out.strip() == "unset"
    [row] = slurm_cluster.wait_done([job_id])
    assert "gres/gpu" not in row["AllocTRES"], row


def test_sacct_lists_finished_batch_jobs(slurm_cluster, tmp_path):
    job_ids = []
    for script in ["true", "exit 3"]:
        proc = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--wait",
                "-N2",
                "--ntasks-per-node=1",
                "-o",
                str(tmp_path / "%j.out"),
                "-J",
                "kiln-sacct",
                "--wrap",
                script,
            ],
            env=slurm_cluster.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        job_ids.append(proc.stdout.strip().split(";")[0])
    rows = {r["JobID"]: r for r in slurm_cluster.wait_done(job_ids)}
    ok, failed = rows[job_ids[0]], rows[job_ids[1]]
    assert ok["State"] == "COMPLETED" and ok["ExitCode"] == "0:0" and ok["JobName"] == "kiln-sacct"
    assert ok["NNodes"] == "2" and ok["NodeList"] == "n[1-2]"
    assert failed["State"] == "FAILED" and failed["ExitCode"] == "3:0"
    # since= finds them too, without naming them (the time-window query lags -j by up to ~1 s)
    deadline = time.monotonic() + 10
    while not set(job_ids) <= {r["JobID"] for r in slurm_cluster.sacct(since="now-1hour")}:
        assert time.monotonic() < deadline, f"{job_ids} not in sacct --starttime=now-1hour"
        time.sleep(0.5)
