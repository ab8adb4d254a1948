"""The download stage as a plan, one download_part job per share of the input files and a gather:
the same bytes as the one job, whatever the shares cut across (exact and near duplicates, quality
filters, invalid UTF-8, a budgeted source between others); a budget's shares past its expected reach
left to the gather, which reads them only if the budget gets there; a part made under other settings is
refused. (The workflow runs it this way: tests/dag/test_pipeline.py and the Slurm test run the jobs.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import download_cfg, write_jsonl

from kiln.data.raw import write_raw
from kiln.data.raw_scatter import PART_JSON, download_plan, part_verdicts, write_part
from kiln.data.source_kinds.stdlib.reader import stdlib_root
from kiln.errors import KilnError

BODY = "".join(f"def step_{i}(state, value):\n    state.total += value * {i}\n    return state\n\n" for i in range(12))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Three local sources and a stdlib slice, written so that every ordered decision meets a
    document of another share: a file and its exact copy, a file and its one-word edit, a file two
    shares later that repeats an earlier one, and a budgeted source in between."""
    base = tmp_path_factory.mktemp("download-scatter")
    code = base / "code"
    code.mkdir()
    for i in range(10):
        (code / f"module_{i:02d}.py").write_text(f"# module {i}\n" + BODY.replace("step_", f"m{i}_step_"))
    (code / "module_03_copy.py").write_text((code / "module_03.py").read_text())  # an exact duplicate
    (code / "module_05_edit.py").write_text((code / "module_05.py").read_text().replace("state", "st", 1))
    (code / "zz_long_line.py").write_text("x = '" + "a" * 2000 + "'\n")  # the long_lines filter
    (code / "zz_latin1.py").write_bytes(b"name = 'caf\xe9'\n")  # not UTF-8
    (code / "zz_blank.py").write_text("  \n\n")
    rows = [{"text": f"record {i}: " + "words and more words " * 10, "repo": f"r{i // 3}"} for i in range(20)]
    rows[4]["text"] = "bad \ud800 surrogate"
    rows[7]["text"] = (code / "module_01.py").read_text()  # a duplicate across sources
    records = write_jsonl(base / "records.jsonl", rows)
    capped = write_jsonl(base / "capped.jsonl", [{"text": (code / "module_08.py").read_text()}] + rows[:6])
    sources = [
        {"name": "code", "kind": "local", "paths": [str(code)], "quality": "code"},
        {"name": "capped", "kind": "local", "paths": [str(capped)], "text_column": "text", "max_rows": 4},
        {"name": "records", "kind": "local", "paths": [str(records)], "text_column": "text", "repo_column": "repo"},
        {"name": "std", "kind": "stdlib", "include": ["json/*.py"]},
    ]
    return {"base": base, "sources": sources}


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def scatter(cfg, folder: Path) -> tuple[dict, int]:
    """What the plan, the download_part jobs and the gather write; and how many part jobs ran."""
    plan = download_plan(cfg)
    dirs = []
    for index in range(plan.parts):
        dirs.append(folder / "parts" / f"part-{index:05d}")
        dirs[-1].mkdir(parents=True)
        write_part(cfg, plan, index, dirs[-1])
    write_raw(cfg, folder / "raw", part_verdicts(cfg, plan, dirs))
    return files_of(folder / "raw"), plan.parts


@pytest.mark.parametrize("scatter_mb", [0.001, 0.004, 100])
def test_the_scatter_writes_the_bytes_of_one_job(corpus, tmp_path, scatter_mb):
    cfg = download_cfg(corpus["sources"], rows_per_part=5, scatter_mb=scatter_mb)
    write_raw(cfg, tmp_path / "one")
    one_job = files_of(tmp_path / "one")
    gathered, parts = scatter(cfg, tmp_path / "scatter")
    assert gathered == one_job
    manifest = json.loads(one_job["manifest.json"])
    code, records = manifest["sources"]["code"], manifest["sources"]["records"]
    # every ordered decision was met, so the replay had each to get right
    assert code["skipped_duplicate"] == 1 and code["skipped_near_duplicate"] == 1
    assert code["skipped_filter"] == {"long_lines": 1} and code["skipped_non_utf8"] == 1 and code["skipped_empty"] == 1
    assert records["skipped_non_utf8"] == 1 and records["skipped_duplicate"] == 5  # capped's 4, and module_01
    assert manifest["sources"]["capped"]["rows"] == 4 and manifest["sources"]["capped"]["skipped_duplicate"] == 1
    assert parts == 4 if scatter_mb == 100 else parts > 4  # 100 MB: one part job per source
    if scatter_mb == 0.001:  # about 1 KB: one or two files a part job
        assert parts >= (16 + 1 + len(list((stdlib_root() / "json").glob("*.py")))) // 2


def test_the_plan_cuts_every_source_in_reading_order_and_never_splits_a_file(corpus):
    cfg = download_cfg(corpus["sources"], scatter_mb=0.004)
    plan = download_plan(cfg)
    assert list(dict.fromkeys(stamp["source"] for stamp in plan.stamps)) == ["code", "capped", "records", "std"]
    assert plan.gather == []  # capped's one share: the first is always checked by a part job
    code_files = [f for stamp in plan.stamps if stamp["source"] == "code" for f in stamp["files"]]
    assert code_files == sorted(str(p) for p in Path(corpus["sources"][0]["paths"][0]).iterdir())
    sizes = [sum(Path(f).stat().st_size for f in stamp["files"]) for stamp in plan.stamps if stamp["source"] == "code"]
    assert all(size >= 0.004 * 2**20 for size in sizes[:-1])  # each share but the last reaches scatter_mb


def test_a_part_made_under_other_settings_is_refused(corpus, tmp_path):
    cfg = download_cfg(corpus["sources"], scatter_mb=0.004)
    plan = download_plan(cfg)
    folder = tmp_path / "part-00000"
    folder.mkdir()
    write_part(cfg, plan, 0, folder)
    other = download_cfg(corpus["sources"], scatter_mb=0.004, min_doc_bytes=3)  # another check
    with pytest.raises(KilnError, match="download_part 0: the plan was made for other download settings"):
        write_part(other, plan, 0, tmp_path / "unused")
    with pytest.raises(KilnError, match=r"download: .*part-00000 is not part 1 of this plan"):
        part_verdicts(cfg, plan, [folder, folder, *[folder] * (plan.parts - 2)])
    (folder / PART_JSON).unlink()  # what a killed job would leave, were its folder not staged
    with pytest.raises(KilnError, match="is not part 0 of this plan"):
        part_verdicts(cfg, plan, [folder] * plan.parts)
    with pytest.raises(KilnError, match="1 part folders given, the plan has"):
        part_verdicts(cfg, plan, [folder])


def test_a_sampled_source_scatters_to_the_bytes_of_one_job(corpus, tmp_path):
    """The part jobs check only the sampled documents (by id, as the one job reads them)."""
    sampled = [
        {**spec, "sample": 0.6, "sample_seed": 1} if spec["name"] != "capped" else spec for spec in corpus["sources"]
    ]
    cfg = download_cfg(sampled, rows_per_part=5, scatter_mb=0.002)
    write_raw(cfg, tmp_path / "one")
    one_job = files_of(tmp_path / "one")
    gathered, parts = scatter(cfg, tmp_path / "scatter")
    assert gathered == one_job and parts > 3
    whole = download_cfg(corpus["sources"], rows_per_part=5)
    manifest, all_rows = json.loads(one_job["manifest.json"]), write_raw(whole, tmp_path / "whole")
    assert 0 < manifest["sources"]["code"]["rows"] < all_rows["sources"]["code"]["rows"]
