"""Sources: which documents come out, in what order, with what ids; what is skipped and counted;
how parts and manifest entries land on disk and read back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_jsonl
from kiln.data.sources import (
    write_raw,
    SourceStats,
    iter_documents,
    iter_parts,
    read_documents,
    stdlib_root,
    write_source,
)
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file


def docs_of(spec: dict) -> tuple[list, SourceStats]:
    stats = SourceStats()
    return list(iter_documents(spec, stats)), stats


def local(paths, name="loc", **extra) -> dict:
    return {"name": name, "kind": "local", "paths": [str(p) for p in paths], "text_column": "text", **extra}


# --- stdlib -----------------------------------------------------------------------------------------


def test_stdlib_source_yields_sorted_docs_with_relative_ids_and_paths():
    # Overlapping patterns must not duplicate a file.
    docs, stats = docs_of({"name": "std", "kind": "stdlib", "include": ["json/*.py", "json/*.py", "json/de*.py"]})
    root = stdlib_root()
    expected = sorted(p for p in root.glob("json/*.py") if p.is_file())
    assert len(expected) >= 3
    assert [d.path for d in docs] == [p.relative_to(root).as_posix() for p in expected]
    assert [d.id for d in docs] == [f"std/{d.path}" for d in docs]
    assert [d.id for d in docs] == sorted(d.id for d in docs)
    assert all(d.source == "std" for d in docs)
    assert docs[0].text == expected[0].read_text(encoding="utf-8")
    assert stats.skipped_non_utf8 == 0


def test_stdlib_source_unions_several_globs():
    docs, _ = docs_of({"name": "std", "kind": "stdlib", "include": ["json/*.py", "http/*.py"]})
    dirs = {d.path.split("/")[0] for d in docs}
    assert dirs == {"json", "http"}
    assert len({d.id for d in docs}) == len(docs)


# --- local ------------------------------------------------------------------------------------------


def test_local_jsonl_one_document_per_row(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "alpha", "n": 1}, {"text": "beta"}, {"text": "gamma"}])
    docs, _ = docs_of(local([path]))
    assert [d.text for d in docs] == ["alpha", "beta", "gamma"]
    assert [d.id for d in docs] == [f"loc/{path.as_posix()}#{i}" for i in range(3)]
    assert all(d.path == path.as_posix() and d.source == "loc" for d in docs)


@pytest.mark.parametrize("leading", ["", "\n  "], ids=["plain", "leading-whitespace"])
def test_local_json_list(tmp_path, leading):
    path = tmp_path / "b.json"
    path.write_text(leading + json.dumps([{"body": "one"}, {"body": "two"}], indent=2), encoding="utf-8")
    docs, _ = docs_of(local([path], text_column="body"))
    assert [d.text for d in docs] == ["one", "two"]
    assert [d.id for d in docs] == [f"loc/{path.as_posix()}#0", f"loc/{path.as_posix()}#1"]


def test_local_parquet_text_column(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"content": ["p0", "p1", "p2"], "lang": ["py", "c", "go"]}), path)
    docs, _ = docs_of(local([path], text_column="content"))
    assert [d.text for d in docs] == ["p0", "p1", "p2"]
    assert docs[2].id == f"loc/{path.as_posix()}#2"


def test_local_directory_one_document_per_file_path_kept(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg" / "sub").mkdir(parents=True)
    files = {"pkg/b.py": "print('b')\n", "pkg/a.py": "A = 1\n", "pkg/sub/c.rs": "fn main() {}\n", "README": "hi\n"}
    for rel, text in files.items():
        (root / rel).write_text(text, encoding="utf-8")
    docs, _ = docs_of(local([root]))
    expected = sorted(root / rel for rel in files)
    assert [d.path for d in docs] == [p.as_posix() for p in expected]
    assert [d.id for d in docs] == [f"loc/{p.as_posix()}" for p in expected]
    assert [d.text for d in docs] == [p.read_text(encoding="utf-8") for p in expected]


def test_local_glob_pattern_and_missing_pattern(tmp_path):
    for name in ("x2.txt", "x1.txt", "y.md"):
        (tmp_path / name).write_text(name, encoding="utf-8")
    docs, _ = docs_of(local([tmp_path / "x*.txt"]))
    assert [d.text for d in docs] == ["x1.txt", "x2.txt"]
    with pytest.raises(KilnError, match="matches no file"):
        docs_of(local([tmp_path / "nothing*.txt"]))
    with pytest.raises(KilnError, match="does not exist"):
        docs_of(local([tmp_path / "absent.txt"]))


def test_missing_text_column_jsonl_names_column_and_present_columns(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"content": "x", "lang": "py"}])
    with pytest.raises(KilnError) as info:
        docs_of(local([path]))
    message = str(info.value)
    assert "'text'" in message and str(path) in message
    assert "content" in message and "lang" in message


def test_missing_text_column_parquet_names_column_and_present_columns(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"content": ["x"], "lang": ["py"]}), path)
    with pytest.raises(KilnError) as info:
        docs_of(local([path]))
    message = str(info.value)
    assert "'text'" in message and str(path) in message
    assert "content" in message and "lang" in message


def test_non_string_text_value_raises(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"text": "ok"}, {"text": 3}])
    with pytest.raises(KilnError, match=r"row 1 .*'text'.*int"):
        docs_of(local([path]))


def test_non_utf8_files_skipped_and_counted(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "good.py").write_text("ok = True\n", encoding="utf-8")
    (root / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (root / "blob.bin").write_bytes(bytes([0xFF, 0xFE, 0x00, 0x80]))
    entry = write_source(local([root]), tmp_path / "out", rows_per_part=10)
    assert entry["rows"] == 1
    assert entry["skipped_non_utf8"] == 2
    assert entry["skipped_empty"] == 0


def test_empty_documents_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"text": ""}, {"text": "real"}, {"text": "  \n\t"}, {"text": "also"}])
    entry = write_source(local([path]), tmp_path / "out", rows_per_part=10)
    assert entry["rows"] == 2
    assert entry["skipped_empty"] == 2
    texts = pq.read_table(tmp_path / "out" / "part-00000.parquet").column("text").to_pylist()
    assert texts == ["real", "also"]


def test_empty_corpus_raises_from_write_source(tmp_path):
    root = tmp_path / "hollow"
    root.mkdir()
    (root / "empty.py").write_text("", encoding="utf-8")
    (root / "bad.py").write_bytes(b"\xff\xff")
    with pytest.raises(KilnError) as info:
        write_source(local([root], name="hollow"), tmp_path / "out", rows_per_part=10)
    message = str(info.value)
    assert "'hollow'" in message and "no documents" in message
    assert "1 empty" in message and "1 non-UTF-8" in message


def test_max_bytes_budget_respected(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [{"text": f"{i:02d}" + "x" * 98} for i in range(10)])  # 100 B each
    docs, _ = docs_of(local([path], max_bytes=350))
    assert [d.text[:2] for d in docs] == ["00", "01", "02"]
    entry = write_source(local([path], max_bytes=350), tmp_path / "out", rows_per_part=2)
    assert entry["bytes"] == 300 <= 350
    assert entry["rows"] == 3
    exact, _ = docs_of(local([path], max_bytes=400))
    assert len(exact) == 4
    unlimited, _ = docs_of(local([path]))
    assert len(unlimited) == 10


def test_max_bytes_counts_utf8_bytes_not_characters(tmp_path):
    path = write_jsonl(tmp_path / "u.jsonl", [{"text": "é" * 50} for _ in range(4)])  # 100 B, 50 chars each
    docs, _ = docs_of(local([path], max_bytes=250))
    assert len(docs) == 2


# --- hf (offline, through the json builder) -----------------------------------------------------------


def hf_spec(files, **extra) -> dict:
    return {"name": "hub", "kind": "hf", "dataset": "json", "split": "train",
            "data_files": [str(f) for f in files], "text_column": "text", **extra}


def test_hf_json_builder_reads_rows_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(4)])
    docs, _ = docs_of(hf_spec([a]))
    assert [d.text for d in docs] == ["a0", "a1", "a2", "a3"]
    assert [d.id for d in docs] == [f"hub/json#{i}" for i in range(4)]
    assert all(d.source == "hub" for d in docs)


def test_hf_max_rows_and_max_bytes(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": f"row{i}" + "y" * 6} for i in range(20)])  # 10 B each
    docs, _ = docs_of(hf_spec([a], max_rows=3))
    assert [d.text[:4] for d in docs] == ["row0", "row1", "row2"]
    docs, _ = docs_of(hf_spec([a], max_bytes=55))
    assert len(docs) == 5
    entry = write_source(hf_spec([a], max_rows=7), tmp_path / "out", rows_per_part=3)
    assert entry["rows"] == 7 and [p["rows"] for p in entry["parts"]] == [3, 3, 1]


def test_hf_missing_column_names_column_and_present_columns(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"content": "x", "lang": "py"}])
    with pytest.raises(KilnError) as info:
        docs_of(hf_spec([a]))
    message = str(info.value)
    assert "'text'" in message and "content" in message and "lang" in message


def test_hf_null_text_raises_kiln_error(tmp_path):
    # The json builder fills a missing key with None when other rows have it.
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "fine"}, {"other": "x"}])
    with pytest.raises(KilnError, match="'text'"):
        docs_of(hf_spec([a]))


def test_hf_unreadable_dataset_raises_kiln_error(tmp_path):
    with pytest.raises(KilnError, match="cannot open dataset"):
        docs_of(hf_spec([tmp_path / "missing-*.jsonl"]))


# --- parts and manifest -------------------------------------------------------------------------------


def test_manifest_hashes_counts_and_read_back_order(tmp_path):
    jsonl = write_jsonl(tmp_path / "in" / "t.jsonl", [{"text": f"doc {i} é\n"} for i in range(5)] + [{"text": ""}])
    specs = [
        {"name": "std", "kind": "stdlib", "include": ["json/*.py"]},
        local([jsonl], name="loc"),
    ]
    raw = tmp_path / "raw"
    manifest = write_raw(specs, raw, rows_per_part=2)
    assert manifest == read_json(raw / "manifest.json")

    expected = []
    for spec in specs:
        docs, _ = docs_of(spec)
        expected.extend(docs)
        entry = manifest["sources"][spec["name"]]
        assert [p["file"] for p in entry["parts"]] == [f"part-{i:05d}.parquet" for i in range(len(entry["parts"]))]
        for part in entry["parts"]:
            path = raw / spec["name"] / part["file"]
            assert part["sha256"] == sha256_file(path)
            texts = pq.read_table(path).column("text").to_pylist()
            assert part["rows"] == len(texts) <= 2
            assert part["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
        assert entry["rows"] == sum(p["rows"] for p in entry["parts"]) == len(docs)
        assert entry["bytes"] == sum(p["bytes"] for p in entry["parts"])
    assert manifest["sources"]["loc"]["skipped_empty"] == 1
    assert manifest["rows"] == sum(s["rows"] for s in manifest["sources"].values()) == len(expected)
    assert manifest["bytes"] == sum(len(d.text.encode("utf-8")) for d in expected)

    assert list(read_documents(raw, manifest)) == expected
    parts = list(iter_parts(raw, manifest))
    assert [len(p) for p in parts] == [p["rows"] for s in manifest["sources"].values() for p in s["parts"]]
    assert [d for part in parts for d in part] == expected


def test_part_files_are_deterministic(tmp_path):
    spec = {"name": "std", "kind": "stdlib", "include": ["json/*.py"]}
    first = write_source(spec, tmp_path / "a", rows_per_part=3)
    second = write_source(spec, tmp_path / "b", rows_per_part=3)
    assert first == second
