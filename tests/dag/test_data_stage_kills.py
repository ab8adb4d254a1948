"""A data stage SIGKILLed in the middle of writing its output, through Snakemake on the tiny config
(issue 11, item 11): the killed run publishes nothing of that stage, and the rerun regenerates it and
every stage after it, byte for byte what a clean run writes, with no temporary or staging file left.

The kill is the stage's own process SIGKILLing itself at a named point (KILN_DATA_FAULT,
kiln.data.faults): a download_part job with its verdicts written and no part.json, a download
(gather) with complete parts staged and the next one half published, a pretokenize_part job with its part's train.bin written and no part.json, a pretokenize (gather) job
with part of train.bin written, a shard stage with some shards written and no manifest.
No process of the killed stage outlives it (pretokenize's pool workers exit with their parent).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import tiny
from tiny import TINY, tiny_layout

# the jobs that write a folder, in DAG order (download_part, pretokenize_part: the scattered stages' part jobs)
KILLED = ("download_part", "download", "pretokenize_part", "pretokenize", "shard")
DATA = ("download", "tokenizer", "pretokenize", "shard")


def snakemake(workdir: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The tiny run's data stages, with KILN_DATA_FAULT set to `fault` (or unset)."""
    return tiny.snakemake(workdir, "--configfile", str(TINY), "--until", "shard", *args, env={"KILN_DATA_FAULT": fault})


def files(workdir: Path) -> dict[str, str]:
    """sha256 of every file, hidden ones included, under the tiny run's data stages' folders."""
    paths = tiny_layout(workdir)
    return {
        str(p.relative_to(paths.data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for stage in DATA
        for p in sorted(paths.folder(stage).rglob("*"))
        if p.is_file()
    }


def processes_in(workdir: Path) -> list[str]:
    """Command lines of the processes working in `workdir` (a killed stage's orphaned workers)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(workdir):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def settled(workdir: Path, wait_s: float = 30.0) -> list[str]:
    """processes_in(workdir) once it is empty, or after wait_s (a pool worker notices within a second
    that its parent is gone)."""
    deadline = time.monotonic() + wait_s
    while (left := processes_in(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def leftovers(run: Path) -> list[str]:
    """Temporary or staging entries anywhere under `run` (results/data: the data stages' folders)."""
    return sorted(str(p.relative_to(run)) for p in run.rglob(".*") if ".tmp-" in p.name or p.name.endswith(".partial"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("clean")
    result = snakemake(workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paths = tiny_layout(workdir)
    assert len(list((paths.folder("download") / "stdlib").glob("part-*.parquet"))) >= 2  # so download@2 is mid-output
    assert len(list(paths.folder("shard").glob("train-*.bin"))) >= 2  # so shard@1 is mid-output
    return workdir


@pytest.mark.parametrize(
    "stage, n", [("download_part", 1), ("download", 2), ("pretokenize_part", 1), ("pretokenize", 1), ("shard", 1)]
)
def test_a_data_stage_killed_mid_output_is_regenerated_byte_for_byte(clean, tmp_path, stage, n):
    workdir = tmp_path / "work"
    if stage in ("download_part", "download"):
        workdir.mkdir()
        force: tuple[str, ...] = ()
    elif stage == "pretokenize_part":  # the clean run's download and tokenizer; pretokenize yet to run
        shutil.copytree(clean, workdir, symlinks=True)
        shutil.rmtree(tiny_layout(workdir).folder("pretokenize"))
        force = ()
    else:  # the clean run's upstream stages, up to date, and this stage forced to run again
        shutil.copytree(clean, workdir, symlinks=True)
        force = ("--forcerun", stage)
    paths = tiny_layout(workdir)
    run = paths.data_dir

    killed = snakemake(workdir, *force, fault=f"{stage}@{n}")
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert f"Error in rule {stage}" in killed.stdout + killed.stderr
    assert not paths.folder(stage.removesuffix("_part")).exists(), "the killed stage published its output"
    if stage.endswith("_part"):  # nor a part folder the gather would take
        scattered = stage.removesuffix("_part")
        assert not [p for p in Path(paths.part(scattered, 0)).parent.glob("part-*") if (p / "part.json").exists()]
    assert settled(workdir) == [], "the killed stage left processes running (pretokenize's pool workers)"
    if stage == "download":  # the complete parts stay staged for the rerun to resume from
        staged = paths.folder("download").with_name(f".{paths.folder('download').name}.partial")
        assert list((staged / "stdlib").glob("part-00000.parquet"))

    rerun = snakemake(workdir)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    for later in KILLED[KILLED.index(stage) :]:  # the stage and every one after it ran again
        assert re.search(rf"^(local)?(rule|checkpoint) {later}:", rerun.stderr + rerun.stdout, flags=re.M), (
            rerun.stderr[-3000:]
        )
    assert files(workdir) == files(clean)
    assert leftovers(run) == []


@pytest.mark.parametrize("spec", ["train@1", "shard", "shard@0", "shard@x"])
def test_a_malformed_data_fault_names_the_variable(monkeypatch, spec):
    from kiln.data import faults
    from kiln.errors import KilnError

    monkeypatch.setenv(faults.ENV, spec)
    with pytest.raises(
        KilnError,
        match=rf"KILN_DATA_FAULT: '{spec}' is not stage@n with stage one of download, "
        r"download_part, pretokenize_part, pretokenize, shard and n >= 1",
    ):
        faults.planned()
