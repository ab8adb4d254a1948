"""The local kind's files (paths, directories and globs, in order) and their documents: a row file
(.jsonl, .json, .parquet) holds one per row, its columns named by text_column, path_column and
repo_column; any other file is one document, its path kept."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow.parquet as pq

from kiln.config.data_sections import Source
from kiln.data.sources import Document, SourceReader
from kiln.errors import KilnError

ROW_FILE_SUFFIXES = {".jsonl", ".json", ".parquet"}


def files(spec: Source) -> list[Path]:
    return expand_paths(spec.paths)


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


def read_files(reader: SourceReader, files: Sequence[Path]) -> Iterator[Document | None]:
    name = reader.spec.name
    for path in files:
        if path.suffix in ROW_FILE_SUFFIXES:
            yield from _row_documents(path, reader)
        else:
            text = reader.read_file(path)
            yield None if text is None else Document(f"{name}/{path.as_posix()}", text, path.as_posix(), name)
