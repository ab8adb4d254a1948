"""Each shipped seed config's download, as a user would run it against a copy of its corpus: every hf
source pointed at a dataset repository folder of the same shape (tests/hf_dataset.py: the seed's
configuration name, parquet data files with its text column, read through `datasets` offline), its
budget scaled down to the folder, sample and all. Snakemake runs download_part jobs for every source,
and the budgets hold."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from hf_dataset import write_dataset_folder
from tiny import ROOT, snakemake, tiny_layout

from kiln.layout import ScatterPlan

SEEDS = ["swallow-code-llama-1b.yaml", "fineweb-edu-gpt2-124m.yaml", "fineweb-wiki-arxiv-gpt2-164m-3080ti.yaml"]
FILES, ROWS = 4, 25
WORDS = "the of and to that with river town market school letter story winter valley light voice table".split()


def corpus(source: dict, code: bool) -> list[list[dict]]:
    """FILES data files of ROWS documents, each over any min_doc_bytes the seeds set, in the source's column."""
    files = []
    for file in range(FILES):
        draw = random.Random(f"{source['name']}-{file}")
        rows = []
        for row in range(ROWS):
            if code:
                text = "".join(f"def f_{file}_{row}_{i}(x):\n    return x * {i}\n\n" for i in range(3 + row % 5))
            else:
                text = " ".join(draw.choice(WORDS) for _ in range(80 + draw.randrange(80))) + "."
            rows.append({source.get("text_column", "text"): text, "id": f"{file}-{row}"})
        files.append(rows)
    return files


def local_copy(seed: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """The seed config with its hf sources on local folders and budgets a third of each folder's text."""
    cfg = yaml.safe_load((ROOT / "config" / "experiments" / seed).read_text())
    for source in cfg["download"]["sources"]:
        files = corpus(source, code="code" in source["name"])
        folder = write_dataset_folder(tmp_path / source["name"], files, config=source.get("config", "default"))
        source["dataset"] = str(folder)
        text = sum(len(row[source.get("text_column", "text")]) for rows in files for row in rows)
        source["max_bytes"] = text // 3
    cfg["download"]["scatter_mb"] = 0.000001  # one data file a share
    path = tmp_path / seed
    path.write_text(yaml.safe_dump(cfg))
    return path, [source["name"] for source in cfg["download"]["sources"]]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeds_download_runs_part_jobs_for_its_hf_sources(seed, tmp_path):
    config, names = local_copy(seed, tmp_path)
    workdir = tmp_path / "work"
    result = snakemake(workdir, "--configfile", str(config), "--until", "download")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paths = tiny_layout(workdir, config)
    plan = ScatterPlan.load(Path(paths.scatter_plan("download")))
    assert {stamp["source"] for stamp in plan.stamps} == set(names)
    assert all(Path(paths.log("download", "download_part", part=i)).is_file() for i in range(plan.parts))
    manifest = json.loads((paths.folder("download") / "manifest.json").read_text())
    for source in yaml.safe_load(config.read_text())["download"]["sources"]:
        assert 0 < manifest["sources"][source["name"]]["bytes"] <= source["max_bytes"]
