"""An hf source's download as several download_part jobs on the two-node cluster (profiles/slurm), as
a user runs it: the tiny run's download with a dataset repository folder laid out as the Hub serves
one (tests/hf_dataset.py), cut one data file a part job. Every job of the stage is a one-CPU Slurm
job that COMPLETED, and the gathered folder is what the download script writes as one job."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_dataset import HF_FILES, one_job_download, same_files, tiny_with_hf
from tiny import tiny_layout

from kiln.layout import ScatterPlan

from .test_pipeline_on_slurm import run, snakemake_argv, submitted, tres

pytestmark = pytest.mark.slurm


def test_an_hf_source_downloads_as_part_jobs_on_slurm(slurm_cluster, tmp_path):
    config, workdir = tiny_with_hf(tmp_path), tmp_path / "on-slurm"
    argv = snakemake_argv(workdir, "--until", "download", configfile=config)
    result = run(slurm_cluster, argv, tmp_path / "snakemake.log")
    assert result.returncode == 0, result.stdout[-5000:]
    jobs = submitted(result.stdout)
    rows = {row["JobID"]: row for row in slurm_cluster.wait_done([j for ids in jobs.values() for j in ids])}
    plan = ScatterPlan.load(Path(tiny_layout(workdir, config).scatter_plan("download")))
    assert sum(stamp["source"] == "code" for stamp in plan.stamps) == HF_FILES
    assert set(jobs) == {"download_plan", "download_part", "download"}
    assert len(jobs["download_part"]) == plan.parts > HF_FILES
    assert {rows[jobid]["State"] for ids in jobs.values() for jobid in ids} == {"COMPLETED"}
    assert {tres(rows[jobid])["cpu"] for jobid in jobs["download_part"]} == {"1"}
    one_job_download(config, workdir, tmp_path / "raw")
    names = same_files(tmp_path / "raw", tiny_layout(workdir, config).folder("download"))
    assert any(name.parts[0] == "code" for name in names)
