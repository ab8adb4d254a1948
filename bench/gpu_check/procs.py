"""How the GPU check (bench/gpu_check) runs each check: in a forked process of its own, under a time
budget, and with everything it started ended before the next check starts, whatever the check did.

Why not the check's process group or session alone: torch elastic (torchrun, which the pipeline and
the two-rank check start through kiln.train.launch) starts every rank with start_new_session=True,
so a rank is in neither its torchrun's process group nor its session. os.killpg of the check's group
ends the check and torchrun and leaves the ranks running, orphaned, holding the GPU the next check
needs (tests/bench/test_gpu_check.py shows a grandchild in a session of its own surviving killpg). So the
checks' parent makes itself a child subreaper (Linux prctl): a descendant orphaned by its parent's
death is reparented to it, not to init, and stays findable by parentage. Ending a check means: every
descendant of this process that was not there before the check, found by walking /proc parent links
(and, where prctl is missing, the check's session too), stopped first (SIGSTOP: a stopped process
can neither fork nor exit, so none escapes between two scans), rescanned until no new one appears,
then killed (SIGKILL) and reaped. A check that ended by itself gets the same sweep, so a rank it
leaked is not left holding the GPU either.

What a check yields (its table rows, each the moment it is known) is written to its result file as
it comes, so a check stopped over budget, crashed or interrupted keeps the rows it finished
(Outcome.items) and loses only the one it was at and those after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux 3.4+); False where unavailable."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, int, str]]:
    """{pid: (parent pid, session id, state)} of every process /proc shows (state Z: a zombie)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def descendants(root: int, sessions: set[int] = frozenset()) -> set[int]:
    """Live (not zombie) processes below `root` by parent links, and those in `sessions`."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found |= {pid for pid, (_, sid, _) in table.items() if sid in sessions}
    return {pid for pid in found if pid != root and table.get(pid, (0, 0, "Z"))[2] != "Z"}


def end_all(spare: set[int], sessions: set[int] = frozenset(), unreaped: set[int] = frozenset()) -> list[int]:
    """Stop, then kill, every descendant of this process not in `spare` (and any in `sessions`);
    reap those that are (or became) its own children, but those in `unreaped` (multiprocessing
    reaps its own). Returns the pids killed."""
    me, stopped = os.getpid(), set()
    while True:  # stop until a scan finds nothing new: a stopped process forks no more
        new = descendants(me, sessions) - spare - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid, (ppid, _, state) in process_table().items():  # ours, by birth or adoption: reap them
        if ppid == me and pid not in spare | unreaped and (pid in stopped or state == "Z"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return sorted(stopped)


@dataclass
class Outcome:
    """What a run_isolated call left: the items run() yielded, each kept as it came, and why it
    stopped short of its end (None: it returned)."""

    items: list = field(default_factory=list)
    why: str | None = None
    interrupted: bool = False  # this process got SIGINT or SIGTERM while the check ran


def _child(run: Callable[[], Iterable], result: Path, log: Path) -> None:
    """In the forked process: a session of its own, output to `log`, each item run() yields as a JSON
    line of `result` the moment it comes (a later item's hang or crash does not lose it), then
    {"done": true}, or {"error": ...} if run() raised."""
    os.setsid()
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    sys.stderr = sys.stdout
    with open(result, "w", buffering=1) as out:  # line-buffered: each line is the file's as it is written
        try:
            for item in run():
                out.write(json.dumps({"item": item}) + "\n")
            out.write(json.dumps({"done": True}) + "\n")
        except BaseException as exc:  # noqa: BLE001 -- reported as the check's FAIL
            traceback.print_exc()
            first_line = (str(exc).splitlines() or [""])[0][:160]
            out.write(json.dumps({"error": f"{type(exc).__name__}: {first_line}"}) + "\n")


def run_isolated(
    run: Callable[[], Iterable], result: Path, log: Path, budget_s: float, progress: Path | None = None
) -> Outcome:
    """run() in a forked process given `budget_s` seconds, then everything it started ended (module
    docstring): what it yielded up to its end, or up to its overrun, crash or interruption, with why.
    `progress`, if the check wrote it, is a file of "<seconds in>\\t<what it was doing>" lines: the
    last one goes into the reason of a check over budget."""
    become_subreaper()
    result.unlink(missing_ok=True)
    before = descendants(os.getpid())  # e.g. multiprocessing's helpers: not the check's to end
    start = time.monotonic()
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(run, result, log))
    proc.start()
    interrupted = None
    try:
        proc.join(max(budget_s, 0.0))
    except KeyboardInterrupt as exc:  # SIGTERM too (__main__): the items so far are kept all the same
        interrupted = f"interrupted ({exc or 'SIGINT'})"
    finally:
        over = proc.is_alive()  # over budget, or this process interrupted
        end_all(before, {proc.pid}, {proc.pid})  # the check if still running, and whatever it left behind
        proc.join()
    lines = [json.loads(line) for line in result.read_text().splitlines()] if result.exists() else []
    items = [line["item"] for line in lines if "item" in line]
    errors = [line["error"] for line in lines if "error" in line]
    if interrupted:
        return Outcome(items, interrupted, interrupted=True)
    if over:
        last = progress.read_text().splitlines()[-1:] if progress and progress.exists() else []
        at = "; last: {1} (at {0} s)".format(*last[0].split("\t", 1)) if last and "\t" in last[0] else ""
        return Outcome(
            items, f"over its {budget_s:.0f} s budget after {time.monotonic() - start:.0f} s{at} (log: {log})"
        )
    if errors:
        return Outcome(items, f"{errors[0]} (log: {log})")
    if not any("done" in line for line in lines):
        return Outcome(items, f"crashed, exit code {proc.exitcode} (log: {log})")
    return Outcome(items)
