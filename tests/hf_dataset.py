"""A dataset repository folder laid out as the Hub serves one, made offline: a README.md card whose
`configs` name the split's data files, and several parquet data files under data/. `datasets` reads
the folder through the same code as a Hub dataset (load_dataset_builder, then the parquet builder's
stream), so the hf source kind's Hub paths run on it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
---
# A test corpus
"""


def write_dataset_folder(folder: Path, files: list[list[dict]], row_group_rows: int = 4) -> Path:
    """folder/README.md and folder/data/train-NNNNN-of-MMMMM.parquet, one file per list of rows
    (each row's keys are its columns), in order; small row groups, as large Hub files have many."""
    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(CARD)
    for index, rows in enumerate(files):
        name = f"train-{index:05d}-of-{len(files):05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / name, row_group_size=row_group_rows)
    return folder
