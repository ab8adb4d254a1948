"""Where documents come from: each source kind reads its records in one fixed order.

Kinds:
- `stdlib`: the .py files of the standard library of the interpreter running Kiln (the default corpus:
  real code, present on every machine, no network);
- `local`: files, directories or globs; .jsonl/.json/.parquet rows (a text column, optionally path and
  repository columns), anything else one document per file with its path kept;
- `hf`: `datasets.load_dataset(..., streaming=True)` (see kiln.data.hub); builders such as `json` or
  `parquet` with `data_files` read local files through the same code, which is how the tests run it.

A `SourceReader` yields one item per record: a `Document`, or None for a record that is not valid
UTF-8 and is skipped (or a KilnError naming it, when `invalid_utf8` is `fail`). A file above
BIG_TEXT_BYTES is kept as its bytes (kiln.data.utf8text), never also as a Python string. Its `position()` after
any item is a JSON-able point to resume reading from, so a download picks up after its last complete
part. Cleaning (empty, too short or long, duplicates) and budgets are the download writer's business
(kiln.data.raw); the helpers at the end read its parts back as documents, one part at a time.
"""

from __future__ import annotations

import bisect
import glob
import itertools
import json
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow.parquet as pq

from kiln.config.data_sections import Source
from kiln.data.utf8text import BIG_TEXT_BYTES, Utf8Text, first_invalid_byte, texts_of
from kiln.errors import KilnError
from kiln.io import read_json

log = logging.getLogger("kiln.download")

ROW_FILE_SUFFIXES = {".jsonl", ".json", ".parquet"}


@dataclass(frozen=True)
class Document:
    id: str
    text: str | Utf8Text  # Utf8Text only for very long texts, and only where asked for
    path: str
    source: str
    repo: str | None = None


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


class SourceReader:
    """The records of one source, in order, from a resume position (None: the beginning)."""

    def __init__(self, spec: Source, invalid_utf8: str = "skip"):
        self.spec, self.invalid_utf8 = spec, invalid_utf8
        self.records = 0
        self._stream = None  # the datasets.IterableDataset of an hf source, for its resumable state

    def position(self) -> dict:
        state = {"records": self.records}
        if self._stream is not None:
            state["stream"] = self._stream.state_dict()
        return state

    def files(self) -> list[Path]:
        """The files a stdlib or local source reads, in reading order (its records follow them)."""
        return FILES[self.spec.kind](self.spec)

    def read(self, position: dict | None = None, files: Sequence[Path] | None = None) -> Iterator[Document | None]:
        """The source's records from `position`; `files`: only those files' (a download_part job's
        share of a stdlib or local source, kiln.data.raw_scatter)."""
        self.records = 0
        if self.spec.kind == "hf":
            from kiln.data.hub import open_stream  # imports datasets: slow, and only this kind needs it

            self._stream = open_stream(self.spec)
            if position:
                self._stream.load_state_dict(position["stream"])
                self.records = position["records"]
            items = self._hf_documents()
        else:
            self.records = position["records"] if position else 0
            # Local files are cheap to read again: skip what was read; only a stream resumes in place.
            documents = KINDS[self.spec.kind](self, self.files() if files is None else files)
            items = itertools.islice(documents, self.records, None)
        for item in items:
            self.records += 1
            yield item

    def decode(self, data: bytes, where: str) -> str | None:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self._invalid(where, exc.start, data)

    def read_file(self, path: Path) -> str | Utf8Text | None:
        """A whole file as text; above BIG_TEXT_BYTES kept as its bytes (Utf8Text), checked chunk-wise."""
        data = path.read_bytes()
        if len(data) <= BIG_TEXT_BYTES:
            return self.decode(data, str(path))
        bad = first_invalid_byte(data)
        return Utf8Text(data) if bad is None else self._invalid(str(path), bad, data)

    def _invalid(self, where: str, offset: int, data: bytes) -> None:
        if self.invalid_utf8 == "fail":
            raise KilnError(
                f"{where}: not valid UTF-8 (byte {offset}: {data[offset : offset + 1]!r}); "
                "set download.invalid_utf8: skip to skip such records"
            )
        log.warning("skipping %s: not valid UTF-8", where)
        return None

    def document(self, doc_id: str, text: object, where: str, path: str, repo: object = None) -> Document:
        if not isinstance(text, str):
            raise KilnError(f"{where}: column {self.spec.text_column!r} holds {type(text).__name__}, expected a string")
        if repo is not None and not isinstance(repo, str):
            raise KilnError(f"{where}: column {self.spec.repo_column!r} holds {type(repo).__name__}, expected a string")
        return Document(doc_id, text, path, self.spec.name, repo or None)

    def _hf_documents(self) -> Iterator[Document]:
        spec = self.spec
        text_col, path_col, repo_col = spec.text_column, spec.path_column, spec.repo_column
        for row, record in enumerate(self._stream, start=self.records):
            where = f"source {spec.name!r}: dataset {spec.dataset!r} row {row}"
            if text_col not in record:
                raise KilnError(f"{where}: no column {text_col!r}; columns present: {', '.join(record)}")
            path = record.get(path_col) if path_col else spec.dataset
            yield self.document(
                f"{spec.name}/{spec.dataset}#{row}",
                record.get(text_col),
                where,
                str(path),
                record.get(repo_col) if repo_col else None,
            )


def _stdlib_files(spec: Source) -> list[Path]:
    root = stdlib_root()
    return sorted(
        {
            p
            for pattern in spec.include
            for p in root.glob(pattern)
            if p.is_file() and "site-packages" not in p.parts and "__pycache__" not in p.parts
        }
    )


def _stdlib_documents(reader: SourceReader, files: Sequence[Path]) -> Iterator[Document | None]:
    spec, root = reader.spec, stdlib_root()
    for path in files:
        text = reader.read_file(path)
        rel = path.relative_to(root).as_posix()
        yield None if text is None else Document(f"{spec.name}/{rel}", text, rel, spec.name)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Files named by paths, directories (every file below, sorted) or glob patterns, in order."""
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise KilnError(f"download: local path pattern {pattern!r} matches no file")
        for match in map(Path, matches):
            if match.is_dir():
                files.extend(sorted(p for p in match.rglob("*") if p.is_file()))
            elif match.is_file():
                files.append(match)
            else:
                raise KilnError(f"download: local path {str(match)!r} does not exist")
    return files


def _missing_column(path: Path, row: object, column: str, present: list[str]) -> KilnError:
    where = f"{path}: row {row}" if row is not None else str(path)
    return KilnError(f"{where}: no column {column!r}; columns present: {', '.join(present) or '(none)'}")


def _json_records(path: Path, reader: SourceReader) -> Iterator[dict | None]:
    """The records of a .jsonl file (one per line) or a .json file holding a list."""
    if path.suffix == ".json" and _first_non_space(path) == b"[":
        text = reader.decode(path.read_bytes(), str(path))
        yield from ([None] if text is None else _parse_json(text, str(path)))
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                text = reader.decode(line, f"{path}: line {number}")
                yield None if text is None else _parse_json(text, f"{path}: line {number}")


def _first_non_space(path: Path) -> bytes:
    """The first byte after any leading whitespace (b"" for an empty file): a JSON list may be indented."""
    with open(path, "rb") as f:
        while (byte := f.read(1)).isspace():
            pass
    return byte


def _parse_json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KilnError(f"{where}: not valid JSON: {exc}") from None


def _row_documents(path: Path, reader: SourceReader) -> Iterator[Document | None]:
    spec = reader.spec
    columns = [spec.text_column, *(c for c in (spec.path_column, spec.repo_column) if c)]
    if path.suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        present = parquet.schema_arrow.names
        for column in columns:
            if column not in present:
                raise _missing_column(path, None, column, present)
        records = (r for batch in parquet.iter_batches(columns=columns, batch_size=256) for r in batch.to_pylist())
    else:
        records = _json_records(path, reader)
    for row, record in enumerate(records):
        if record is None:
            yield None
            continue
        if not isinstance(record, dict) or any(c not in record for c in columns):
            present = list(record) if isinstance(record, dict) else [type(record).__name__]
            raise _missing_column(path, row, next(c for c in columns if c not in present), present)
        doc_path = record[spec.path_column] if spec.path_column else path.as_posix()
        repo = record[spec.repo_column] if spec.repo_column else None
        yield reader.document(
            f"{spec.name}/{path.as_posix()}#{row}",
            record[spec.text_column],
            f"{path}: row {row}",
            str(doc_path),
            repo,
        )


def _local_documents(reader: SourceReader, files: Sequence[Path]) -> Iterator[Document | None]:
    name = reader.spec.name
    for path in files:
        if path.suffix in ROW_FILE_SUFFIXES:
            yield from _row_documents(path, reader)
        else:
            text = reader.read_file(path)
            yield None if text is None else Document(f"{name}/{path.as_posix()}", text, path.as_posix(), name)


KINDS = {"stdlib": _stdlib_documents, "local": _local_documents}
FILES = {"stdlib": _stdlib_files, "local": lambda spec: expand_paths(spec.paths)}


# --- the download stage's output, read back (written by kiln.data.raw) ---------------------------------


def part_paths(raw_dir: Path, manifest: dict) -> list[tuple[str, Path]]:
    """(source name, path) of every part, in manifest order."""
    return [
        (name, Path(raw_dir) / name / part["file"])
        for name, source in manifest["sources"].items()
        for part in source["parts"]
    ]


def raw_part_count(raw_dir: str | Path) -> int:
    """How many parts a finished download folder holds (the pretokenize stage's scatter width)."""
    return len(part_paths(Path(raw_dir), read_json(Path(raw_dir) / "manifest.json")))


def read_part(path: Path, big_bytes: int | None = None) -> list[Document]:
    """The documents of one part; texts above big_bytes as Utf8Text over the Arrow buffer (held once)."""
    table = pq.read_table(path)
    ids, metas = table.column("id").to_pylist(), table.column("metadata").to_pylist()
    texts = texts_of(table.column("text"), big_bytes)
    del table  # from here each text is held once: a Python string, or the Arrow bytes a Utf8Text keeps
    return [Document(i, t, m["path"], m["source"], m.get("repo")) for i, t, m in zip(ids, texts, metas)]


def read_rows(path: Path, rows: set[int], big_bytes: int | None = None) -> dict[int, Document]:
    """Some documents of a part by row, decoding only the row groups that hold them."""
    parquet = pq.ParquetFile(path)
    starts = [0]
    for group in range(parquet.num_row_groups):
        starts.append(starts[-1] + parquet.metadata.row_group(group).num_rows)
    groups = sorted({bisect.bisect_right(starts, row) - 1 for row in rows})
    docs = {}
    for group in groups:
        table = parquet.read_row_group(group)
        ids, metas = table.column("id").to_pylist(), table.column("metadata").to_pylist()
        texts = texts_of(table.column("text"), big_bytes)
        for offset, (i, t, m) in enumerate(zip(ids, texts, metas)):
            if starts[group] + offset in rows:
                docs[starts[group] + offset] = Document(i, t, m["path"], m["source"], m.get("repo"))
    return docs


def read_part_column(path: Path, column: str) -> list:
    return pq.read_table(path, columns=[column]).column(column).to_pylist()


def iter_parts(raw_dir: Path, manifest: dict, big_bytes: int | None = None) -> Iterator[list[Document]]:
    """The download stage's parts back as lists of documents, in manifest order (one part in memory)."""
    for _, path in part_paths(raw_dir, manifest):
        yield read_part(path, big_bytes)


def read_documents(raw_dir: Path, manifest: dict, big_bytes: int | None = None) -> Iterator[Document]:
    """Every document of a download stage's output, in manifest order (texts above big_bytes as Utf8Text)."""
    for part in iter_parts(raw_dir, manifest, big_bytes):
        yield from part
