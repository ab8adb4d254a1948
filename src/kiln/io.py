"""Crash-safe file output and small helpers for the artifacts every stage writes.

Every artifact is written under a temporary name beside its final path and renamed into place only
when complete, so a job killed half-way leaves nothing a rerun could mistake for a finished output.
A temporary name carries its writer's host and pid (`.NAME.tmp-HOST-PID`), so a later run can tell
a dead writer's leftovers, which `remove_dead_temps` deletes, from those of a writer still running;
`atomic_dir` deletes those of its own folder before writing it again (a stage killed mid-output).
A full disk is a KilnError naming the path, with nothing replaced and no temporary left.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

from kiln.errors import KilnError

_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # the host is absent in older names


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a folder's entries, to the device."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(folder)


@contextlib.contextmanager
def _disk_full_is_an_error(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
        raise KilnError(
            f"{path}: no space left on the device ({free / 2**20:,.0f} MiB free) while writing "
            f"it; nothing was replaced; free some space and rerun"
        ) from exc


@contextlib.contextmanager
def atomic_file(path: str | Path, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path; on success it is renamed to `path`, on error removed. durable: the
    data and the rename are fsynced before returning (what a resume will trust after a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        with _disk_full_is_an_error(path):
            yield tmp
            if durable:
                fsync_path(tmp)
            os.replace(tmp, path)
            if durable:
                fsync_path(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | Path, durable: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces `path` whole, on error is removed.
    durable: every file and folder in it, and the rename, are fsynced before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path.parent, path.name)  # a killed earlier attempt's half-written folder
    tmp = _tmp_sibling(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with _disk_full_is_an_error(path):
            yield tmp
            if durable:
                _fsync_tree(tmp)
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
            if durable:
                fsync_path(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_dead_temps(folder: str | Path, name: str | None = None) -> list[Path]:
    """Delete the temporary files and folders directly in `folder` (only those for the final name
    `name`, when given) whose writer, on this host, is no longer running; return them. A temp of a
    live process (this one included) or of another host is left alone: it may still be being written."""
    folder, host, removed = Path(folder), socket.gethostname(), []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _TMP.match(entry.name)
        if not match or match["host"] not in (None, host) or process_alive(int(match["pid"])):
            continue
        if name is not None and match["name"] != name:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (this one included; another user's counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def last_json_line(path: str | Path, tail_bytes: int = 1 << 16) -> dict | None:
    """The last complete JSON line of a .jsonl file that jobs append to (metrics.jsonl, jobs.jsonl),
    None when there is none: a torn last line (a job killed mid-write) and the partial first line of
    the tail read are skipped. Only the last tail_bytes are read, since such a file grows all run."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - tail_bytes))
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of the parts' string forms, identical across processes and machines
    (unlike built-in hash(), which is salted per process)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def benchmark_seconds(path: str | Path) -> float | None:
    """The wall time (`s` column) of a Snakemake benchmark file: a header line, then one line per
    repeat; None when it is absent or unreadable."""
    try:
        return float(Path(path).read_text().splitlines()[1].split("\t")[0])
    except (OSError, IndexError, ValueError):
        return None
