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

Not scattered, read and checked by the gather as one job reads them (the plan's log says which, and why):
- streams that cannot be cut by file: one data file, a builder other than parquet's (json rows are
  counted only by reading them);
- sources with a budget (max_rows, max_bytes): the budget counts the documents kept after
  deduplication against everything before, so no share knows where its source stops, and a share
  past that point would be checked for nothing.

A part folder holds verdicts.parquet and part.json (the plan's stamp and the counts): the gather
takes a part only if its stamp is the plan's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from kiln.config.data_sections import DownloadSection, Source
from kiln.data import faults
from kiln.data.sources import SourceReader
from kiln.data.verdicts import write_verdicts
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.layout import ScatterPlan

log = logging.getLogger("kiln.download")

VERDICTS, PART_JSON = "verdicts.parquet", "part.json"


def not_scattered(spec: Source) -> str | None:
    """Why the download job reads this source itself, before any file is listed; None when the
    plan may cut it (see the module's note)."""
    if spec.max_rows is not None or spec.max_bytes is not None:
        return "it has a budget (max_rows, max_bytes)"
    return None


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


def _shares(files: list[tuple[str, int, int | None]], share_bytes: int) -> list[dict]:
    """The files (name, bytes, rows or None) in reading order, cut after each run reaching share_bytes
    (a file is never split); for a stream's files each share says the stream's row it starts at."""
    shares, current, size, row = [], [], 0, 0
    for name, nbytes, rows in files:
        if not current:
            shares.append({"files": current} if rows is None else {"files": current, "first_row": row})
        current.append(name)
        size += nbytes
        row += rows or 0
        if size >= share_bytes:
            current, size = [], 0
    return shares


def _source_files(spec: Source) -> tuple[list[tuple[str, int, int | None]], str | None]:
    """The source's files in reading order, each (name, bytes, rows: a stream's, else None); or none
    and why the download job reads it whole."""
    why = not_scattered(spec)
    if why is not None:
        return [], why
    reader = SourceReader(spec)
    if reader.reads_files:
        return [(str(path), path.stat().st_size, None) for path in reader.files()], None
    return reader.split()


def download_plan(cfg: DownloadSection) -> ScatterPlan:
    """One stamp per download_part job: its source, its files in reading order (and a stream's first
    row), the checks' key."""
    stamps = []
    for spec in cfg.sources:
        files, why = _source_files(spec)
        if why is not None:
            log.info("download_plan: source %r is read by the download job: %s", spec.name, why)
            continue
        key = _checks_key(spec, cfg)
        for share in _shares(files, int(cfg.scatter_mb * 2**20)):
            stamps.append({"source": spec.name, "checks": key, **share})
    return ScatterPlan(stamps)


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
    counts = write_verdicts(spec, cfg, stamp, Path(out_dir) / VERDICTS)
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


def part_verdicts(cfg: DownloadSection, plan: ScatterPlan, part_dirs: list[Path]) -> dict[str, list[Path]]:
    """Per scattered source, its parts' verdict files in reading order, each checked against the
    plan (the gather's input to kiln.data.raw.write_raw)."""
    if len(part_dirs) != plan.parts:
        raise KilnError(f"download: {len(part_dirs)} part folders given, the plan has {plan.parts}")
    keys = {spec.name: _checks_key(spec, cfg) for spec in cfg.sources}
    planned = {stamp["source"] for stamp in plan.stamps if keys.get(stamp["source"]) == stamp["checks"]}
    verdicts: dict[str, list[Path]] = {name: [] for name in planned}
    for index, (stamp, folder) in enumerate(zip(plan.stamps, map(Path, part_dirs))):
        made = read_json(folder / PART_JSON)["stamp"] if (folder / PART_JSON).is_file() else None
        if made != stamp or stamp["source"] not in planned:
            raise KilnError(
                f"download: {folder} is not part {index} of this plan (made for {made and made['source']!r}, "
                f"planned {stamp['source']!r}); rerun its download_part job"
            )
        verdicts[stamp["source"]].append(folder / VERDICTS)
    return verdicts
