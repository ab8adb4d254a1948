"""Copies of every complete checkpoint off the node as it is written (train.checkpoint_mirror), made
in the background on rank 0 so that training never waits for them.

Why: a node's local disk is lost with the node, and copying a finished run's checkpoints by hand
costs GPU time (seed 000 spent half an hour copying 12 GB after its smoke run, then ran rclone in a
loop beside training). The setting is one string, either

- a folder (local, or a mount of other storage): checkpoint step-NNNNNNN is copied to
  <folder>/<run>/step-NNNNNNN under a temporary name and renamed into place once whole
  (kiln.io.atomic_dir, fsynced), and only then is <folder>/<run>/LATEST moved to it; so the mirror
  never holds a partial checkpoint under a checkpoint's name, and a run resumes from it
  (KILN_RESUME_FROM=<folder>/<run>/step-NNNNNNN) or eval reads it as from the node's copy; or
- a command, recognised by `{src}` in it, run by the shell once per checkpoint with {src} (the
  checkpoint folder, named step-NNNNNNN), {name} (step-NNNNNNN) and {run} substituted,
  shell-quoted, e.g. `rclone copy {src} remote:kiln/{run}/{name}`. Whether the target ever shows
  a partial copy is the command's business; a copy that lacks a file fails complete.json's check
  and is never loaded.

Only complete checkpoints are handed over: kiln.train.checkpoint.Saver calls `submit` once a folder
is renamed into place and LATEST moved. Its files are first hard-linked into a snapshot beside the
train folder's files (.mirror-step-NNNNNNN.tmp-<host>-<pid>/step-NNNNNNN, no bytes copied), so the
checkpoint may be pruned (train.keep_checkpoints) while its copy runs; a filesystem without hard
links copies from the checkpoint itself. One copy runs at a time; a checkpoint that arrives while
another waits replaces it (the skipped one is logged), so the mirror is at most one checkpoint
behind, never a growing queue.

A failed copy (a non-zero exit, an OSError, a full target) is a warning in the train log, a count
in metrics.jsonl (`mirror_failures`, this job's so far, only once there is one) and a line in
train/mirror.jsonl (kiln.layout.MIRROR_LOG: one per copy, done or failed); training goes on. When
the run ends `close` waits for the last copy, at most FINAL_WAIT_S, after every rank has left the
process group (kiln.train.trainer.run), so no rank waits for it in a collective. A job stopped by preemption does
not wait (its time is nearly up): the next job copies the newest checkpoint when mirror.jsonl does
not show it copied (`catch_up`).

The mirror keeps everything it was given: pruning applies to the node's disk only, and nothing here
deletes from the mirror (it is the run's history; prune it by hand). A checkpoint of the same name
copied again (after a KILN_RESUME_FROM rollback, or a trajectory started over) replaces the older copy.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from kiln import layout
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.io import atomic_dir, atomic_file, remove_dead_temps
from kiln.train import checkpoint

log = logging.getLogger("kiln.train")
FINAL_WAIT_S = 1800.0  # at the end of the run: the final checkpoint is the one most worth having off the node
KEY = "train.checkpoint_mirror"


class Mirror:
    """train.checkpoint_mirror for the run whose train folder is train_dir. Disabled (every method a
    no-op) when the setting is null or on ranks other than 0."""

    def __init__(self, target: str | None, train_dir: Path, run: str):
        self.target, self.train_dir, self.run = target, Path(train_dir), run
        self.command = target is not None and "{src}" in target
        self.failures = 0
        self._cond = threading.Condition()
        self._waiting: tuple[str, Path, Path | None] | None = None  # (name, what to copy, its snapshot)
        self._busy = self._closing = False
        self._thread: threading.Thread | None = None
        if self.command:
            try:
                target.format(src="s", name="n", run="r")
            except (KeyError, IndexError, ValueError) as exc:
                raise KilnError(
                    f"{KEY}: {target!r} is a command (it names {{src}}) whose other placeholders "
                    f"can only be {{name}} and {{run}} ({type(exc).__name__}: {exc})"
                ) from None
        elif target is not None and ("{" in target or "}" in target):
            raise KilnError(
                f"{KEY}: {target!r} has a placeholder but no {{src}}: a command must name the "
                "checkpoint folder as {src}; a folder is a plain path"
            )

    @classmethod
    def of(cls, train: TrainSection, train_dir: Path, *, rank: int) -> "Mirror":
        """The mirror of train.checkpoint_mirror on rank 0; a disabled one elsewhere. The run's name is
        its folder's (train_dir is results/<run>/train: kiln.layout)."""
        target = train.checkpoint_mirror
        return cls(target if rank == 0 else None, train_dir, Path(train_dir).resolve().parent.name)

    @property
    def enabled(self) -> bool:
        return self.target is not None

    def describe(self) -> str:
        return self.target if self.command else str(Path(self.target) / self.run)

    def submit(self, folder: Path) -> None:
        """Copy the complete checkpoint `folder` in the background. Never raises: it is called from the
        checkpoint writer (the training thread, or the async save's), which must not fail for it."""
        if not self.enabled:
            return
        folder = Path(folder)
        try:
            snapshot = self._snapshot(folder)
        except OSError as exc:
            self._failed(folder.name, 0.0, f"could not read the checkpoint ({exc})")
            return
        source = snapshot / folder.name if snapshot is not None else folder
        with self._cond:
            if self._waiting is not None:
                name, _, old = self._waiting
                log.warning("checkpoint mirror: %s skipped, %s came before its copy could start", name, folder.name)
                self._record({"name": name, "ok": False, "skipped": True})
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
            self._waiting = (folder.name, source, snapshot)
            self._closing = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="kiln-mirror", daemon=True)
                self._thread.start()  # a daemon: a preempted job exits without waiting for its copy
            self._cond.notify_all()

    def catch_up(self, ckpt_root: Path) -> None:
        """Copy the newest complete checkpoint under ckpt_root unless mirror.jsonl shows it copied (the
        previous job was stopped, or its copy failed)."""
        if not self.enabled:
            return
        found = checkpoint.kept(ckpt_root)
        if found and found[-1][1].name not in self._copied():
            log.info("checkpoint mirror: %s is not in %s yet; copying it", found[-1][1].name, self.describe())
            self.submit(found[-1][1])

    def events(self) -> dict:
        """For a metrics.jsonl record: this job's failed copies so far, once there is one."""
        return {"mirror_failures": self.failures} if self.failures else {}

    def close(self, timeout_s: float = FINAL_WAIT_S) -> bool:
        """Wait for the copy in flight and the one waiting, at most timeout_s; whether they are done."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._busy or self._waiting is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning(
                        "checkpoint mirror: still copying to %s after %.0f s; not waiting longer "
                        "(the next train job copies the newest checkpoint if this copy is lost)",
                        self.describe(),
                        timeout_s,
                    )
                    return False
                self._cond.wait(left)
            self._closing = True  # the worker ends; a later submit starts another
            self._cond.notify_all()
        return True

    # -- the worker thread ------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closing:
                    self._cond.wait()
                if self._waiting is None:
                    self._thread = None
                    return
                (name, source, snapshot), self._waiting = self._waiting, None
                self._busy = True
            start = time.monotonic()
            try:
                self._copy(name, source)
                took = time.monotonic() - start
                self._record({"name": name, "ok": True, "seconds": round(took, 3)})
                log.info("checkpoint %s mirrored to %s (%.1f s)", name, self.describe(), took)
            except Exception as exc:  # anything: a copy's failure must never reach training
                self._failed(name, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
            finally:
                if snapshot is not None:
                    shutil.rmtree(snapshot, ignore_errors=True)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _copy(self, name: str, source: Path) -> None:
        if self.command:
            cmd = self.target.format(
                src=shlex.quote(str(source.resolve())), name=shlex.quote(name), run=shlex.quote(self.run)
            )
            done = subprocess.run(cmd, shell=True, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if done.returncode != 0:
                said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
                raise RuntimeError(
                    f"`{cmd}` exited with status {done.returncode}" + (f": {' | '.join(said)}" if said else "")
                )
            return
        dest = Path(self.target) / self.run
        with atomic_dir(dest / name, durable=True) as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        with atomic_file(dest / checkpoint.MARKER, durable=True) as tmp:
            tmp.write_text(name + "\n", encoding="utf-8")

    def _snapshot(self, folder: Path) -> Path | None:
        """Hard links to the checkpoint's files (they are never written again) under a temporary
        name that a later job removes if this one dies (kiln.io.remove_dead_temps); None where the
        filesystem cannot link, and the copy then reads the checkpoint itself."""
        outer = self.train_dir / f".mirror-{folder.name}.tmp-{socket.gethostname()}-{os.getpid()}"
        remove_dead_temps(self.train_dir, f"mirror-{folder.name}")
        shutil.rmtree(outer, ignore_errors=True)
        try:
            shutil.copytree(folder, outer / folder.name, copy_function=os.link)
        except OSError as exc:
            shutil.rmtree(outer, ignore_errors=True)
            if not (folder / checkpoint.MANIFEST).is_file():
                raise
            log.info("checkpoint mirror: no hard links here (%s); copying from the checkpoint itself", exc)
            return None
        return outer

    def _failed(self, name: str, seconds: float, why: str) -> None:
        with self._cond:  # from the worker, or from submit on the checkpoint writer's thread
            self.failures += 1
        self._record({"name": name, "ok": False, "seconds": round(seconds, 3), "error": why[:2000]})
        log.warning(
            "checkpoint mirror: %s NOT copied to %s: %s (failure %d of this job; training goes on, see %s)",
            name,
            self.describe(),
            why,
            self.failures,
            self.train_dir / layout.MIRROR_LOG,
        )

    def _record(self, entry: dict) -> None:
        try:
            with open(self.train_dir / layout.MIRROR_LOG, "a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(), "target": self.describe(), **entry}) + "\n")
        except OSError as exc:
            log.warning("checkpoint mirror: could not record in %s: %s", self.train_dir / layout.MIRROR_LOG, exc)

    def _copied(self) -> set[str]:
        try:
            lines = (self.train_dir / layout.MIRROR_LOG).read_text(encoding="utf-8").splitlines()
        except OSError:
            return set()
        copied = set()
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill
            if entry.get("ok") and entry.get("target") == self.describe():
                copied.add(entry["name"])
        return copied
