"""The download stage as a scatter: a plan, one download_part job per share of the input, a gather.

- The plan (`download_plan`, a Snakemake checkpoint) lists the files of each source, in reading order,
  and cuts them into shares of about `download.scatter_mb` MB of input: the files of a kind that reads
  files (stdlib, local), or the data files of a stream that can be read a file range at a time (an hf
  dataset of parquet files, resolved to a commit: kiln.data.source_kinds.hf.reader.split_files), each
  range with the stream's row it starts at, so its documents get the ids one job gives them.
- Each download_part job (`write_part`) runs the order-free checks on its share's records
  (kiln.data.verdicts: UTF-8, size, quality filters, HumanEval decontamination, content hash and
  MinHash), nearly all of the stage's time, and stores the verdicts.
- The gather (`part_verdicts`, then kiln.data.raw.write_raw) replays every source in order through
  the ordered decisions (exact and near duplicates, budgets), so it writes the bytes one job writes.

A source with a budget (max_rows, max_bytes) stops where the documents it keeps after deduplication
against everything before reach it, which no share knows: its part jobs check the shares the budget
is expected to reach (kiln.data.raw_reach), the plan leaves the rest to the gather (ScatterPlan.gather),
and the gather reads and checks any of those the budget does reach, so the estimate changes no byte.

Not scattered, read and checked by the gather as one job reads them (the plan's log says which, and
why): streams that cannot be cut by file (one data file; a builder other than parquet's, whose rows are
counted only by reading them).

A part folder holds verdicts.parquet and part.json (the plan's stamp and the counts): the gather
takes a part only if its stamp is the plan's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Callable, TypeVar

from kiln.config.data_sections import DownloadSection, Source
from kiln.data import faults, raw_reach
from kiln.data.raw_reach import File
from kiln.data.sources import SourceReader, transient
from kiln.data.verdicts import write_verdicts
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.layout import ScatterPlan

log = logging.getLogger("kiln.download")

VERDICTS, PART_JSON = "verdicts.parquet", "part.json"
T = TypeVar("T")


def _checks_key(spec: Source, cfg: DownloadSection) -> str:
    """A hash of what `kiln.data.verdicts.check` reads: a part checked under other settings is stale."""
    checks = {
        "source": spec.as_dict(),
        "filters": cfg.filters.as_dict(),
        "decontaminate": cfg.decontaminate.as_dict(),
        "near_dup": cfg.near_dup.as_dict(),
        "bytes": [cfg.min_doc_bytes, cfg.max_doc_bytes],
        "invalid_utf8": cfg.invalid_utf8,
    }
    return hashlib.sha256(json.dumps(checks, sort_keys=True).encode()).hexdigest()[:16]


def _shares(files: list[File], share_bytes: int) -> list[list[File]]:
    """The files in reading order, cut after each run reaching share_bytes (a file is never split)."""
    shares, current, size = [], [], 0
    for file in files:
        current.append(file)
        size += file.bytes
        if size >= share_bytes:
            shares.append(current)
            current, size = [], 0
    return shares + ([current] if current else [])


def _stamps(spec: Source, cfg: DownloadSection, shares: list[list[File]]) -> list[dict]:
    """A stamp per share: its source, the checks' key, its files, and a stream's row it starts at."""
    key, stamps, row = _checks_key(spec, cfg), [], 0
    for share in shares:
        stamp = {"source": spec.name, "checks": key, "files": [file.name for file in share]}
        if share[0].rows is not None:
            stamp["first_row"] = row
            row += sum(file.rows for file in share)
        stamps.append(stamp)
    return stamps


def _source_files(spec: Source) -> tuple[list[File], str | None]:
    """The source's files in reading order; or none, and why the download job reads it whole."""
    reader = SourceReader(spec)
    if reader.reads_files:
        return [File(str(path), path.stat().st_size, None) for path in reader.files()], None
    files, why = reader.split()
    return [File(*file) for file in files], why


def _retrying(spec: Source, cfg: DownloadSection, what: str, work: Callable[[], T]) -> T:
    """`work` again from its start after a network failure of the source's stream, download.retries
    times with download.retry_backoff_s doubling, as the one job retries from its last part."""
    attempt = 1
    while True:
        try:
            return work()
        except Exception as exc:
            if not transient(spec, exc) or attempt > cfg.retries:
                raise
            delay = cfg.retry_backoff_s * 2 ** (attempt - 1)
            attempt += 1
            log.warning("%s: source %r: %s; again in %.1f s (attempt %d)", what, spec.name, exc, delay, attempt)
            time.sleep(delay)


def download_plan(cfg: DownloadSection) -> ScatterPlan:
    """One stamp per download_part job: its source, its files in reading order (and a stream's first
    row), the checks' key; a budgeted source's shares past the budget's expected reach (kiln.data.raw_reach)
    are the gather's."""
    stamps, gather = [], []
    for spec in cfg.sources:
        files, why = _retrying(spec, cfg, "download_plan", lambda: _source_files(spec))
        if why is not None:
            log.info("download_plan: source %r is read by the download job: %s", spec.name, why)
            continue
        shares = _shares(files, int(cfg.scatter_mb * 2**20))
        planned = _stamps(spec, cfg, shares)
        checked = len(shares)
        if spec.max_rows is not None or spec.max_bytes is not None:
            kept = _retrying(spec, cfg, "download_plan", lambda: raw_reach.measure(spec, cfg, planned))
            checked = raw_reach.reach(spec, shares, kept)
            log.info(
                "download_plan: source %r: its budget is expected to reach %d of its %d shares; the download "
                "job checks any further one it reaches",
                spec.name,
                checked,
                len(shares),
            )
        stamps += planned[:checked]
        gather += planned[checked:]
    return ScatterPlan(stamps, gather)


def write_part(cfg: DownloadSection, plan: ScatterPlan, index: int, out_dir: Path) -> dict:
    """The download_part job for the plan's share `index`: its verdicts into out_dir (a fresh folder)."""
    if not 0 <= index < plan.parts:
        raise KilnError(f"download_part: part {index} is not in the plan ({plan.parts} parts)")
    stamp = plan.stamps[index]
    spec = next((s for s in cfg.sources if s.name == stamp["source"]), None)
    if spec is None or stamp["checks"] != _checks_key(spec, cfg):
        raise KilnError(
            f"download_part {index}: the plan was made for other download settings (source "
            f"{stamp['source']!r}); rerun download_plan"
        )
    counts = _retrying(
        spec, cfg, f"download_part {index}", lambda: write_verdicts(spec, cfg, stamp, Path(out_dir) / VERDICTS)
    )
    faults.kill_point("download_part")  # KILN_DATA_FAULT: killed with the verdicts written, part.json not
    write_json(Path(out_dir) / PART_JSON, {"stamp": stamp, **counts})
    log.info(
        "download_part %d: %d records of %d files checked, %d candidates",
        index,
        counts["records"],
        len(stamp["files"]),
        counts["candidates"],
    )
    return counts


def part_verdicts(cfg: DownloadSection, plan: ScatterPlan, part_dirs: list[Path]) -> dict[str, list[Path | dict]]:
    """Per scattered source, in reading order, its parts' verdict files, each checked against the
    plan, then the shares the plan left to the gather (its stamps: read and checked there if the
    budget reaches them). The gather's input to kiln.data.raw.write_raw."""
    if len(part_dirs) != plan.parts:
        raise KilnError(f"download: {len(part_dirs)} part folders given, the plan has {plan.parts}")
    keys = {spec.name: _checks_key(spec, cfg) for spec in cfg.sources}
    stale = [stamp["source"] for stamp in plan.stamps + plan.gather if keys.get(stamp["source"]) != stamp["checks"]]
    if stale:
        raise KilnError(
            f"download: the plan was made for other download settings (source {stale[0]!r}); rerun download_plan"
        )
    verdicts: dict[str, list[Path | dict]] = {stamp["source"]: [] for stamp in plan.stamps + plan.gather}
    for index, (stamp, folder) in enumerate(zip(plan.stamps, map(Path, part_dirs))):
        made = read_json(folder / PART_JSON)["stamp"] if (folder / PART_JSON).is_file() else None
        if made != stamp:
            raise KilnError(
                f"download: {folder} is not part {index} of this plan (made for {made and made['source']!r}, "
                f"planned {stamp['source']!r}); rerun its download_part job"
            )
        verdicts[stamp["source"]].append(folder / VERDICTS)
    for stamp in plan.gather:
        verdicts[stamp["source"]].append(stamp)
    return verdicts
