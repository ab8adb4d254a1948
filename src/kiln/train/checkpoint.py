"""Checkpoints that continue a run exactly, found by a marker rather than by the highest number.

A checkpoint is a folder step-NNNNNNN/ holding state.pt: model, optimizer, step, tokens seen, RNG
states, the data loader's position and a fingerprint of what the run trains on. It is written under
a temporary name and renamed when complete; only then does the LATEST marker (itself replaced
atomically) point at it. A resume reads LATEST, so a half-written folder is never taken, and refuses
a checkpoint whose fingerprint (model shape, data, seed, world size) differs from the run's.

This module alone knows that layout: the eval stage lists a run's checkpoints with `kept` and reads
one's weights with `load_weights`. Every read unpickles with weights_only=True (tensors and plain
containers only, so a checkpoint file cannot run code when loaded), allowing the three NumPy types
that the saved NumPy RNG state is made of.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from kiln.errors import KilnError
from kiln.io import atomic_dir, atomic_file

log = logging.getLogger("kiln.checkpoint")
MARKER = "LATEST"
STATE = "state.pt"
# np.random.get_state() is ("MT19937", uint32 array, pos, has_gauss, gauss): the globals its pickle
# names (an array pickles as _reconstruct, found this way under NumPy 1 and 2 alike). Nothing else in
# a checkpoint needs more than weights_only's defaults.
NUMPY_RNG_GLOBALS = [np.empty(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: Path, state: dict, keep: int) -> Path:
    """Write state as root/step-NNNNNNN, point LATEST at it, keep the newest `keep` checkpoints."""
    name = f"step-{state['step']:07d}"
    with atomic_dir(root / name) as tmp:
        torch.save(state, tmp / STATE)
    with atomic_file(root / MARKER) as tmp:
        tmp.write_text(name + "\n", encoding="utf-8")
    # Prune by position relative to this checkpoint, not by name alone: folders past it are left
    # from a run killed before LATEST moved to them (this run redoes those steps), and counting them
    # among the newest `keep` would delete the checkpoint LATEST has just been pointed at.
    found = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in [p for p in found if p.name > name] + [p for p in found if p.name <= name][:-keep]:
        shutil.rmtree(old)
    log.info("checkpoint %s saved", root / name)
    return root / name


def load_latest(root: Path, fingerprint: str) -> dict | None:
    """The state LATEST points at, or None when there is none; errors if it belongs to another run."""
    marker = root / MARKER
    if not marker.exists():
        return None
    path = root / marker.read_text(encoding="utf-8").strip() / STATE
    if not path.exists():
        raise KilnError(f"{marker} points at {path.parent.name}, which is missing; delete {root} to start over")
    state = _read(path)
    if state["fingerprint"] != fingerprint:
        raise KilnError(
            f"{path}: checkpoint fingerprint {state['fingerprint'][:12]} does not match this run's "
            f"{fingerprint[:12]} (model, data, seed or world size changed); delete {root} to start over"
        )
    return state


def kept(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the complete checkpoints under root, by step; none when root is absent.
    Folders past the one LATEST names (left by a run killed before LATEST moved to them) are not
    counted: the run redid those steps."""
    root = Path(root)
    marker = root / MARKER
    latest = marker.read_text(encoding="utf-8").strip() if marker.exists() else None
    found = []
    for path in root.glob(f"step-*/{STATE}"):
        match = re.fullmatch(r"step-(\d+)", path.parent.name)
        if match and (latest is None or path.parent.name <= latest):
            found.append((int(match.group(1)), path.parent))
    return sorted(found)


def load_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(model state dict on CPU, {step, tokens}) of the checkpoint in `folder`, for inference. The
    file is memory-mapped, so the optimizer state (twice the weights) is never read from disk."""
    state = _read(Path(folder) / STATE, mmap=True)
    return state["model"], {"step": int(state["step"]), "tokens": int(state["tokens_seen"])}


def _read(path: Path, mmap: bool = False) -> dict:
    with torch.serialization.safe_globals(NUMPY_RNG_GLOBALS):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
