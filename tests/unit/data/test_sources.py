"""Sources: which documents come out, in what order, with what ids and metadata; what is skipped; where
a reader can resume; bad input named clearly. The hub kind runs through `datasets` on local files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import source, write_jsonl

from kiln.config.data_sections import Source
from kiln.data.source_kinds.stdlib.reader import stdlib_root
from kiln.data.sources import SourceReader
from kiln.errors import KilnError


def read(spec: Source, invalid_utf8: str = "skip") -> list:
    return list(SourceReader(spec, invalid_utf8).read())


def docs_of(spec: Source) -> list:
    return [d for d in read(spec) if d is not None]


def local(paths, name="loc", **extra) -> Source:
    return source(name=name, kind="local", paths=[str(p) for p in paths], **extra)


def hf_spec(files, **extra) -> Source:
    return source(name="hub", kind="hf", dataset="json", data_files=[str(f) for f in files], **extra)


# --- stdlib -----------------------------------------------------------------------------------------


def test_stdlib_source_yields_sorted_docs_with_relative_ids_and_paths():
    # Overlapping patterns must not duplicate a file.
    docs = docs_of(source(name="std", kind="stdlib", include=["json/*.py", "json/*.py", "json/de*.py"]))
    root = stdlib_root()
    expected = sorted(p for p in root.glob("json/*.py") if p.is_file())
    assert len(expected) >= 3
    assert [d.path for d in docs] == [p.relative_to(root).as_posix() for p in expected]
    assert [d.id for d in docs] == [f"std/{d.path}" for d in docs]
    assert all(d.source == "std" and d.repo is None for d in docs)
    assert docs[0].text == expected[0].read_text(encoding="utf-8")


def test_stdlib_source_unions_several_globs():
    docs = docs_of(source(name="std", kind="stdlib", include=["json/*.py", "http/*.py"]))
    assert {d.path.split("/")[0] for d in docs} == {"json", "http"}
    assert len({d.id for d in docs}) == len(docs)


# --- local ------------------------------------------------------------------------------------------


def test_local_jsonl_one_document_per_row(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "alpha", "n": 1}, {"text": "beta"}, {"text": "gamma"}])
    docs = docs_of(local([path]))
    assert [d.text for d in docs] == ["alpha", "beta", "gamma"]
    assert [d.id for d in docs] == [f"loc/{path.as_posix()}#{i}" for i in range(3)]
    assert all(d.path == path.as_posix() and d.source == "loc" for d in docs)


@pytest.mark.parametrize("leading", ["", "\n  "], ids=["plain", "leading-whitespace"])
def test_local_json_list(tmp_path, leading):
    path = tmp_path / "b.json"
    path.write_text(leading + json.dumps([{"body": "one"}, {"body": "two"}], indent=2), encoding="utf-8")
    docs = docs_of(local([path], text_column="body"))
    assert [d.text for d in docs] == ["one", "two"]
    assert [d.id for d in docs] == [f"loc/{path.as_posix()}#0", f"loc/{path.as_posix()}#1"]


def test_local_parquet_text_path_and_repo_columns(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"content": ["p0", "p1", "p2"], "file": ["a.py", "b.py", "c.go"], "repo": ["r1", "r1", None]}), path
    )
    docs = docs_of(local([path], text_column="content", path_column="file", repo_column="repo"))
    assert [d.text for d in docs] == ["p0", "p1", "p2"]
    assert [d.path for d in docs] == ["a.py", "b.py", "c.go"]
    assert [d.repo for d in docs] == ["r1", "r1", None]
    assert docs[2].id == f"loc/{path.as_posix()}#2"


def test_local_directory_one_document_per_file_path_kept(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg" / "sub").mkdir(parents=True)
    files = {"pkg/b.py": "print('b')\n", "pkg/a.py": "A = 1\n", "pkg/sub/c.rs": "fn main() {}\n", "README": "hi\n"}
    for rel, text in files.items():
        (root / rel).write_text(text, encoding="utf-8")
    docs = docs_of(local([root]))
    expected = sorted(root / rel for rel in files)
    assert [d.path for d in docs] == [p.as_posix() for p in expected]
    assert [d.id for d in docs] == [f"loc/{p.as_posix()}" for p in expected]
    assert [d.text for d in docs] == [p.read_text(encoding="utf-8") for p in expected]


def test_local_glob_pattern_and_missing_pattern(tmp_path):
    for name in ("x2.txt", "x1.txt", "y.md"):
        (tmp_path / name).write_text(name, encoding="utf-8")
    assert [d.text for d in docs_of(local([tmp_path / "x*.txt"]))] == ["x1.txt", "x2.txt"]
    with pytest.raises(KilnError, match="matches no file"):
        docs_of(local([tmp_path / "nothing*.txt"]))
    with pytest.raises(KilnError, match="does not exist"):
        docs_of(local([tmp_path / "absent.txt"]))


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_missing_text_column_names_it_and_the_columns_present(tmp_path, suffix):
    path = tmp_path / f"d.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, [{"content": "x", "lang": "py"}])
    else:
        pq.write_table(pa.table({"content": ["x"], "lang": ["py"]}), path)
    with pytest.raises(KilnError) as info:
        docs_of(local([path]))
    message = str(info.value)
    assert "'text'" in message and str(path) in message and "content, lang" in message


def test_missing_repo_column_is_named_too(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"text": "x"}])
    with pytest.raises(KilnError, match=r"no column 'repo_name'; columns present: text"):
        docs_of(local([path], repo_column="repo_name"))


def test_non_string_text_value_raises(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"text": "ok"}, {"text": 3}])
    with pytest.raises(KilnError, match=r"row 1: column 'text' holds int, expected a string"):
        docs_of(local([path]))


def test_broken_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(KilnError, match=rf"{path}: line 2: not valid JSON"):
        docs_of(local([path]))


def _mixed_utf8(tmp_path) -> Path:
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "good.py").write_text("ok = True\n", encoding="utf-8")
    (root / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    jsonl = root / "rows.jsonl"
    jsonl.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff byte"}\n{"text": "also fine"}\n')
    return root


def test_non_utf8_files_and_rows_are_skipped_as_none(tmp_path):
    items = read(local([_mixed_utf8(tmp_path)]))
    assert [None if d is None else d.text for d in items] == ["ok = True\n", None, "fine", None, "also fine"]


def test_non_utf8_is_fatal_when_configured_naming_file_and_line(tmp_path):
    root = _mixed_utf8(tmp_path)
    with pytest.raises(KilnError) as info:
        read(local([root]), invalid_utf8="fail")
    message = str(info.value)
    assert str(root / "latin1.py") in message and "not valid UTF-8" in message and "invalid_utf8: skip" in message
    (root / "latin1.py").unlink()
    with pytest.raises(KilnError, match=rf"{root / 'rows.jsonl'}: line 2: not valid UTF-8"):
        read(local([root]), invalid_utf8="fail")


def test_positions_resume_a_local_source_exactly(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": f"doc {i}"} for i in range(10)])
    spec = local([path])
    reader = SourceReader(spec)
    items = reader.read()
    first = [next(items) for _ in range(4)]
    position = reader.position()
    assert position == {"records": 4}
    resumed = list(SourceReader(spec).read(position))
    assert first + resumed == read(spec)


# --- hf (offline, through datasets' json builder) ---------------------------------------------------------


def test_hf_json_builder_reads_rows_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}", "path": f"f{i}.py", "repo": "r"} for i in range(4)])
    docs = docs_of(hf_spec([a], path_column="path", repo_column="repo"))
    assert [d.text for d in docs] == ["a0", "a1", "a2", "a3"]
    assert [d.id for d in docs] == [f"hub/json#{i}" for i in range(4)]
    assert [d.path for d in docs] == [f"f{i}.py" for i in range(4)]
    assert all(d.source == "hub" and d.repo == "r" for d in docs)


def test_hf_missing_column_is_found_in_the_features_before_any_row(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"content": "x", "lang": "py"}])
    with pytest.raises(KilnError) as info:
        SourceReader(hf_spec([a])).read().__next__()
    message = str(info.value)
    assert "no column 'text'" in message and "text_column" in message and "content, lang" in message


def test_hf_null_text_raises_kiln_error(tmp_path):
    # The json builder fills a missing key with None when other rows have it.
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "fine"}, {"other": "x"}])
    with pytest.raises(KilnError, match="row 1: column 'text' holds NoneType"):
        docs_of(hf_spec([a]))


def test_hf_unreadable_dataset_raises_kiln_error(tmp_path):
    with pytest.raises(KilnError, match="cannot open it"):
        docs_of(hf_spec([tmp_path / "missing-*.jsonl"]))


def test_hf_unreachable_hub_offline_is_a_clear_error():
    # conftest sets HF_HUB_OFFLINE=1: a dataset that is not cached fails at once, without retries.
    spec = source(name="fw", kind="hf", dataset="HuggingFaceFW/fineweb-edu", config="sample-10BT")
    with pytest.raises(KilnError) as info:
        docs_of(spec)
    message = str(info.value)
    assert "'HuggingFaceFW/fineweb-edu'" in message and "sample-10BT" in message
    assert "HF_HUB_OFFLINE=1 and it is not in the local cache" in message


def test_hf_positions_resume_the_stream_in_place(tmp_path):
    files = [write_jsonl(tmp_path / f"s{k}.jsonl", [{"text": f"s{k} row {i}"} for i in range(7)]) for k in range(3)]
    spec = hf_spec(files)
    reader = SourceReader(spec)
    items = reader.read()
    first = [next(items) for _ in range(9)]  # into the second file
    position = reader.position()
    assert position["records"] == 9 and "stream" in position
    resumed = list(SourceReader(spec).read(json.loads(json.dumps(position))))  # survives a JSON file
    assert [d.text for d in first + resumed] == [d.text for d in read(spec)]
    assert [d.id for d in resumed] == [f"hub/json#{i}" for i in range(9, 21)]
