"""Where documents come from: each source reads its records in one fixed order, as its kind says.

The kinds (download.sources[].kind) are registered in kiln.data.source_kinds.registry, each a folder
kiln/data/source_kinds/<kind>/ whose reader.py turns its files or its stream into documents: stdlib (the
standard library's .py files), local (files on disk, and rows of .jsonl/.json/.parquet files), hf (a
Hugging Face dataset, streamed). docs/extending.md adds one.

A `SourceReader` yields one item per record: a `Document`, or None for a record that is not valid
UTF-8 and is skipped (or a KilnError naming it, when `invalid_utf8` is `fail`); a source with a
`sample` yields only the documents its sample keeps (`in_sample`, by id), before any check. A file above
BIG_TEXT_BYTES is kept as its bytes (kiln.data.utf8text), never also as a Python string. Its `position()` after
any item is a JSON-able point to resume reading from, so a download picks up after its last complete
part. Cleaning (empty, too short or long, duplicates) and budgets are the download writer's business
(kiln.data.raw); the helpers at the end read its parts back as documents, one part at a time.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import pyarrow.parquet as pq

from kiln.config.data_sections import Source
from kiln.data.source_kinds import registry as source_kinds
from kiln.data.utf8text import BIG_TEXT_BYTES, Utf8Text, first_invalid_byte, texts_of
from kiln.errors import KilnError
from kiln.io import read_json

log = logging.getLogger("kiln.download")


@dataclass(frozen=True)
class Document:
    id: str
    text: str | Utf8Text  # Utf8Text only for very long texts, and only where asked for
    path: str
    source: str
    repo: str | None = None


class Reader(Protocol):
    """What a kind's reader.py defines: either files (a kind that reads files) or a stream.

    A kind that reads files defines `files` and `read_files`. Its records are those of its files in
    order; a resumed read reads them again and skips those done, and download_part jobs may check
    shares of its files (kiln.data.raw_scatter).

    A kind that streams defines `open_stream` and `read_stream`; the stream has state_dict() and
    load_state_dict() (datasets.IterableDataset's), and a resumed read continues from the state
    recorded after the last complete part. It may also define `split_files` and `read_split`, when its
    stream is a list of files whose rows are known before reading: download_part jobs then read a
    range of them each. Either kind may define `transient`."""

    def files(self, spec: Source) -> list[Path]:
        """The files the source reads, in reading order."""

    def read_files(self, reader: SourceReader, files: Sequence[Path]) -> Iterator[Document | None]:
        """One item per record of `files` (a share of files(spec), or all of them), in order: a
        Document, or None for a record skipped as not valid UTF-8 (reader.read_file, reader.decode)."""

    def open_stream(self, spec: Source) -> Any:
        """The source's records as a resumable iterable (state_dict, load_state_dict)."""

    def read_stream(self, reader: SourceReader, stream: Any, start: int) -> Iterator[Document | None]:
        """One item per record of `stream`, numbered from `start` (the records read before a resume)."""

    def split_files(self, spec: Source) -> tuple[list[tuple[str, int, int]], str | None]:
        """Optional: the stream's files in order, each (path or URL, bytes, rows); or none, and why
        the stream cannot be read a file range at a time."""

    def read_split(self, reader: SourceReader, files: Sequence[str], first_row: int) -> Iterator[Document | None]:
        """Optional: one item per record of `files` (a range of split_files'), numbered from `first_row`
        as the whole stream numbers them."""

    def transient(self, exc: BaseException) -> bool:
        """Optional: whether a failure is worth another attempt (download.retries); otherwise none is."""


class SourceReader:
    """The records of one source, in order, from a resume position (None: the beginning)."""

    def __init__(self, spec: Source, invalid_utf8: str = "skip"):
        self.spec, self.invalid_utf8 = spec, invalid_utf8
        self.kind = source_kinds.get(spec.kind).reader
        self.records = 0
        self._stream = None  # a streaming kind's iterable (an hf source's datasets.IterableDataset), for its state

    @property
    def reads_files(self) -> bool:
        """Whether the source's kind reads files (else it streams): a resumed read rereads them and
        skips the records done, and download_part jobs may check shares of them (kiln.data.raw_scatter)."""
        return hasattr(self.kind, "files")

    def position(self) -> dict:
        state = {"records": self.records}
        if self._stream is not None:
            state["stream"] = self._stream.state_dict()
        return state

    def files(self) -> list[Path]:
        """The files a source of a kind that reads files reads, in reading order (its records follow them)."""
        return self.kind.files(self.spec)

    def read(self, position: dict | None = None, files: Sequence[Path] | None = None) -> Iterator[Document | None]:
        """The source's records from `position`; `files`: only those files' (a download_part job's
        share of the files, kiln.data.raw_scatter)."""
        self.records = position["records"] if position else 0
        if self.reads_files:
            # Files are cheap to read again: skip what was read; only a stream resumes in place.
            documents = self.kind.read_files(self, self.files() if files is None else files)
            items = itertools.islice(documents, self.records, None)
        else:
            self._stream = self.kind.open_stream(self.spec)
            if position:
                self._stream.load_state_dict(position["stream"])
            items = self.kind.read_stream(self, self._stream, self.records)
        yield from self._kept(items)

    def split(self) -> tuple[list[tuple[str, int, int]], str | None]:
        """A streaming kind's files, each (path or URL, bytes, rows), for download_part jobs to read
        a range of them each (read_share); or none, and why the stream is read whole."""
        if not hasattr(self.kind, "split_files"):
            return [], f"kind {self.spec.kind} streams in one order"
        return self.kind.split_files(self.spec)

    def read_share(self, files: Sequence[str], first_row: int | None = None) -> Iterator[Document | None]:
        """A download_part job's share (kiln.data.raw_scatter): some of the files of a kind that reads
        files, or a range of a stream's files (split) whose first row is `first_row` of the stream."""
        if self.reads_files:
            yield from self.read(None, [Path(f) for f in files])
            return
        self.records = first_row
        yield from self._kept(self.kind.read_split(self, files, first_row))

    def _kept(self, items: Iterator[Document | None]) -> Iterator[Document | None]:
        """The items the sample keeps, every record counted (the position counts records read)."""
        for item in items:
            self.records += 1
            if item is None or self.sampled(item.id):
                yield item

    def sampled(self, doc_id: str) -> bool:
        """Whether the source's sample keeps the document `doc_id` (every one without a sample)."""
        return self.spec.sample is None or in_sample(doc_id, self.spec.sample, self.spec.sample_seed or 0)

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
        """A row's document (local's row files, hf's rows), its text and repository columns checked."""
        if not isinstance(text, str):
            raise KilnError(f"{where}: column {self.spec.text_column!r} holds {type(text).__name__}, expected a string")
        if repo is not None and not isinstance(repo, str):
            raise KilnError(f"{where}: column {self.spec.repo_column!r} holds {type(repo).__name__}, expected a string")
        return Document(doc_id, text, path, self.spec.name, repo or None)


def in_sample(doc_id: str, fraction: float, seed: int) -> bool:
    """Whether a source's `sample` keeps `doc_id`: a 64-bit sha256 of the seed and the id, below the
    fraction. Its own prefix keeps it apart from the other hashes of ids (the validation split's), so the
    sample is not biased towards or away from the held-out documents."""
    digest = hashlib.sha256(f"kiln.sample\0{seed}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") < fraction * 2**64


def transient(spec: Source, exc: BaseException) -> bool:
    """Whether a failure reading the source is worth another attempt (download.retries): its kind's to
    say (a stream's network failure); never, for a kind that does not."""
    kind = source_kinds.get(spec.kind).reader
    return hasattr(kind, "transient") and kind.transient(exc)


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
