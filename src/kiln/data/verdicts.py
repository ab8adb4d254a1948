"""What the download stage decides about one document on its own, apart from every other document.

The download's cleaning (kiln.data.raw) is two kinds of decision:
- order-free, one document at a time: is it UTF-8, empty, too short or long, what do the source's
  quality filters and the HumanEval decontamination say, its content hash and its MinHash. These are
  nearly all of the stage's time (the encoded-data patterns, the 13-gram scan, the shingles);
- ordered, against what was kept before it: exact and near duplicates, and the source's budgets.

`check` makes the first kind into a `Verdict`. The one download job checks each document as it reads
it; a scattered download (kiln.data.raw_scatter) checks each file range in its own download_part job
and stores the verdicts in a parquet file, and the gather replays them in order through the same
ordered decisions, so both write the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from rensa import RMinHash

from kiln.config.data_sections import DownloadSection, Source
from kiln.data.decontaminate import contamination
from kiln.data.near_dup import signature, signature_bytes, signature_of_bytes
from kiln.data.quality import first_failure
from kiln.data.sources import Document, SourceReader
from kiln.data.utf8text import BIG_TEXT_BYTES, Utf8Text, string_column, texts_of
from kiln.errors import KilnError
from kiln.io import atomic_file

log = logging.getLogger("kiln.download")

# Reasons a document is dropped before the ordered decisions, each a Counts field of kiln.data.raw.
EARLY = ("non_utf8", "empty", "short", "long")
_HASH_CHUNK = 1 << 20
_BATCH_ROWS = 256  # verdict rows read back at a time

VERDICT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),  # "" where the document is dropped whatever came before it
        ("path", pa.string()),
        ("repo", pa.string()),
        ("reason", pa.string()),
        ("why", pa.string()),
        ("digest", pa.uint64()),
        ("size", pa.int64()),
        ("minhash", pa.binary()),
    ]
)


@dataclass(frozen=True)
class Verdict:
    """One record's order-free checks. `reason`: an EARLY reason, a quality filter's name or
    "contaminated" (with `why`), or None for a document that only the ordered decisions may drop."""

    reason: str | None = None
    why: str = ""
    digest: int = 0  # the first 8 bytes of the text's sha256
    size: int = 0  # UTF-8 bytes
    minhash: RMinHash | None = None  # for the near-duplicate index: only where it is on and the text is checked


def digest_and_size(text: str | Utf8Text) -> tuple[int, int]:
    """A 64-bit content hash and the UTF-8 size of a text, encoded a slice at a time (a long document
    is not copied whole). Raises UnicodeEncodeError for lone surrogates."""
    digest = hashlib.sha256()
    if isinstance(text, Utf8Text):
        digest.update(text.data)
        return int.from_bytes(digest.digest()[:8], "little"), text.nbytes
    size = 0
    for start in range(0, len(text), _HASH_CHUNK):
        data = text[start : start + _HASH_CHUNK].encode("utf-8")
        digest.update(data)
        size += len(data)
    return int.from_bytes(digest.digest()[:8], "little"), size


def checked_text(doc: Document) -> str | None:
    """The text the quality filters, decontamination and near-duplicate index read; None for a
    document over BIG_TEXT_BYTES, held as bytes so that it is never copied whole as a str: those
    pass unchecked (exact deduplication still applies; download.max_doc_bytes bounds them)."""
    return None if isinstance(doc.text, Utf8Text) else doc.text


def check(doc: Document | None, spec: Source, cfg: DownloadSection) -> Verdict:
    """The order-free verdict on one record (None: a record that is not UTF-8, already skipped)."""
    if doc is None:
        return Verdict("non_utf8")
    try:
        digest, size = digest_and_size(doc.text)
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        if cfg.invalid_utf8 == "fail":
            raise KilnError(
                f"{doc.id}: text is not valid UTF-8 (a lone surrogate); set "
                "download.invalid_utf8: skip to skip such records"
            ) from None
        return Verdict("non_utf8")
    if doc.text.is_blank() if isinstance(doc.text, Utf8Text) else not doc.text.strip():
        return Verdict("empty")
    if size < cfg.min_doc_bytes:
        return Verdict("short")
    if cfg.max_doc_bytes is not None and size > cfg.max_doc_bytes:
        return Verdict("long")
    text = checked_text(doc)
    if text is None:
        return Verdict(None, "", digest, size)
    failure = first_failure(text, spec.quality, cfg.filters.as_dict())
    if failure is None and cfg.decontaminate.humaneval:
        why = contamination(text, cfg.decontaminate.ngram)
        failure = ("contaminated", why) if why else None
    if failure is not None:
        return Verdict(failure[0], failure[1], digest, size)
    minhash = signature(text, cfg.near_dup) if cfg.near_dup.enabled else None
    return Verdict(None, "", digest, size, minhash)


class CheckingReader:
    """A source's records, each with its verdict, checked as they are read (the one download job)."""

    def __init__(self, spec: Source, cfg: DownloadSection):
        self.spec, self.cfg = spec, cfg
        self.reader = SourceReader(spec, cfg.invalid_utf8)

    def position(self) -> dict:
        return self.reader.position()

    def read(self, position: dict | None) -> Iterator[tuple[Document | None, Verdict]]:
        for doc in self.reader.read(position):
            yield doc, check(doc, self.spec, self.cfg)


def write_verdicts(spec: Source, cfg: DownloadSection, share: dict, path: Path) -> dict[str, int]:
    """Check the records of `share` (kiln.data.raw_scatter's: files of the source `spec`, and the first
    row of a stream's range of files) into the parquet file `path`, in reading order; return how many
    records there were and how many are candidates."""
    reader = SourceReader(spec, cfg.invalid_utf8)
    with atomic_file(path) as tmp, pq.ParquetWriter(tmp, VERDICT_SCHEMA, compression="zstd") as writer:
        rows: list[tuple[Document | None, Verdict]] = []
        counts = {"records": 0, "candidates": 0}
        for doc in reader.read_share(share["files"], share.get("first_row")):
            verdict = check(doc, spec, cfg)
            rows.append((doc, verdict))
            counts["records"] += 1
            counts["candidates"] += verdict.reason is None
            if len(rows) == _BATCH_ROWS:
                writer.write_table(_verdict_table(rows))
                rows.clear()
        if rows or not counts["records"]:
            writer.write_table(_verdict_table(rows))
    return counts


def _verdict_table(rows: list[tuple[Document | None, Verdict]]) -> pa.Table:
    def kept(doc, verdict):  # the text only where the gather may write it into a part
        return doc.text if verdict.reason is None else ""

    return pa.table(
        {
            "id": [doc and doc.id for doc, _ in rows],
            "text": string_column([kept(doc, v) for doc, v in rows]),
            "path": [doc and doc.path for doc, _ in rows],
            "repo": [doc and doc.repo for doc, _ in rows],
            "reason": [v.reason for _, v in rows],
            "why": [v.why for _, v in rows],
            "digest": [v.digest for _, v in rows],
            "size": [v.size for _, v in rows],
            "minhash": [signature_bytes(v.minhash) for _, v in rows],
        },
        schema=VERDICT_SCHEMA,
    )


class VerdictReader:
    """A scattered source's records with their verdicts, in order: the download_part jobs' files one
    after another (the gather's replay), then any share the plan left to the gather (a budgeted
    source's past the budget's expected reach, kiln.data.raw_reach), read and checked here only if the
    budget reaches it. `position` counts records, as SourceReader's does."""

    def __init__(self, spec: Source, cfg: DownloadSection, segments: Sequence[Path | dict]):
        self.spec, self.cfg, self.segments = spec, cfg, list(segments)
        self.records = 0

    def position(self) -> dict:
        return {"records": self.records}

    def read(self, position: dict | None) -> Iterator[tuple[Document | None, Verdict]]:
        self.records = self._skip = position["records"] if position else 0  # a resumed gather skips those
        for segment in self.segments:
            yield from self._checked(segment) if isinstance(segment, dict) else self._replayed(Path(segment))

    def _checked(self, share: dict) -> Iterator[tuple[Document | None, Verdict]]:
        log.info(
            "source %s: its budget reaches past the plan's estimate: %s checked here", self.spec.name, share["files"]
        )
        for doc in SourceReader(self.spec, self.cfg.invalid_utf8).read_share(share["files"], share.get("first_row")):
            if self._skip:
                self._skip -= 1
                continue
            self.records += 1
            yield doc, check(doc, self.spec, self.cfg)

    def _replayed(self, path: Path) -> Iterator[tuple[Document | None, Verdict]]:
        parquet = pq.ParquetFile(path)
        if self._skip >= parquet.metadata.num_rows:  # a resumed gather passes whole files unread
            self._skip -= parquet.metadata.num_rows
            return
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS):
            if self._skip >= batch.num_rows:
                self._skip -= batch.num_rows
                continue
            start, self._skip = self._skip, 0
            yield from self._records(pa.Table.from_batches([batch]), start)

    def _records(self, table: pa.Table, start: int) -> Iterator[tuple[Document | None, Verdict]]:
        columns = {name: table.column(name).to_pylist() for name in VERDICT_SCHEMA.names if name != "text"}
        texts = texts_of(table.column("text"), BIG_TEXT_BYTES)
        for row in range(start, table.num_rows):
            doc_id, reason = columns["id"][row], columns["reason"][row]
            doc = (
                None
                if doc_id is None
                else Document(doc_id, texts[row], columns["path"][row], self.spec.name, columns["repo"][row])
            )
            minhash = signature_of_bytes(columns["minhash"][row], self.cfg.near_dup)
            verdict = Verdict(reason, columns["why"][row], columns["digest"][row], columns["size"][row], minhash)
            self.records += 1
            yield doc, verdict
