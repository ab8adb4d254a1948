"""An hf source through the workflow as a user runs it: a dataset repository folder laid out as the Hub
serves one (tests/hf_dataset.py), read through `datasets` offline, downloaded by Snakemake as a plan,
one download_part job per share of its parquet data files and a gather, whose folder is byte for byte
what the download script writes as one job."""

from __future__ import annotations

from pathlib import Path

from hf_dataset import HF_FILES, HF_ROWS, one_job_download, same_files, tiny_with_hf
from tiny import snakemake, tiny_layout

from kiln.layout import ScatterPlan


def test_an_hf_source_downloads_as_one_part_job_per_data_file(tmp_path):
    config, workdir = tiny_with_hf(tmp_path), tmp_path / "work"
    result = snakemake(workdir, "--configfile", str(config), "--until", "download")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paths = tiny_layout(workdir, config)
    plan = ScatterPlan.load(Path(paths.scatter_plan("download")))
    hf_stamps = [stamp for stamp in plan.stamps if stamp["source"] == "code"]
    assert [stamp["first_row"] for stamp in hf_stamps] == [file * HF_ROWS for file in range(HF_FILES)]
    assert all(Path(paths.log("download", "download_part", part=i)).is_file() for i in range(plan.parts))
    one_job_download(config, workdir, tmp_path / "raw")
    names = same_files(tmp_path / "raw", paths.folder("download"))
    assert any(name.parts[0] == "code" for name in names)
