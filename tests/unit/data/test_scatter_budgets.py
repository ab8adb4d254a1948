"""A budgeted source in the download scatter (kiln.data.raw_reach): download_part jobs check the shares
its budget is expected to reach, the plan leaves the rest to the gather, and the gather reads and checks
any of those the budget does reach; the bytes are one job's whether the estimate held or fell short."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import download_cfg
from test_download_scatter import BODY, files_of, scatter

from kiln.data.raw import write_raw
from kiln.data.raw_reach import REACH_MARGIN
from kiln.data.raw_scatter import download_plan, part_verdicts, write_part
from kiln.data.verdicts import VerdictReader


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    """60 files of about 1.2 KB: 20 distinct, 20 exact copies of the first ones, 20 distinct again."""
    folder = tmp_path_factory.mktemp("budgets") / "code"
    folder.mkdir()
    for i in range(60):
        n = i if i < 20 or i >= 40 else i - 20  # files 20-39 repeat files 0-19
        (folder / f"m{i:02d}.py").write_text(f"# module {n}\n" + BODY.replace("step_", f"m{n}_step_"))
    return folder


def budgeted(code, **budget) -> dict:
    return {"name": "code", "kind": "local", "paths": [str(code)], "quality": "code", **budget}


def run_both(cfg, tmp_path, caplog) -> tuple[dict, str]:
    """The gathered folder (checked against one job's) and what the gather logged."""
    write_raw(cfg, tmp_path / "one")
    with caplog.at_level(logging.INFO, logger="kiln.download"):
        gathered, _ = scatter(cfg, tmp_path / "scatter")
    assert gathered == files_of(tmp_path / "one")
    return json.loads(gathered["manifest.json"])["sources"]["code"], caplog.text


def test_part_jobs_check_the_shares_a_budget_is_expected_to_reach(code, tmp_path, caplog):
    cfg = download_cfg([budgeted(code, max_rows=8)], near_dup={"enabled": False}, scatter_mb=0.003)
    plan = download_plan(cfg)
    files = [len(stamp["files"]) for stamp in plan.stamps]
    assert sum(files[:-1]) < REACH_MARGIN * 8 <= sum(files) and plan.gather  # ~10 of 60 files checked
    assert [f for stamp in plan.stamps + plan.gather for f in stamp["files"]] == sorted(map(str, code.iterdir()))
    manifest, said = run_both(cfg, tmp_path, caplog)
    assert manifest["rows"] == 8 and "checked here" not in said  # the estimate held


def test_the_gather_checks_the_shares_a_budget_reaches_past_the_estimate(code, tmp_path, caplog):
    """The sample keeps every file, but files 20-39 are duplicates: 30 documents are in the last third."""
    cfg = download_cfg([budgeted(code, max_rows=30)], near_dup={"enabled": False}, scatter_mb=0.003)
    plan = download_plan(cfg)
    assert sum(len(stamp["files"]) for stamp in plan.stamps) < 45 and plan.gather
    manifest, said = run_both(cfg, tmp_path, caplog)
    assert manifest["rows"] == 30 and manifest["skipped_duplicate"] == 20
    assert "its budget reaches past the plan's estimate" in said


def test_a_byte_budget_with_a_sample_is_one_jobs_too(code, tmp_path, caplog):
    cfg = download_cfg([budgeted(code, max_bytes=20_000, sample=0.5)], scatter_mb=0.003)
    assert download_plan(cfg).gather
    manifest, _ = run_both(cfg, tmp_path, caplog)
    assert 0 < manifest["bytes"] <= 20_000


def test_a_resumed_gather_picks_up_inside_a_share_it_checks_itself(code, tmp_path):
    """VerdictReader's position counts records across the parts' verdicts and the gather's own shares."""
    cfg = download_cfg([budgeted(code, max_rows=30)], near_dup={"enabled": False}, scatter_mb=0.003)
    plan = download_plan(cfg)
    dirs = []
    for index in range(plan.parts):
        dirs.append(tmp_path / f"part-{index}")
        dirs[-1].mkdir()
        write_part(cfg, plan, index, dirs[-1])
    segments = part_verdicts(cfg, plan, dirs)["code"]
    whole = [doc.id for doc, _ in VerdictReader(cfg.sources[0], cfg, segments).read(None)]
    assert len(whole) == 60
    reader = VerdictReader(cfg.sources[0], cfg, segments)
    records = reader.read(None)
    first = [next(records)[0].id for _ in range(50)]  # into the gather's first share
    resumed = [doc.id for doc, _ in VerdictReader(cfg.sources[0], cfg, segments).read(reader.position())]
    assert first + resumed == whole
