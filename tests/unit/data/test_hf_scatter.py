"""An hf source scattered by data file: the plan lists the dataset's parquet data files (a dataset
repository folder laid out as the Hub serves one, read through `datasets` offline) and cuts them into
shares, each download_part job reads its range of files with the ids one job gives them, and the
gather writes the bytes one job writes, with and without a sample, with a budget whose estimate holds
or falls short. A stream that cannot be cut (one
data file, a json builder) stays one job, and the plan says why."""

from __future__ import annotations

import json
import logging
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import download_cfg, write_jsonl
from hf_dataset import write_dataset_folder
from test_download_scatter import files_of, scatter
from test_raw import flaky_serving, row_text

from kiln.data.raw import write_raw
from kiln.data.raw_scatter import download_plan

WORDS = (
    "the of and to that have with be river mill town people square season weather market bridge road "
    "morning evening harbour boat field garden school letter window story music teacher farmer baker "
    "painter winter summer autumn spring valley forest hill lake stone light shadow voice table"
).split()


def rows(file: int, count: int) -> list[dict]:
    """Prose documents of 60 to 120 words, each its own draw of words (no two near duplicates)."""
    out = []
    for row in range(count):
        draw = random.Random(f"{file}-{row}")
        words = " ".join(draw.choice(WORDS) for _ in range(60 + draw.randrange(60)))
        out.append({"text": f"Document {file}-{row}: {words}.", "url": f"https://example.org/{file}/{row}"})
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Six data files of 5 to 10 rows; an exact copy and a near copy of a row of file 0 in files 2 and 4."""
    files = [rows(file, 5 + file) for file in range(6)]
    files[2][1] = dict(files[0][3])  # an exact duplicate two shares later
    files[4][2] = {**files[0][4], "text": files[0][4]["text"].replace("river", "stream", 1)}  # a near duplicate
    return write_dataset_folder(tmp_path_factory.mktemp("hf-dataset") / "corpus", files)


def hf_source(dataset, **extra) -> dict:
    return {"name": "web", "kind": "hf", "dataset": str(dataset), "path_column": "url", "quality": "prose", **extra}


@pytest.mark.parametrize("sample", [None, 0.6])
def test_an_hf_source_scatters_by_data_file_to_the_bytes_of_one_job(dataset, tmp_path, sample):
    spec = hf_source(dataset, **({} if sample is None else {"sample": sample, "sample_seed": 5}))
    cfg = download_cfg([spec], rows_per_part=7, scatter_mb=0.000001)  # a data file a part job
    plan = download_plan(cfg)
    assert plan.parts == 6
    assert [stamp["first_row"] for stamp in plan.stamps] == [0, 5, 11, 18, 26, 35]
    assert all(len(stamp["files"]) == 1 and stamp["files"][0].endswith(".parquet") for stamp in plan.stamps)
    write_raw(cfg, tmp_path / "one")
    one_job = files_of(tmp_path / "one")
    gathered, _ = scatter(cfg, tmp_path / "scatter")
    assert gathered == one_job
    manifest = json.loads(one_job["manifest.json"])["sources"]["web"]
    if sample is None:  # every ordered decision met a document of another share
        assert manifest["rows"] == 45 - 2
        assert manifest["skipped_duplicate"] == 1 and manifest["skipped_near_duplicate"] == 1
    else:
        assert 15 < manifest["rows"] < 40


def test_shares_of_several_data_files_keep_the_stream_order(dataset, tmp_path):
    sizes = sorted(p.stat().st_size for p in (dataset / "data").iterdir())
    cfg = download_cfg([hf_source(dataset)], rows_per_part=7, scatter_mb=2.5 * sizes[0] / 2**20)
    plan = download_plan(cfg)
    assert 1 < plan.parts < 6
    listed = [f for stamp in plan.stamps for f in stamp["files"]]
    assert listed == sorted(str(p) for p in (dataset / "data").iterdir())
    write_raw(cfg, tmp_path / "one")
    assert scatter(cfg, tmp_path / "scatter")[0] == files_of(tmp_path / "one")


def test_a_stream_that_cannot_be_cut_stays_one_job_and_the_plan_says_why(tmp_path, caplog):
    one_file = write_dataset_folder(tmp_path / "one-file", [rows(0, 6)])
    lines = write_jsonl(tmp_path / "rows.jsonl", rows(1, 6))
    sources = [
        hf_source(one_file),
        {"name": "lines", "kind": "hf", "dataset": "json", "data_files": [str(lines)]},
    ]
    cfg = download_cfg(sources, scatter_mb=0.000001)
    with caplog.at_level(logging.INFO, logger="kiln.download"):
        assert download_plan(cfg).parts == 0
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "source 'web' is read by the download job: split 'train' is 1 data file" in said
    assert "source 'lines' is read by the download job: its builder (json) is not parquet's" in said


@pytest.mark.parametrize("budget", [{"max_rows": 9}, {"max_bytes": 9000, "sample": 0.7}])
def test_a_budgeted_hf_source_scatters_to_the_bytes_of_one_job(dataset, tmp_path, budget):
    """Budgets the first files hold: the plan leaves the last files to the gather, which never needs them."""
    cfg = download_cfg([hf_source(dataset, **budget)], rows_per_part=7, scatter_mb=0.000001)
    plan = download_plan(cfg)
    assert plan.gather and [stamp["first_row"] for stamp in plan.stamps + plan.gather] == [0, 5, 11, 18, 26, 35]
    write_raw(cfg, tmp_path / "one")
    assert scatter(cfg, tmp_path / "scatter")[0] == files_of(tmp_path / "one")


def test_the_gather_reads_the_data_files_a_budget_reaches_past_the_estimate(tmp_path):
    """Files 2-4 repeat files 0 and 1, which the plan's sample (its own checks: no deduplication)
    cannot foresee: 14 rows need file 5, which the plan left to the gather."""
    files = [rows(file, 6) for file in (0, 1, 0, 1, 0, 5)]
    dataset = write_dataset_folder(tmp_path / "repeats", files)
    cfg = download_cfg([hf_source(dataset, max_rows=14)], rows_per_part=7, scatter_mb=0.000001)
    plan = download_plan(cfg)
    assert len(plan.stamps) == 3 and len(plan.gather) == 3
    write_raw(cfg, tmp_path / "one")
    gathered, _ = scatter(cfg, tmp_path / "scatter")
    assert gathered == files_of(tmp_path / "one")
    manifest = json.loads(gathered["manifest.json"])["sources"]["web"]
    assert manifest["rows"] == 14 and manifest["skipped_duplicate"] == 18


def test_a_part_job_retries_its_data_files_after_a_network_failure(tmp_path, monkeypatch):
    """Parquet data files named by URL (as a Hub dataset's are): the part job reading s1 meets two 503s
    and reads it again from its start (download.retries), to the one job's bytes."""
    served = tmp_path / "served"
    served.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"text": [row_text(k, i) for i in range(30)]}), served / f"s{k}.parquet")
    with flaky_serving(served, monkeypatch) as (base, refuse):
        spec = {"name": "web", "kind": "hf", "dataset": "parquet"}
        spec["data_files"] = [f"{base}/s{k}.parquet" for k in range(3)]
        cfg = download_cfg([spec], rows_per_part=10, scatter_mb=0.000001, retries=3)
        write_raw(cfg, tmp_path / "one")
        plan = download_plan(cfg)
        assert plan.parts == 3 and plan.stamps[1]["first_row"] == 30
        refuse["s1.parquet"] = 2
        gathered, _ = scatter(cfg, tmp_path / "scatter")
        assert refuse["s1.parquet"] == 0  # the failures did happen
    assert gathered == files_of(tmp_path / "one")
