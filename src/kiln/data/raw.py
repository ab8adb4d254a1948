"""The download stage's output: every source's documents, cleaned, as parquet parts plus a manifest.

Layout: raw/<source>/part-NNNNN.parquet (id, text, metadata{path, source, repo}) and raw/manifest.json
(rows, bytes and sha256 per part; per source, what was skipped and why).

Cleaning, in this order, each drop counted in the manifest: records that are not UTF-8 (or a clear
error, by `invalid_utf8`), documents without a non-space character, documents outside
[min_doc_bytes, max_doc_bytes] (UTF-8 bytes), exact duplicates of an earlier document of any
source (sha256 of the text), the source's quality filters (kiln.data.quality: each counted by name,
with up to EXAMPLES examples), documents sharing an n-gram with HumanEval (kiln.data.decontaminate),
and near duplicates of an earlier kept document of any source
(kiln.data.near_dup). A source's budgets (max_rows, max_bytes) count the documents it keeps.
The checks of one document alone are kiln.data.verdicts' (made here as each record is read, or
replayed from the download_part jobs' files for a scattered source, kiln.data.raw_scatter); the
duplicates and budgets, which depend on what came before, are decided here, in order.

Resumable: parts go to a staging folder beside the output (.<name>.partial) and a progress file
records, after each complete part, where the source's reading stands. A network failure is retried
from the last complete part with exponential backoff; a rerun after a kill resumes there too (when
the download section is unchanged); the finished folder is renamed into place, so the output never
exists half written. A part never splits the files of one repository (consecutive documents with
the same repo) unless it has to, so grouping by repository can work one part at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.config.data_sections import DownloadSection, Source
from kiln.data import faults
from kiln.data.near_dup import NearDupIndex, threshold
from kiln.data.sources import Document, transient
from kiln.data.utf8text import BIG_TEXT_BYTES, string_column, texts_of, utf8_size
from kiln.data.verdicts import EARLY, CheckingReader, Verdict, VerdictReader, digest_and_size
from kiln.errors import KilnError
from kiln.io import atomic_file, read_json, remove_dead_temps, sha256_file, write_json

log = logging.getLogger("kiln.download")

PART_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("metadata", pa.struct([("path", pa.string()), ("source", pa.string()), ("repo", pa.string())])),
    ]
)
PART_MAX_BYTES = 64 << 20  # a part is cut early when its text reaches this size
REPO_PART_FACTOR = 8  # ... and inside a repository only past this many times rows_per_part
ROW_GROUP_ROWS, ROW_GROUP_BYTES = 128, 8 << 20
PROGRESS = "progress.json"
FORMAT = 3  # staged parts of another format are never resumed
EXAMPLES = 3  # dropped documents the manifest names per filter and source


@dataclasses.dataclass
class Counts:
    rows: int = 0
    bytes: int = 0
    skipped_non_utf8: int = 0
    skipped_empty: int = 0
    skipped_short: int = 0
    skipped_long: int = 0
    skipped_duplicate: int = 0
    skipped_contaminated: int = 0
    skipped_near_duplicate: int = 0
    skipped_filter: dict[str, int] = dataclasses.field(default_factory=dict)  # quality filter -> documents
    examples: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # filter or near_duplicate -> [{id, why}]

    def snapshot(self) -> Counts:
        """A copy that later counting leaves alone (its dicts copied too)."""
        examples = {reason: list(shown) for reason, shown in self.examples.items()}
        return dataclasses.replace(self, skipped_filter=dict(self.skipped_filter), examples=examples)

    def drop(self, reason: str, doc_id: str, why: str) -> None:
        """Count a document a quality filter or the near-duplicate index dropped, keeping the first examples."""
        if reason == "near_duplicate":
            self.skipped_near_duplicate += 1
        elif reason == "contaminated":
            self.skipped_contaminated += 1
        else:
            self.skipped_filter[reason] = self.skipped_filter.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES:
            shown.append({"id": doc_id, "why": why})


def _fingerprint(cfg: DownloadSection) -> str:
    return hashlib.sha256(json.dumps([FORMAT, cfg.as_dict()], sort_keys=True).encode()).hexdigest()


def _row_groups(sizes: list[int]) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most ROW_GROUP_ROWS rows and, unless one row is more,
    ROW_GROUP_BYTES: a very long document gets a row group of its own, so a reader of its neighbours
    never decodes it."""
    groups, start, size = [], 0, 0
    for row, n in enumerate(sizes):
        if row > start and (row - start >= ROW_GROUP_ROWS or size + n > ROW_GROUP_BYTES):
            groups.append((start, row))
            start, size = row, 0
        size += n
    return groups + [(start, len(sizes))]


def _write_part(docs: list[Document], path: Path) -> dict:
    table = pa.table(
        {
            "id": [d.id for d in docs],
            "text": string_column([d.text for d in docs]),
            "metadata": [{"path": d.path, "source": d.source, "repo": d.repo} for d in docs],
        },
        schema=PART_SCHEMA,
    )
    sizes = [utf8_size(d.text) for d in docs]
    with atomic_file(path) as tmp:
        # No dictionary or statistics: for unique long texts they would put whole documents in the
        # footer and cost another copy when read.
        with pq.ParquetWriter(
            tmp, PART_SCHEMA, compression="zstd", use_dictionary=False, write_statistics=False
        ) as writer:
            for start, end in _row_groups(sizes):
                writer.write_table(table.slice(start, end - start), row_group_size=end - start)
        faults.kill_point("download")  # KILN_DATA_FAULT: killed with the part unpublished
    return {"file": path.name, "rows": len(docs), "bytes": sum(sizes), "sha256": sha256_file(path)}


def _named(spec: Source) -> str:
    return f"download: source {spec.name!r} ({spec.kind})"


class _SourceWriter:
    """Streams one source into staged parts, saving progress after each; resumes from the last one."""

    def __init__(
        self,
        spec: Source,
        cfg: DownloadSection,
        staging: Path,
        progress: dict,
        seen: set[int] | None,
        near: NearDupIndex | None,
        verdicts: list[Path | dict] | None = None,
    ):
        self.spec, self.cfg, self.staging, self.progress, self.seen = spec, cfg, staging, progress, seen
        self.near, self.verdicts = near, verdicts
        self.entry = progress["sources"][spec.name]
        (staging / spec.name).mkdir(parents=True, exist_ok=True)

    def reader(self) -> CheckingReader | VerdictReader:
        """The source's records with their verdicts: read and checked here, or replayed from the
        download_part jobs' files when the source was scattered."""
        if self.verdicts is None:
            return CheckingReader(self.spec, self.cfg)
        return VerdictReader(self.spec, self.cfg, self.verdicts)

    def run(self) -> None:
        attempts = 0
        while not self.entry["done"]:
            parts_before = len(self.entry["parts"])
            try:
                self._stream()
            except Exception as exc:
                if not transient(self.spec, exc):  # a stream's network failure (its kind says)
                    raise
                attempts = 1 if len(self.entry["parts"]) > parts_before else attempts + 1
                if attempts > self.cfg.retries:
                    raise KilnError(
                        f"{_named(self.spec)}: network failure, gave up after {attempts} "
                        f"attempts (download.retries={self.cfg.retries}): {exc}"
                    ) from exc
                delay = self.cfg.retry_backoff_s * 2 ** (attempts - 1)
                log.warning(
                    "%s: %s; retrying from part %d in %.1f s (attempt %d of %d)",
                    _named(self.spec),
                    exc,
                    len(self.entry["parts"]),
                    delay,
                    attempts + 1,
                    self.cfg.retries + 1,
                )
                time.sleep(delay)

    def _reject(self, doc: Document | None, verdict: Verdict, counts: Counts) -> bool:
        """Whether a record is dropped before the budgets (counted here): by its own checks, or as an
        exact duplicate of an earlier document."""
        if verdict.reason in EARLY:
            setattr(counts, f"skipped_{verdict.reason}", getattr(counts, f"skipped_{verdict.reason}") + 1)
        elif self.seen is not None and verdict.digest in self.seen:
            counts.skipped_duplicate += 1
        elif verdict.reason is not None:
            counts.drop(verdict.reason, doc.id, verdict.why)
        else:
            return False
        return True

    def _stream(self) -> None:
        spec, entry, rows_per_part = self.spec, self.entry, self.cfg.rows_per_part
        counts = Counts(**entry["counts"]).snapshot()
        last = (entry["position"], counts.snapshot())  # where reading stands after batch[-1]
        batch: list[Document] = []
        digests: list[int] = []
        keys: list[int] = []  # the near-duplicate index's, for the documents of the unwritten part
        batch_bytes = 0

        def flush() -> None:
            nonlocal batch_bytes
            path = self.staging / spec.name / f"part-{len(entry['parts']):05d}.parquet"
            entry["parts"].append(_write_part(batch, path))
            entry["position"], entry["counts"] = last[0], dataclasses.asdict(last[1])
            write_json(self.staging / PROGRESS, self.progress)
            log.info("source %s: part %d written (%d documents)", spec.name, len(entry["parts"]) - 1, len(batch))
            batch.clear()
            digests.clear()
            keys.clear()
            batch_bytes = 0

        reader = self.reader()
        try:
            for doc, verdict in reader.read(entry["position"]):
                if self._reject(doc, verdict, counts):
                    continue
                digest, size = verdict.digest, verdict.size
                if spec.max_bytes is not None and counts.rows and counts.bytes + size > spec.max_bytes:
                    break
                key = None
                if self.near is not None:
                    match, key = self.near.admit_signature(verdict.minhash, doc.id)
                    if match is not None:
                        counts.drop("near_duplicate", doc.id, f"near duplicate of {match or 'an earlier document'}")
                        continue
                full = len(batch) >= rows_per_part or batch_bytes >= PART_MAX_BYTES
                same_repo = batch and doc.repo is not None and doc.repo == batch[-1].repo
                if full and (not same_repo or len(batch) >= REPO_PART_FACTOR * rows_per_part):
                    flush()
                batch.append(doc)
                digests.append(digest)
                if key is not None:  # after any flush: the key belongs to the part this document joins
                    keys.append(key)
                if self.seen is not None:
                    self.seen.add(digest)
                batch_bytes += size
                counts.rows += 1
                counts.bytes += size
                last = (reader.position(), counts.snapshot())
                if spec.max_rows is not None and counts.rows >= spec.max_rows:
                    break
        except BaseException:
            if self.seen is not None:
                self.seen.difference_update(digests)  # they will be read again from the last part
            if self.near is not None:
                self.near.forget(keys)
            raise
        if batch:
            flush()
        entry["counts"] = dataclasses.asdict(counts)
        entry["done"] = True
        write_json(self.staging / PROGRESS, self.progress)
        if not entry["parts"]:
            raise KilnError(
                f"{_named(spec)} produced no documents (skipped "
                f"{counts.skipped_empty} empty, {counts.skipped_non_utf8} non-UTF-8, {counts.skipped_short} "
                f"short, {counts.skipped_long} long, {counts.skipped_duplicate} duplicate, "
                f"{counts.skipped_near_duplicate} near-duplicate, filtered {counts.skipped_filter}); check its "
                "paths, include patterns or dataset, or its quality filters (download.filters)"
            )


def _start_progress(staging: Path, cfg: DownloadSection) -> dict:
    """The staged progress of an earlier attempt at this same download section, or a fresh start."""
    fingerprint = _fingerprint(cfg)
    if (staging / PROGRESS).exists():
        progress = read_json(staging / PROGRESS)
        if progress.get("fingerprint") == fingerprint:
            done = sum(len(s["parts"]) for s in progress["sources"].values())
            log.info("resuming an interrupted download: %d complete parts kept in %s", done, staging)
            # A part the killed writer had not renamed yet would otherwise be moved into the output.
            for folder in [staging, *(p for p in staging.iterdir() if p.is_dir())]:
                for dead in remove_dead_temps(folder):
                    log.info("removed %s, left by a writer that died mid-part", dead)
            return progress
        log.info("the download section changed since %s was staged: starting over", staging)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return {"fingerprint": fingerprint, "sources": {}}


def _staged_index(cfg: DownloadSection, staging: Path, progress: dict) -> tuple[set[int] | None, NearDupIndex | None]:
    """The exact and near-duplicate indexes of every document already staged, in download order,
    for deduplication across a resume (None for one that is off)."""
    seen = set() if cfg.dedup else None
    near = NearDupIndex(cfg.near_dup) if cfg.near_dup.enabled else None
    for name, entry in progress["sources"].items():
        for part in entry["parts"]:
            table = pq.read_table(staging / name / part["file"], columns=["id", "text"])
            for doc_id, text in zip(table.column("id").to_pylist(), texts_of(table.column("text"), BIG_TEXT_BYTES)):
                if seen is not None:
                    seen.add(digest_and_size(text)[0])
                if near is not None and isinstance(text, str):  # as check signed them
                    near.admit(text, doc_id)
    return seen, near


def write_raw(cfg: DownloadSection, out_dir: Path, verdicts: dict[str, list[Path | dict]] | None = None) -> dict:
    """Run the download section `cfg` into out_dir (replaced whole at the end); return the manifest.
    `verdicts`: per scattered source, its download_part jobs' verdict files in reading order, then any
    share the plan left to the gather (kiln.data.raw_scatter: checked here if its budget reaches it);
    the other sources are read and checked here."""
    verdicts = verdicts or {}
    out_dir = Path(out_dir)
    staging = out_dir.parent / f".{out_dir.name}.partial"
    progress = _start_progress(staging, cfg)
    seen, near = _staged_index(cfg, staging, progress)
    try:
        for spec in cfg.sources:
            progress["sources"].setdefault(
                spec.name, {"parts": [], "position": None, "counts": dataclasses.asdict(Counts()), "done": False}
            )
            _SourceWriter(spec, cfg, staging, progress, seen, near, verdicts.get(spec.name)).run()
    except BaseException:
        if not any(s["parts"] for s in progress["sources"].values()):
            shutil.rmtree(staging, ignore_errors=True)  # nothing worth resuming
        raise
    sources = {}
    for spec in cfg.sources:
        entry = progress["sources"][spec.name]
        sources[spec.name] = {"kind": spec.kind, "spec": spec.as_dict(), "parts": entry["parts"], **entry["counts"]}
    manifest = {
        "sources": sources,
        "rows": sum(s["rows"] for s in sources.values()),
        "bytes": sum(s["bytes"] for s in sources.values()),
        "dedup": cfg.dedup,
        "near_dup": {**cfg.near_dup.as_dict(), "num_perm": cfg.near_dup.bands * cfg.near_dup.rows}
        | ({"threshold": round(threshold(cfg.near_dup), 3)} if cfg.near_dup.enabled else {}),
        "filters": cfg.filters.as_dict(),
        "decontaminate": cfg.decontaminate.as_dict(),
    }
    write_json(staging / "manifest.json", manifest)
    (staging / PROGRESS).unlink()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(staging, out_dir)
    return manifest
