"""How far a budgeted source's budget is expected to reach into its shares of files (the download
scatter's plan, kiln.data.raw_scatter): download_part jobs check the shares it is expected to reach,
and the gather reads and checks any further share the budget does reach, so the estimate changes no
byte, only which job checks a share.

The estimate: the plan checks the source's first records (SAMPLE_RECORDS, or SAMPLE_BYTES of text,
from its first share on) and measures the documents and bytes its own checks keep per byte of text; a
share's text is its files' size (a stream's: its rows at the sample's mean record size), times the
source's sample; a share is checked while the shares before it are expected to keep less than
REACH_MARGIN times the budget. Deduplication, which depends on every document before, is left out of
the estimate: it only keeps fewer, which the margin and the gather cover.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from kiln.config.data_sections import DownloadSection, Source
from kiln.data.sources import Document, SourceReader
from kiln.data.utf8text import utf8_size
from kiln.data.verdicts import Verdict, check

REACH_MARGIN = 1.25
SAMPLE_RECORDS, SAMPLE_BYTES = 1000, 4 << 20


class File(NamedTuple):
    name: str  # a path, or a stream's data file (a path or an hf:// URL)
    bytes: int
    rows: int | None  # a stream's rows; None for a kind that reads files


class Kept(NamedTuple):
    """What the source's own checks keep per byte of text (documents, bytes), and its mean record size."""

    docs_per_byte: float
    bytes_per_byte: float
    record_bytes: float


def measure(spec: Source, cfg: DownloadSection, stamps: list[dict]) -> Kept | None:
    """The kept rates of the source's first records, read from its first shares (`stamps`) on; None
    when the sample keeps nothing (no estimate: every share is checked by a part job)."""
    records = text = docs = kept = 0
    for doc, verdict in _checked(spec, cfg, stamps):
        records += 1
        text += _text_bytes(doc, verdict)
        if verdict.reason is None:
            docs, kept = docs + 1, kept + verdict.size
        if records >= SAMPLE_RECORDS or text >= SAMPLE_BYTES:
            break
    return Kept(docs / text, kept / text, text / records) if kept else None


def _checked(spec: Source, cfg: DownloadSection, stamps: list[dict]) -> Iterator[tuple[Document | None, Verdict]]:
    for stamp in stamps:
        for doc in SourceReader(spec, cfg.invalid_utf8).read_share(stamp["files"], stamp.get("first_row")):
            yield doc, check(doc, spec, cfg)


def _text_bytes(doc: Document | None, verdict: Verdict) -> int:
    """A record's text bytes, whatever its verdict (an early one does not measure them)."""
    if doc is None or verdict.size:
        return verdict.size
    try:
        return utf8_size(doc.text)
    except UnicodeEncodeError:  # a lone surrogate: its characters will do for an estimate
        return len(doc.text)


def reach(spec: Source, shares: list[list[File]], kept: Kept | None) -> int:
    """How many of the source's shares, in order, download_part jobs check: those the shares before
    are expected to keep under REACH_MARGIN x the budget."""
    if kept is None:
        return len(shares)
    fraction = 1.0 if spec.sample is None else spec.sample  # share sizes count every record, sampled or not
    docs = size = 0.0
    for index, share in enumerate(shares):
        if (spec.max_rows is not None and docs >= REACH_MARGIN * spec.max_rows) or (
            spec.max_bytes is not None and size >= REACH_MARGIN * spec.max_bytes
        ):
            return index
        text = fraction * sum(f.bytes if f.rows is None else f.rows * kept.record_bytes for f in share)
        docs += text * kept.docs_per_byte
        size += text * kept.bytes_per_byte
    return len(shares)
