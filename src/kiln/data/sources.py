"""Where documents come from, and how they land on disk as parquet parts.

A source yields `Document`s in a deterministic order. Kinds:
- `stdlib`: the .py files of the standard library of the interpreter running Kiln (the default corpus:
  real code, present on every machine, no network);
- `local`: files, directories or globs; .jsonl/.json/.parquet rows (a text column), anything else one
  document per file with its path kept;
- `hf`: `datasets.load_dataset(..., streaming=True)`; also reads local files through builders such as
  `json` or `parquet` with `data_files`, which is how the tests exercise this path offline.

`write_source` stores a source as raw/<name>/part-NNNNN.parquet (id, text, metadata{path, source})
and returns its manifest entry (rows, bytes, sha256 per part).
"""

from __future__ import annotations

import glob
import json
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.errors import KilnError
from kiln.io import sha256_file, write_json

log = logging.getLogger("kiln.download")

ROW_FILE_SUFFIXES = {".jsonl", ".json", ".parquet"}
PART_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("metadata", pa.struct([("path", pa.string()), ("source", pa.string())])),
    ]
)


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    path: str
    source: str


@dataclass
class SourceStats:
    """Counts of what a source skipped, so a manifest says why it holds fewer documents than expected."""

    skipped_non_utf8: int = 0
    skipped_empty: int = 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _read_utf8(path: Path, stats: SourceStats) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        stats.skipped_non_utf8 += 1
        log.warning("skipping %s: not valid UTF-8", path)
        return None


def _stdlib_documents(spec: dict, stats: SourceStats) -> Iterator[Document]:
    root = stdlib_root()
    files = sorted(
        {
            p
            for pattern in spec["include"]
            for p in root.glob(pattern)
            if p.is_file() and "site-packages" not in p.parts and "__pycache__" not in p.parts
        }
    )
    for path in files:
        text = _read_utf8(path, stats)
        if text is not None:
            rel = path.relative_to(root).as_posix()
            yield Document(id=f"{spec['name']}/{rel}", text=text, path=rel, source=spec["name"])


def _expand_local(patterns: list[str]) -> list[Path]:
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


def _first_non_space(f) -> str:
    """The first character after any leading whitespace ('' at end of file): a JSON list may be indented."""
    while (char := f.read(1)).isspace():
        pass
    return char


def _rows_of(path: Path, text_column: str) -> Iterator[tuple[int, object]]:
    """(row number, text value) for each row of a json/jsonl/parquet file."""
    if path.suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        columns = parquet.schema_arrow.names
        if text_column not in columns:
            raise KilnError(
                f"{path}: no text column {text_column!r}; columns present: {', '.join(columns)}"
            )
        row = 0
        for batch in parquet.iter_batches(columns=[text_column], batch_size=1024):
            for value in batch.column(0).to_pylist():
                yield row, value
                row += 1
        return
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".json" and _first_non_space(f) == "[":
            f.seek(0)
            records = json.load(f)
        else:
            f.seek(0)
            records = (json.loads(line) for line in f if line.strip())
        for row, record in enumerate(records):
            if not isinstance(record, dict) or text_column not in record:
                present = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise KilnError(
                    f"{path}: row {row} has no text column {text_column!r}; present: {present}"
                )
            yield row, record[text_column]


def _local_documents(spec: dict, stats: SourceStats) -> Iterator[Document]:
    name = spec["name"]
    for path in _expand_local(spec["paths"]):
        if path.suffix in ROW_FILE_SUFFIXES:
            for row, text in _rows_of(path, spec["text_column"]):
                if not isinstance(text, str):
                    raise KilnError(
                        f"{path}: row {row} column {spec['text_column']!r} holds "
                        f"{type(text).__name__}, expected a string"
                    )
                yield Document(f"{name}/{path.as_posix()}#{row}", text, path.as_posix(), name)
        else:
            text = _read_utf8(path, stats)
            if text is not None:
                yield Document(f"{name}/{path.as_posix()}", text, path.as_posix(), name)


def _hf_documents(spec: dict, stats: SourceStats) -> Iterator[Document]:
    import datasets  # imported here: it is slow to import and only this kind needs it

    name, column = spec["name"], spec["text_column"]
    try:
        stream = datasets.load_dataset(
            spec["dataset"],
            name=spec.get("config"),
            split=spec["split"],
            data_files=spec.get("data_files"),
            streaming=True,
        )
    except Exception as exc:  # datasets raises many types for "cannot reach / cannot find"
        raise KilnError(f"download: source {name!r}: cannot open dataset {spec['dataset']!r}: {exc}") from exc
    for row, record in enumerate(stream):
        if spec.get("max_rows") is not None and row >= spec["max_rows"]:
            return
        if column not in record:
            raise KilnError(
                f"download: source {name!r}: dataset {spec['dataset']!r} has no text column "
                f"{column!r}; columns present: {', '.join(record)}"
            )
        if not isinstance(record[column], str):
            raise KilnError(
                f"download: source {name!r}: dataset {spec['dataset']!r} row {row} column {column!r} "
                f"holds {type(record[column]).__name__}, expected a string"
            )
        yield Document(f"{name}/{spec['dataset']}#{row}", record[column], spec["dataset"], name)


SOURCE_KINDS = {"stdlib": _stdlib_documents, "local": _local_documents, "hf": _hf_documents}


def iter_documents(spec: dict, stats: SourceStats) -> Iterator[Document]:
    """Documents of one source in order, without empty ones, stopping at its byte budget."""
    budget = spec.get("max_bytes")
    used = 0
    for doc in SOURCE_KINDS[spec["kind"]](spec, stats):
        if not doc.text.strip():
            stats.skipped_empty += 1
            continue
        size = len(doc.text.encode("utf-8"))
        if budget is not None and used > 0 and used + size > budget:
            return
        used += size
        yield doc


def _write_part(docs: list[Document], path: Path) -> dict:
    table = pa.table(
        {
            "id": [d.id for d in docs],
            "text": [d.text for d in docs],
            "metadata": [{"path": d.path, "source": d.source} for d in docs],
        },
        schema=PART_SCHEMA,
    )
    pq.write_table(table, path, compression="zstd")
    return {
        "file": path.name,
        "rows": len(docs),
        "bytes": sum(len(d.text.encode("utf-8")) for d in docs),
        "sha256": sha256_file(path),
    }


def write_source(spec: dict, out_dir: Path, rows_per_part: int) -> dict:
    """Write one source's documents as parquet parts under out_dir; return its manifest entry."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = SourceStats()
    parts: list[dict] = []
    batch: list[Document] = []

    def flush() -> None:
        parts.append(_write_part(batch, out_dir / f"part-{len(parts):05d}.parquet"))
        log.info("source %s: part %d written (%d documents)", spec["name"], len(parts) - 1, len(batch))
        batch.clear()

    for doc in iter_documents(spec, stats):
        batch.append(doc)
        if len(batch) == rows_per_part:
            flush()
    if batch:
        flush()
    if not parts:
        raise KilnError(
            f"download: source {spec['name']!r} ({spec['kind']}) produced no documents "
            f"(skipped {stats.skipped_empty} empty, {stats.skipped_non_utf8} non-UTF-8); "
            "check its paths, include patterns or dataset"
        )
    return {
        "kind": spec["kind"],
        "parts": parts,
        "rows": sum(p["rows"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
        "skipped_empty": stats.skipped_empty,
        "skipped_non_utf8": stats.skipped_non_utf8,
    }


def write_raw(specs: list[dict], out_dir: Path, rows_per_part: int) -> dict:
    """The download stage's output: one folder of parts per source, and manifest.json."""
    sources = {spec["name"]: write_source(spec, out_dir / spec["name"], rows_per_part) for spec in specs}
    manifest = {
        "sources": sources,
        "rows": sum(s["rows"] for s in sources.values()),
        "bytes": sum(s["bytes"] for s in sources.values()),
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest


def iter_parts(raw_dir: Path, manifest: dict) -> Iterator[list[Document]]:
    """The download stage's parts back as lists of documents, in manifest order (one part in memory)."""
    for name, source in manifest["sources"].items():
        for part in source["parts"]:
            table = pq.read_table(raw_dir / name / part["file"])
            ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
            metas = table.column("metadata").to_pylist()
            yield [Document(i, t, m["path"], m["source"]) for i, t, m in zip(ids, texts, metas)]


def read_documents(raw_dir: Path, manifest: dict) -> Iterable[Document]:
    """Every document of a download stage's output, in manifest order."""
    for part in iter_parts(raw_dir, manifest):
        yield from part
