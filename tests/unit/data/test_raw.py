"""The download writer: cleaning counted in the manifest, budgets, parts that keep a repository whole,
retries after network failures and resumption after the last complete part, nothing partial left
behind. Network failures are real: a local HTTP server that refuses some range requests, read
through `datasets` streaming like a hub dataset."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
from pathlib import Path
from typing import Iterator

import datasets
import pyarrow.parquet as pq
import pytest
from conftest import download_cfg, write_jsonl

from kiln.data.raw import write_raw
from kiln.data.sources import SourceReader, iter_parts, part_paths, read_documents
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file


def local(paths, name="loc", **extra) -> dict:
    return {"name": name, "kind": "local", "paths": [str(p) for p in paths], "text_column": "text", **extra}


def texts_of(raw) -> list[str]:
    return [d.text for d in read_documents(raw, read_json(raw / "manifest.json"))]


def test_manifest_hashes_counts_and_read_back_order(tmp_path):
    jsonl = write_jsonl(tmp_path / "in" / "t.jsonl", [{"text": f"doc {i} é\n"} for i in range(5)] + [{"text": ""}])
    specs = [{"name": "std", "kind": "stdlib", "include": ["json/*.py"]}, local([jsonl])]
    raw = tmp_path / "raw"
    cfg = download_cfg(specs, rows_per_part=2)
    manifest = write_raw(cfg, raw)
    assert manifest == read_json(raw / "manifest.json")
    expected = [d for spec in cfg.sources for d in SourceReader(spec).read() if d is not None and d.text]
    for spec in cfg.sources:
        entry = manifest["sources"][spec.name]
        assert entry["spec"] == spec.as_dict() and entry["kind"] == spec.kind  # as the validated config has it
        assert [p["file"] for p in entry["parts"]] == [f"part-{i:05d}.parquet" for i in range(len(entry["parts"]))]
        for part in entry["parts"]:
            path = raw / spec.name / part["file"]
            assert part["sha256"] == sha256_file(path)
            texts = pq.read_table(path).column("text").to_pylist()
            assert part["rows"] == len(texts) <= 2
            assert part["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
        assert entry["rows"] == sum(p["rows"] for p in entry["parts"])
        assert entry["bytes"] == sum(p["bytes"] for p in entry["parts"])
    assert manifest["sources"]["loc"]["skipped_empty"] == 1
    assert manifest["rows"] == len(expected)
    assert list(read_documents(raw, manifest)) == expected
    parts = list(iter_parts(raw, manifest))
    assert [len(p) for p in parts] == [p["rows"] for s in manifest["sources"].values() for p in s["parts"]]
    assert [name for name, _ in part_paths(raw, manifest)] == ["std"] * len(manifest["sources"]["std"]["parts"]) + [
        "loc"
    ] * len(manifest["sources"]["loc"]["parts"])
    assert not (tmp_path / ".raw.partial").exists()


def test_output_is_deterministic(tmp_path):
    cfg = download_cfg([{"name": "std", "kind": "stdlib", "include": ["json/*.py"]}], rows_per_part=3)
    assert write_raw(cfg, tmp_path / "a") == write_raw(cfg, tmp_path / "b")


def test_cleaning_is_counted_per_source(tmp_path):
    rows = [{"text": t} for t in ["keep one", "", "  \n", "dup", "x" * 50, "dup", "y", "ok", "keep one"]]
    a = write_jsonl(tmp_path / "a.jsonl", rows)
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "ok"}, {"text": "fresh"}])
    cfg = download_cfg([local([a], name="a"), local([b], name="b")], min_doc_bytes=2, max_doc_bytes=40)
    manifest = write_raw(cfg, tmp_path / "raw")
    counts = {k: v for k, v in manifest["sources"]["a"].items() if k.startswith("skipped") or k == "rows"}
    assert counts == {
        "rows": 3,
        "skipped_non_utf8": 0,
        "skipped_empty": 2,
        "skipped_short": 1,
        "skipped_long": 1,
        "skipped_duplicate": 2,
        "skipped_contaminated": 0,
        "skipped_near_duplicate": 0,  # none of these has 5 words: none is a near-duplicate candidate
        "skipped_filter": {},  # a local source's quality defaults to none
    }
    assert manifest["sources"]["b"]["skipped_duplicate"] == 1  # "ok" was seen in source a
    assert texts_of(tmp_path / "raw") == ["keep one", "dup", "ok", "fresh"]
    kept = write_raw(download_cfg([local([a], name="a")], dedup=False), tmp_path / "all")
    assert kept["sources"]["a"]["skipped_duplicate"] == 0 and kept["rows"] == 7


def test_non_utf8_and_lone_surrogates_are_skipped_and_counted_or_fatal(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "good.py").write_text("ok = True\n", encoding="utf-8")
    (root / "blob.bin").write_bytes(bytes([0xFF, 0xFE, 0x00, 0x80]))
    (root / "rows.jsonl").write_text('{"text": "lone \\ud800 surrogate"}\n{"text": "fine"}\n', encoding="utf-8")
    manifest = write_raw(download_cfg([local([root])]), tmp_path / "raw")
    assert manifest["sources"]["loc"]["rows"] == 2 and manifest["sources"]["loc"]["skipped_non_utf8"] == 2
    with pytest.raises(KilnError, match="blob.bin: not valid UTF-8"):
        write_raw(download_cfg([local([root])], invalid_utf8="fail"), tmp_path / "strict")
    assert not (tmp_path / "strict").exists() and not (tmp_path / ".strict.partial").exists()


def test_budgets_count_kept_documents(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [{"text": f"{i:02d}" + "x" * 98} for i in range(10)])  # 100 B each
    assert write_raw(download_cfg([local([path], max_bytes=350)], rows_per_part=2), tmp_path / "b")["bytes"] == 300
    assert write_raw(download_cfg([local([path], max_bytes=400)]), tmp_path / "c")["rows"] == 4
    assert write_raw(download_cfg([local([path], max_rows=7)], rows_per_part=3), tmp_path / "d")["rows"] == 7
    assert write_raw(download_cfg([local([path])]), tmp_path / "e")["rows"] == 10
    utf8 = write_jsonl(tmp_path / "u.jsonl", [{"text": "é" * 50} for _ in range(4)])  # 100 B, 50 chars each
    assert write_raw(download_cfg([local([utf8], max_bytes=250)], dedup=False), tmp_path / "f")["rows"] == 2


def test_a_part_does_not_split_a_repository(tmp_path):
    rows = [{"text": f"file {r}.{i}", "repo": f"repo{r}"} for r, n in enumerate([3, 5, 2]) for i in range(n)]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    manifest = write_raw(download_cfg([local([path], repo_column="repo")], rows_per_part=2), tmp_path / "raw")
    repos_per_part = [[d.repo for d in part] for part in iter_parts(tmp_path / "raw", manifest)]
    assert repos_per_part == [["repo0"] * 3, ["repo1"] * 5, ["repo2"] * 2]


def test_empty_source_fails_naming_it_and_leaves_nothing(tmp_path):
    root = tmp_path / "hollow"
    root.mkdir()
    (root / "empty.py").write_text("", encoding="utf-8")
    (root / "bad.py").write_bytes(b"\xff\xff")
    with pytest.raises(KilnError) as info:
        write_raw(download_cfg([local([root], name="hollow")]), tmp_path / "raw")
    message = str(info.value)
    assert "'hollow'" in message and "no documents" in message and "1 empty" in message and "1 non-UTF-8" in message
    assert list(tmp_path.iterdir()) == [root]


def test_unreachable_hub_is_a_clear_error_leaving_nothing(tmp_path):
    spec = {
        "name": "fw",
        "kind": "hf",
        "dataset": "HuggingFaceFW/fineweb-edu",
        "config": "sample-10BT",
        "split": "train",
        "text_column": "text",
    }
    with pytest.raises(KilnError, match="HF_HUB_OFFLINE=1"):
        write_raw(download_cfg([spec]), tmp_path / "raw")
    assert list(tmp_path.iterdir()) == []


# --- network failures, retries and resumption -----------------------------------------------------------


def row_text(k: int, i: int) -> str:
    """Row i of served file k: words enough for the near-duplicate index to see every row, none alike,
    so a retry that forgot to take back its unwritten rows would drop them as duplicates of themselves."""
    return f"shard {k} row {i} " + " ".join(f"w{k}x{i}x{j}" for j in range(6))


class FlakyHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; range requests (the streaming reads) for a file in `refuse` get 503 while
    its count lasts."""

    refuse: dict[str, int] = {}

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        if self.headers.get("Range") and self.refuse.get(name, 0) > 0:
            self.refuse[name] -= 1
            self.send_error(503)
            return
        super().do_GET()


@contextlib.contextmanager
def flaky_serving(served: Path, monkeypatch) -> Iterator[tuple[str, dict[str, int]]]:
    """(base URL, refuse counts) of a FlakyHandler server over the folder `served`, with datasets' own
    retries cut to one, so Kiln's retries do the work."""
    monkeypatch.setattr(datasets.config, "STREAMING_READ_MAX_RETRIES", 1)
    monkeypatch.setattr(datasets.config, "STREAMING_READ_RETRY_INTERVAL", 0)
    monkeypatch.setattr(datasets.config, "STREAMING_READ_SERVER_UNAVAILABLE_RETRY_INTERVAL", 0)
    refuse: dict[str, int] = {}
    handler = type("Handler", (FlakyHandler,), {"refuse": refuse})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", refuse
    finally:
        server.shutdown()
        thread.join()


@pytest.fixture()
def flaky_server(tmp_path, monkeypatch):
    """(base URL, refuse counts) of a server over tmp_path/served holding three 30-row jsonl files."""
    served = tmp_path / "served"
    for k in range(3):
        write_jsonl(served / f"s{k}.jsonl", [{"text": row_text(k, i)} for i in range(30)])
    with flaky_serving(served, monkeypatch) as serving:
        yield serving


def hub_like(base: str) -> dict:
    return {
        "name": "web",
        "kind": "hf",
        "dataset": "json",
        "split": "train",
        "text_column": "text",
        "data_files": [f"{base}/s{k}.jsonl" for k in range(3)],
    }


def test_network_failures_are_retried_from_the_last_complete_part(flaky_server, tmp_path):
    base, refuse = flaky_server
    clean = write_raw(download_cfg([hub_like(base)], rows_per_part=10), tmp_path / "clean")
    refuse["s1.jsonl"] = 2
    flaky = write_raw(download_cfg([hub_like(base)], rows_per_part=10, retries=3), tmp_path / "flaky")
    assert refuse["s1.jsonl"] == 0  # the failures did happen
    assert flaky == clean
    assert texts_of(tmp_path / "flaky") == [row_text(k, i) for k in range(3) for i in range(30)]


def test_an_interrupted_download_resumes_after_its_last_complete_part(flaky_server, tmp_path, caplog):
    base, refuse = flaky_server
    cfg = download_cfg([hub_like(base)], rows_per_part=10, retries=1)
    refuse["s1.jsonl"] = 100
    with pytest.raises(KilnError, match=r"network failure, gave up after 2 attempts \(download.retries=1\)"):
        write_raw(cfg, tmp_path / "raw")
    staging = tmp_path / ".raw.partial"
    assert not (tmp_path / "raw").exists()
    staged = sorted((staging / "web").glob("part-*.parquet"))
    # Rows 20-29 of s0 waited in memory for the part to fill when s1 failed: two parts are complete.
    assert [p.name for p in staged] == [f"part-{i:05d}.parquet" for i in range(2)]
    before = {p.name: p.stat().st_mtime_ns for p in staged}
    refuse["s1.jsonl"] = 0
    caplog.set_level("INFO", logger="kiln.download")
    resumed = write_raw(cfg, tmp_path / "raw")
    assert "resuming an interrupted download: 2 complete parts" in caplog.text
    assert {p: (tmp_path / "raw" / "web" / p).stat().st_mtime_ns for p in before} == before  # not rewritten
    assert not staging.exists()
    assert resumed == write_raw(cfg, tmp_path / "again")
    assert texts_of(tmp_path / "raw") == [row_text(k, i) for k in range(3) for i in range(30)]


def test_a_changed_download_section_starts_over(flaky_server, tmp_path):
    base, refuse = flaky_server
    refuse["s1.jsonl"] = 100
    with pytest.raises(KilnError):
        write_raw(download_cfg([hub_like(base)], rows_per_part=10, retries=0), tmp_path / "raw")
    refuse["s1.jsonl"] = 0
    manifest = write_raw(download_cfg([hub_like(base)], rows_per_part=7, retries=0), tmp_path / "raw")
    assert [p["rows"] for p in manifest["sources"]["web"]["parts"]] == [7] * 12 + [6]
    assert json.loads((tmp_path / "raw" / "manifest.json").read_text()) == manifest
