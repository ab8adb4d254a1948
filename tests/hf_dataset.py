"""A dataset repository folder laid out as the Hub serves one, made offline: a README.md card whose
`configs` name the split's data files, and several parquet data files under data/. `datasets` reads
the folder through the same code as a Hub dataset (load_dataset_builder, then the parquet builder's
stream), so the hf source kind's Hub paths run on it. `tiny_with_hf` is the tiny run downloading one
(tests/dag, tests/slurm)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from tiny import ROOT, TINY, VENV_BIN

CARD = """---
configs:
- config_name: {config}
  data_files:
  - split: train
    path: data/train-*.parquet
---
# A test corpus
"""


def write_dataset_folder(
    folder: Path, files: list[list[dict]], row_group_rows: int = 4, config: str = "default"
) -> Path:
    """folder/README.md (its one configuration named `config`) and folder/data/train-NNNNN-of-MMMMM.parquet,
    one file per list of rows (each row's keys are its columns), in order; small row groups, as large
    Hub files have many."""
    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(CARD.format(config=config))
    for index, rows in enumerate(files):
        name = f"train-{index:05d}-of-{len(files):05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / name, row_group_size=row_group_rows)
    return folder


HF_FILES = 4  # data files of tiny_with_hf's dataset
HF_ROWS = 30  # rows a file


def _functions(file: int) -> list[dict]:
    return [
        {"text": f"def f_{file}_{row}(x):\n    return x * {row} + {file}\n" * (1 + row % 4)} for row in range(HF_ROWS)
    ]


def tiny_with_hf(tmp_path: Path) -> Path:
    """A config file: the tiny run downloading a slice of the standard library, then an hf source (a
    dataset folder of HF_FILES data files, sampled), one data file a download_part job."""
    dataset = write_dataset_folder(tmp_path / "dataset", [_functions(file) for file in range(HF_FILES)])
    cfg = yaml.safe_load(TINY.read_text())
    hf = {"name": "code", "kind": "hf", "dataset": str(dataset), "quality": "code", "sample": 0.8}
    stdlib = {"name": "stdlib", "kind": "stdlib", "include": ["json/*.py"]}
    cfg["download"] |= {"sources": [stdlib, hf], "scatter_mb": 0.000001}
    path = tmp_path / "tiny-hf.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def one_job_download(config: Path, workdir: Path, out: Path) -> None:
    """The download script as one job (no --plan): every source read and checked in it."""
    argv = [f"{VENV_BIN}/python", str(ROOT / "workflow" / "scripts" / "download.py"), "--config", str(config)]
    result = subprocess.run([*argv, "--out", str(out)], cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def same_files(mine: Path, gathered: Path) -> list[Path]:
    """The files of a one-job download folder, checked byte for byte against a gathered one's."""
    names = sorted(p.relative_to(mine) for p in mine.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(gathered) for p in gathered.rglob("[!.]*") if p.is_file())  # not Snakemake's
    for name in names:
        assert (mine / name).read_bytes() == (gathered / name).read_bytes(), name
    return names
