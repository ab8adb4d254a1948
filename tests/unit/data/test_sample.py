"""A source's `sample`: a fraction of its documents chosen by a hash of the seed and the id, so the same
ones on every run and every machine, spread over the whole source; a budget counts the sampled documents
(the budget is cut from the sample, not the sample from a prefix); a resumed read keeps the same ones."""

from __future__ import annotations

import json

import pytest
from conftest import download_cfg, source, write_jsonl

from kiln.data.raw import write_raw
from kiln.data.sources import SourceReader, in_sample, read_documents

ROWS = 2000


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    rows = [{"text": f"document {i}: " + "some words " * (i % 7 + 1)} for i in range(ROWS)]
    return write_jsonl(tmp_path_factory.mktemp("sample") / "rows.jsonl", rows)


def ids(fraction: float | None, rows_file, **extra) -> list[str]:
    sample = {} if fraction is None else {"sample": fraction}
    spec = source(name="rows", kind="local", paths=[str(rows_file)], **sample, **extra)
    return [doc.id for doc in SourceReader(spec).read()]


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_the_sample_keeps_its_fraction_spread_over_the_source(rows_file, fraction):
    kept = ids(fraction, rows_file)
    assert abs(len(kept) / ROWS - fraction) < 0.04  # binomial: 3 standard deviations is under 0.034
    rows = [int(doc_id.rsplit("#", 1)[1]) for doc_id in kept]
    assert rows == sorted(rows)  # in reading order
    halves = sum(row < ROWS // 2 for row in rows), sum(row >= ROWS // 2 for row in rows)
    assert abs(halves[0] - halves[1]) < 0.1 * len(rows) + 10  # not a prefix
    assert ids(1, rows_file) == ids(None, rows_file)


def test_the_sample_is_the_same_on_every_read_and_moves_with_its_seed(rows_file):
    assert ids(0.5, rows_file) == ids(0.5, rows_file) == ids(0.5, rows_file, sample_seed=0)
    other = ids(0.5, rows_file, sample_seed=7)
    assert other != ids(0.5, rows_file) and abs(len(other) / ROWS - 0.5) < 0.04
    assert set(ids(0.3, rows_file)) <= set(ids(0.6, rows_file))  # a larger fraction keeps the smaller's
    assert in_sample("rows/x#1", 0.5, 3) == in_sample("rows/x#1", 0.5, 3)


def test_a_resumed_read_keeps_the_same_documents(rows_file):
    spec = source(name="rows", kind="local", paths=[str(rows_file)], sample=0.5)
    reader = SourceReader(spec)
    items = reader.read()
    first = [next(items).id for _ in range(100)]
    position = json.loads(json.dumps(reader.position()))
    assert position["records"] > 100  # records read, sampled or not
    resumed = [doc.id for doc in SourceReader(spec).read(position)]
    assert first + resumed == ids(0.5, rows_file)


def test_a_budget_is_cut_from_the_sample(rows_file, tmp_path):
    sampled = {"name": "rows", "kind": "local", "paths": [str(rows_file)], "sample": 0.5, "sample_seed": 3}
    cfg = download_cfg([{**sampled, "max_rows": 300}], near_dup={"enabled": False})
    manifest = write_raw(cfg, tmp_path / "raw")
    kept = [doc.id for doc in read_documents(tmp_path / "raw", manifest)]
    assert len(kept) == manifest["sources"]["rows"]["rows"] == 300
    assert kept == ids(0.5, rows_file, sample_seed=3)[:300]  # the sample's first 300, not the source's
    assert int(kept[-1].rsplit("#", 1)[1]) > 500
