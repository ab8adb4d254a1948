"""Checkpoints that continue a run exactly; a resume takes the newest one that is complete and reads.

A checkpoint is a folder step-NNNNNNN/ holding state.pt (model, optimizer, step, tokens seen, each
rank's RNG states, the data loader's position, the loss-spike detector and a fingerprint of what the
run trains on) and, written last, complete.json: the step, the fingerprint, and each file's size and
sha256. The folder is written under a temporary name, every file and the folder fsynced, then renamed
into place; only then does the LATEST marker (fsynced too) move to it. So a kill at any moment leaves
the previous checkpoint as it was, and a full disk is a KilnError with no temporary left.

A resume does not trust LATEST (a run killed between the rename and the marker, or a lost marker,
would otherwise restart from an older step or from scratch): it takes the newest folder whose
complete.json is there and whose files match it; a torn or unreadable one is skipped with a log line
and the one before it tried. A checkpoint asked for by name (KILN_RESUME_FROM, or eval's
`load_weights`) is an error when it does not read. A checkpoint of another run (kiln.train.fingerprint:
model, tokenizer, shards, seed, global batch) is an error naming what differs. Pruning keeps the
newest `keep` complete checkpoints up to the one just written, so the newest complete checkpoint is
never removed; folders past it (an unreadable one that was skipped, or the history a
KILN_RESUME_FROM rollback discarded) are removed.

This module alone knows that layout: the eval stage lists a run's checkpoints with `kept` and reads
one's weights with `load_weights`. Every read unpickles with weights_only=True (tensors and plain
containers only, so a checkpoint file cannot run code when loaded), allowing the three NumPy types
that the saved NumPy RNG state is made of.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from kiln.errors import KilnError
from kiln.io import atomic_dir, atomic_file, fsync_path, sha256_file, write_json
from kiln.io import remove_dead_temps as _remove_dead_temps
from kiln.train.faults import NONE, Faults
from kiln.train.fingerprint import require_same

log = logging.getLogger("kiln.checkpoint")
MARKER = "LATEST"
STATE = "state.pt"
MANIFEST = "complete.json"
RESUME_ENV = "KILN_RESUME_FROM"
_NAME = re.compile(r"step-(\d+)")
# np.random.get_state() is ("MT19937", uint32 array, pos, has_gauss, gauss): the globals its pickle
# names (an array pickles as _reconstruct, found this way under NumPy 1 and 2 alike). Nothing else in
# a checkpoint needs more than weights_only's defaults.
NUMPY_RNG_GLOBALS = [np.empty(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


class Unreadable(Exception):
    """A checkpoint folder that is torn or does not load (why, in the message)."""


def rng_state() -> dict:
    """This process's generators, its own GPU's only: get_rng_state_all would create a CUDA context
    on every other GPU of the node (hundreds of MB each) from every rank."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device, set by init_distributed
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def step_name(step: int) -> str:
    return f"step-{step:07d}"


def save(root: Path, state: dict, keep: int, faults: Faults = NONE) -> Path:
    """Write state as root/step-NNNNNNN (complete.json last, all fsynced), point LATEST at it, keep
    the newest `keep` complete checkpoints up to it."""
    name = step_name(state["step"])
    with atomic_dir(root / name, durable=True) as tmp:
        torch.save(state, tmp / STATE)
        fsync_path(tmp / STATE)
        faults.during_save(state["step"])
        write_json(tmp / MANIFEST, {"step": state["step"], "fingerprint": state["fingerprint"],
                                    "files": {STATE: {"bytes": (tmp / STATE).stat().st_size,
                                                      "sha256": sha256_file(tmp / STATE)}}})
    with atomic_file(root / MARKER, durable=True) as tmp:
        tmp.write_text(name + "\n", encoding="utf-8")
    for old in _prunable(root, name, keep):
        log.info("checkpoint %s removed (%s)", old, "past the one just written" if old.name > name else "pruned")
        shutil.rmtree(old)
    log.info("checkpoint %s saved", root / name)
    return root / name


def _prunable(root: Path, name: str, keep: int) -> list[Path]:
    folders = sorted(p for p in root.glob("step-*") if p.is_dir() and _NAME.fullmatch(p.name))
    upto = [p for p in folders if p.name <= name and _complete(p) is None]
    kept_names = {p.name for p in upto[-keep:]} | {name}
    return [p for p in folders if p.name not in kept_names]


def remove_dead_temps(root: Path) -> None:
    """Delete what writers that died mid-save left under root (rank 0 calls it before a resume)."""
    for path in _remove_dead_temps(root):
        log.info("removed %s, left by a writer that died mid-save", path)


def load_latest(root: Path, fingerprint: dict | str, requested: str | Path | None = None) -> dict | None:
    """The state of the newest complete, readable checkpoint under root (or of `requested`, a folder
    or a step-NNNNNNN name under root), or None when there is none; an error if it belongs to another
    run, or if every complete checkpoint is unreadable."""
    root = Path(root)
    if requested:
        folder = Path(requested) if Path(requested).is_dir() or "/" in str(requested) else root / requested
        try:
            state = _load(folder)
        except Unreadable as exc:
            raise KilnError(f"{folder}: the checkpoint asked for ({RESUME_ENV}) is unusable: {exc}") from exc
        return _same_run(state, folder, fingerprint, root)
    candidates = sorted((p for p in root.glob("step-*") if p.is_dir() and _NAME.fullmatch(p.name)), reverse=True)
    for folder in candidates:
        try:
            state = _load(folder)
        except Unreadable as exc:
            log.warning("checkpoint %s skipped: %s; trying the one before it", folder, exc)
            continue
        return _same_run(state, folder, fingerprint, root)
    finished = [p.name for p in candidates if (p / MANIFEST).exists()]
    if finished:  # the run did save, and none of it reads: never silently start again from step 0
        raise KilnError(f"{root}: no checkpoint there reads ({', '.join(finished)}: see the warnings above); "
                        f"move them away to start over, or set {RESUME_ENV} to one to see why")
    return None


def _same_run(state: dict, folder: Path, fingerprint: dict | str, root: Path) -> dict:
    require_same(state["fingerprint"], fingerprint, str(folder / STATE), root)  # names what changed
    return state


def kept(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the complete checkpoints under root (complete.json there, every file of the
    size it records), by step; none when root is absent. Cheap: no file is read."""
    found = []
    for folder in Path(root).glob("step-*"):
        match = _NAME.fullmatch(folder.name)
        if match and folder.is_dir() and _complete(folder) is None:
            found.append((int(match.group(1)), folder))
    return sorted(found)


def load_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(model state dict on CPU, {step, tokens}) of the checkpoint in `folder`, for inference. The
    file is memory-mapped, so the optimizer state (twice the weights) is never read from disk (nor
    hashed: the sizes are checked)."""
    folder = Path(folder)
    try:
        state = _load(folder, verify_hash=False, mmap=True)
    except Unreadable as exc:
        raise KilnError(f"{folder}: checkpoint unusable: {exc}") from exc
    return state["model"], {"step": int(state["step"]), "tokens": int(state["tokens_seen"])}


def _complete(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint, or None when it is."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (never finished)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} unreadable ({exc})"
    if _NAME.fullmatch(folder.name) and int(_NAME.fullmatch(folder.name).group(1)) != manifest.get("step"):
        return f"{MANIFEST} is step {manifest.get('step')}'s, not this folder's (a copy under another name?)"
    for name, entry in files.items():
        path = folder / name
        size = path.stat().st_size if path.is_file() else None
        if size != entry["bytes"]:
            return f"{name} is {'missing' if size is None else f'{size} bytes'}, {MANIFEST} says {entry['bytes']}"
    return None


def _load(folder: Path, verify_hash: bool = True, mmap: bool = False) -> dict:
    why = _complete(folder)
    if why is not None:
        raise Unreadable(why)
    if verify_hash:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        for name, entry in files.items():
            if sha256_file(folder / name) != entry["sha256"]:
                raise Unreadable(f"{name}'s sha256 differs from the one {MANIFEST} recorded")
    try:
        with torch.serialization.safe_globals(NUMPY_RNG_GLOBALS):
            return torch.load(folder / STATE, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torn zip, a foreign pickle, an I/O error: all mean "cannot resume from it"
        raise Unreadable(f"{STATE} does not load ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
