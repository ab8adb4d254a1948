"""Checkpoints that continue a run exactly; a resume takes the newest one that is complete and reads.

A checkpoint is a folder step-NNNNNNN/ holding state.pt (step, tokens seen, each rank's RNG states,
the data loader's position, the loss-spike detector, a fingerprint of what the run trains on and the
LR of its last step, which train.init_from.warmup_from: source ramps from),
the model and optimizer, and, written last, complete.json: the step, the fingerprint, and each file's
size and sha256. The model and optimizer are in one of two formats (train.checkpoint_format):

- full: inside state.pt, whole, gathered onto rank 0, which writes the file alone.
- sharded: in shards/, torch.distributed.checkpoint's (DCP) files: every rank writes its own part
  (`__<rank>_0.distcp`) and rank 0 the index (`.metadata`). Nothing is gathered, and a load reshards
  onto the reading run's ranks and layout. With train.async_checkpoint the shards are copied to host
  memory at the save step and written by a background thread while training goes on (`Saver`).

Both are written the same way: under a temporary folder name (rank 0 makes it and tells the others),
every file and the folder fsynced, complete.json once every rank's files are in, then renamed into
place; only then does the LATEST marker (fsynced too) move to it. So a kill at any moment, an async
save still in flight included, leaves the previous checkpoint as it was, and a full disk is a
KilnError with no temporary left. A run reads either format whatever it writes.

A resume does not trust LATEST (a run killed between the rename and the marker, or a lost marker,
would otherwise restart from an older step or from scratch): it takes the newest folder whose
complete.json is there and whose files match it; a torn or unreadable one is skipped with a log line
and the one before it tried. On several ranks rank 0 alone does that, hashing each file once, and
tells the others which checkpoint to continue (`resume_state`); every rank memory-maps its state.pt,
so the ranks of a node share one copy in the page cache. A checkpoint asked for by name
(KILN_RESUME_FROM, or eval's `load_weights`) is an error when it does not read. A checkpoint of another trajectory
(kiln.train.fingerprint: model, tokenizer, shards, seed, training settings) is an error naming what
differs; before that, a train job sets such checkpoints aside (`superseded_by` says why, from
complete.json alone) and starts over, as it does when asked to (--forcerun train: kiln.layout.RETRAIN).
A train job on a finished run of the same trajectory resumes at its last step and trains nothing.
Pruning keeps the
newest `keep` complete checkpoints up to the one just written, so the newest complete checkpoint is
never removed, and besides them every milestone, a complete checkpoint whose step is a multiple of
`milestone_every` (train.keep_checkpoint_every; seed 002: "last-3 + a checkpoint-every-10k"), to go
back to after a divergence the newest ones already hold; folders past it (an unreadable one that was skipped, or the history a
KILN_RESUME_FROM rollback discarded) are removed.

This module owns what is inside a checkpoint (kiln.layout names the folder and its LATEST marker,
which `kiln status` reads without torch): the eval stage lists a run's checkpoints with `kept` and reads
one's weights with `load_weights` (a sharded one's too, whole, in one process), and train.init_from
reads one's state with `read_state`. Every read unpickles with weights_only=True (tensors and plain
containers only, so a checkpoint file cannot run code when loaded), allowing the three NumPy types
that the saved NumPy RNG state is made of. DCP's own files are not held to that: its index
(shards/.metadata) and the optimizer's hyperparameters are plain pickles, so a sharded checkpoint is
only as safe to load as its source is trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import shutil
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from kiln import layout
from kiln.errors import KilnError
from kiln.io import atomic_dir, atomic_file, fsync_path, sha256_file, write_json
from kiln.io import remove_dead_temps as _remove_dead_temps
from kiln.train.distributed import broadcast_object
from kiln.train.faults import NONE, Faults
from kiln.train.fingerprint import differences, require_same

log = logging.getLogger("kiln.checkpoint")
MARKER = layout.LATEST
STATE = "state.pt"
MANIFEST = "complete.json"
SHARDS = "shards"  # the sharded format's DCP folder; a loaded state names it under this key
RESUME_ENV = "KILN_RESUME_FROM"
_NAME = re.compile(r"step-(\d+)")
# np.random.get_state() is ("MT19937", uint32 array, pos, has_gauss, gauss): the globals its pickle
# names (an array pickles as _reconstruct, found this way under NumPy 1 and 2 alike). Nothing else in
# a checkpoint needs more than weights_only's defaults.
NUMPY_RNG_GLOBALS = [np.empty(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
# DCP warns at every save and load without a process group; one rank without one is what we mean.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


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


def save(root: Path, state: dict, keep: int, faults: Faults = NONE, milestone_every: int = 0) -> Path:
    """Write state (model and optimizer included: the full format) as root/step-NNNNNNN
    (complete.json last, all fsynced), point LATEST at it, keep the newest `keep` complete
    checkpoints up to it and the milestones. Rank 0 alone."""
    name = step_name(state["step"])
    with atomic_dir(root / name, durable=True) as tmp:
        _write_state(tmp, state, faults)
    return _publish(root, name, keep, milestone_every)


class Saver:
    """A run's checkpoint writer in train.checkpoint_format, one on every rank, `save` called by every
    rank at the same steps. At most one async save is in flight: the next save, and `wait`, first see
    it renamed into place (or raise its error)."""

    def __init__(
        self,
        root: Path,
        fmt: str,
        keep: int,
        *,
        rank: int,
        world: int,
        async_save: bool = False,
        faults: Faults = NONE,
        on_saved: Callable[[Path], None] | None = None,
        milestone_every: int = 0,
        collective: bool | None = None,
    ):
        self.root, self.sharded, self.keep, self.faults = Path(root), fmt == "sharded", keep, faults
        self.milestone_every = milestone_every  # steps whose checkpoints pruning keeps (0: none)
        self.rank, self.world = rank, world
        self.on_saved = on_saved  # rank 0: called with each checkpoint once it is in place (kiln.train.mirror)
        self._pending: Future | None = None
        self._commits = ThreadPoolExecutor(1, thread_name_prefix="kiln-checkpoint") if async_save else None
        # The background writes' collectives get their own (CPU) group, so they never interleave with
        # the training step's on the default one (torchtitan does the same). DCP is collective in the
        # run's process group (Dist.grouped: several ranks, or train.fsdp_one_rank's group of one; by
        # default, several ranks): not in one a library formed on its own, whose collective DCP would
        # write other metadata than a one-rank run's.
        self._collective = world > 1 if collective is None else collective
        self._group = dist.new_group(backend="gloo") if async_save and self._collective else None

    def last_checkpoint(self) -> str:
        """The newest checkpoint under the root, once an async save in flight is in place: where a rerun
        continues from."""
        self.wait()
        return last_checkpoint(self.root)

    def save(self, state: dict, shards: dict | None = None) -> None:
        """Full format: `state` is everything, rank 0's written. Sharded: `state` is all but model and
        optimizer (rank 0's written to state.pt), `shards` this rank's parallel.sharded_state."""
        self.wait()
        name = step_name(state["step"])
        if not self.sharded:
            if self.rank == 0:
                self._saved(save(self.root, state, self.keep, self.faults, self.milestone_every))
            return
        with contextlib.ExitStack() as stack:  # rank 0: the temp folder removed on any error
            tmp = stack.enter_context(atomic_dir(self.root / name, durable=True)) if self.rank == 0 else None
            tmp = broadcast_object(tmp, self.world)
            if self._commits is None:
                dcp.save(shards, checkpoint_id=tmp / SHARDS, no_dist=not self._collective)
                if self.rank == 0:
                    _write_state(tmp, state, self.faults)
            else:  # returns once the shards are copied to host memory: training may change them now
                written = dcp.async_save(
                    shards, checkpoint_id=tmp / SHARDS, process_group=self._group, no_dist=not self._collective
                )
                self._pending = self._commits.submit(self._commit, stack.pop_all(), tmp, state, written)
                return
        if self.rank == 0:
            self._saved(_publish(self.root, name, self.keep, self.milestone_every))

    def wait(self) -> None:
        """Until the save in flight, if any, is in place (rank 0: renamed, LATEST moved); raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _commit(self, stack: contextlib.ExitStack, tmp: Path, state: dict, written: Future) -> None:
        with stack:  # rank 0: renamed into place on success, removed on an error
            written.result()  # on rank 0, DCP's coordinator: every rank's shards are written and fsynced
            if self.rank == 0:
                _write_state(tmp, state, self.faults)
        if self.rank == 0:
            self._saved(_publish(self.root, step_name(state["step"]), self.keep, self.milestone_every))

    def _saved(self, folder: Path) -> None:
        if self.on_saved is not None:
            self.on_saved(folder)


def _write_state(folder: Path, state: dict, faults: Faults) -> None:
    """state.pt, then complete.json naming every file in the folder (the shards too), each fsynced."""
    torch.save(state, folder / STATE)
    fsync_path(folder / STATE)
    faults.during_save(state["step"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    write_json(
        folder / MANIFEST,
        {
            "step": state["step"],
            "fingerprint": state["fingerprint"],
            "files": {
                p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files
            },
        },
    )


def _publish(root: Path, name: str, keep: int, milestone_every: int = 0) -> Path:
    """Point LATEST at the checkpoint just renamed into place and prune."""
    with atomic_file(root / MARKER, durable=True) as tmp:
        tmp.write_text(name + "\n", encoding="utf-8")
    for old in _prunable(root, name, keep, milestone_every):
        log.info("checkpoint %s removed (%s)", old, "past the one just written" if old.name > name else "pruned")
        shutil.rmtree(old)
    log.info("checkpoint %s saved", root / name)
    return root / name


def _prunable(root: Path, name: str, keep: int, milestone_every: int = 0) -> list[Path]:
    folders = sorted(p for p in root.glob("step-*") if p.is_dir() and _NAME.fullmatch(p.name))
    upto = [p for p in folders if p.name <= name and _complete(p) is None]
    kept_names = {p.name for p in upto[-keep:]} | {name}
    if milestone_every:  # milestones up to the one just written; any past it belong to a discarded history
        kept_names |= {p.name for p in upto if int(_NAME.fullmatch(p.name).group(1)) % milestone_every == 0}
    return [p for p in folders if p.name not in kept_names]


def remove_dead_temps(root: Path) -> None:
    """Delete what writers that died mid-save left under root (rank 0 calls it before a resume)."""
    for path in _remove_dead_temps(root):
        log.info("removed %s, left by a writer that died mid-save", path)


def load_latest(root: Path, fingerprint: dict | str, requested: str | Path | None = None) -> dict | None:
    """The state of the newest complete, readable checkpoint under root (or of `requested`, a folder
    or a step-NNNNNNN name under root), or None when there is none; an error if it belongs to another
    run, or if every complete checkpoint is unreadable. Its files are hash-checked, and state.pt is
    memory-mapped: tensors are read from the page cache as they are used, never copied whole into
    this process's memory (the full format's is the model and optimizer: 12.5 GB for a 1B)."""
    found = _newest(Path(root), requested)
    return None if found is None else _same_run(found[1], found[0], fingerprint, Path(root))


def resume_state(
    root: Path,
    fingerprint: dict | str,
    requested: str | Path | None = None,
    *,
    rank: int = 0,
    world: int = 1,
    start_over: bool = False,
) -> dict | None:
    """load_latest for a run of `world` ranks, collective: rank 0 alone picks the checkpoint (none when
    its start_over is set: kiln.train.trainer's superseded check, which rank 0 acts on) and checks
    every file's hash, and tells the others which folder it is, or its error, which every rank then
    raises. The others memory-map that folder's state.pt unchecked. So a resume reads and hashes the
    files once, not once per rank, and the ranks' mappings share one copy in the page cache where
    every rank used to hold its own (8 ranks x 12.5 GB for a 1B in the full format), and every rank
    resumes the same checkpoint even if the folder changes while they look."""
    if world == 1:
        return None if start_over else load_latest(root, fingerprint, requested)
    if rank == 0:
        try:
            found = None if start_over else _newest(Path(root), requested)
            if found is not None:
                _same_run(found[1], found[0], fingerprint, Path(root))
        except Exception as exc:
            broadcast_object(("error", f"{type(exc).__name__} on rank 0: {exc}"), world)
            raise
        broadcast_object(("folder", None if found is None else str(found[0])), world)
        return None if found is None else found[1]
    kind, value = broadcast_object(None, world)
    if kind == "error":
        raise KilnError(f"{root}: resuming failed on rank 0, which reads the checkpoint for every rank ({value})")
    if value is None:
        return None
    try:
        state = _load(Path(value), verify_hash=False, mmap=True)  # rank 0 checked its hashes
    except Unreadable as exc:
        raise KilnError(f"{value}: the checkpoint rank 0 checked does not load on rank {rank}: {exc}") from exc
    return _same_run(state, Path(value), fingerprint, Path(root))


def _newest(root: Path, requested: str | Path | None) -> tuple[Path, dict] | None:
    """(folder, memory-mapped state) of the checkpoint load_latest reads, hash-checked, or None."""
    if requested:
        folder = Path(requested) if Path(requested).is_dir() or "/" in str(requested) else root / requested
        try:
            return folder, _load(folder, mmap=True)
        except Unreadable as exc:
            raise KilnError(f"{folder}: the checkpoint asked for ({RESUME_ENV}) is unusable: {exc}") from exc
    candidates = sorted((p for p in root.glob("step-*") if p.is_dir() and _NAME.fullmatch(p.name)), reverse=True)
    for folder in candidates:
        try:
            return folder, _load(folder, mmap=True)
        except Unreadable as exc:
            log.warning("checkpoint %s skipped: %s; trying the one before it", folder, exc)
    finished = [p.name for p in candidates if (p / MANIFEST).exists()]
    if finished:  # the run did save, and none of it reads: never silently start again from step 0
        raise KilnError(
            f"{root}: no checkpoint there reads ({', '.join(finished)}: see the warnings above); "
            f"move them away to start over, or set {RESUME_ENV} to one to see why"
        )
    return None


def superseded_by(root: Path, fingerprint: dict, *, retrain: bool = False) -> str | None:
    """Why the checkpoints under root must not be resumed by a run with `fingerprint`, or None when
    they may: a retrain was asked for (kiln.layout.RETRAIN: --forcerun train) of the run there, or the
    newest complete checkpoint's fingerprint (read from its complete.json, no state loaded) differs,
    naming each setting that changed. A finished run with the same fingerprint is resumed at its last
    step: 0 steps to train, the same weights."""
    root = Path(root)
    found = kept(root)
    if not found:
        return None
    if retrain:
        return "a retrain was asked for (snakemake --forcerun train)"
    try:
        saved = json.loads((found[-1][1] / MANIFEST).read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None  # unreadable: load_latest skips it and says why
    if saved == fingerprint:
        return None
    what = (
        differences(saved, fingerprint)
        if isinstance(saved, dict)
        else ["a bare digest (a checkpoint of an older Kiln)"]
    )
    return f"{found[-1][1].name} was trained with other settings: {'; '.join(what) or 'fingerprint parts differ'}"


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


def last_checkpoint(root: Path) -> str:
    """The newest checkpoint under `root`, where a rerun continues from, or that there is none."""
    found = kept(root)
    return str(found[-1][1]) if found else "none (a rerun starts from step 0)"


def load_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(model state dict on CPU, {step, tokens}) of the checkpoint in `folder`, for inference, in one
    process. Full format: state.pt is memory-mapped, so the optimizer state (twice the weights) is
    never read from disk (nor hashed: the sizes are checked); sharded: only the model's entries of
    the shards are read, whole whatever ranks wrote them."""
    state = read_state(folder)
    with _usable(folder):
        weights = _model_from_shards(state[SHARDS]) if SHARDS in state else state["model"]
    return weights, {"step": int(state["step"]), "tokens": int(state["tokens_seen"])}


def read_state(folder: Path) -> dict:
    """The state of the checkpoint in `folder` as load_weights reads it (state.pt memory-mapped, the
    files' sizes checked, not their hashes), e.g. its "lr", the LR its last step trained at, which
    train.init_from.warmup_from: source ramps from (None at step 0; absent in a checkpoint written
    before Kiln recorded it); an error saying why when it does not read."""
    with _usable(folder):
        return _load(Path(folder), verify_hash=False, mmap=True)


def load_full(folder: Path) -> dict:
    """The whole state of the checkpoint in `folder` (hash-checked, state.pt memory-mapped: the
    ranks reading it share one copy), e.g. another run's optimizer state for train.init_from; an
    error saying why when it does not read."""
    with _usable(folder):
        return _load(Path(folder), mmap=True)


@contextlib.contextmanager
def _usable(folder: Path):
    """A checkpoint asked for by name that does not read: a KilnError saying why."""
    try:
        yield
    except Unreadable as exc:
        raise KilnError(f"{folder}: checkpoint unusable: {exc}") from exc


def read_shards(shards: Path, into: dict) -> None:
    """Fill `into` (parallel.sharded_state's layout, this run's ranks) in place from a sharded
    checkpoint's `shards` folder (a loaded state's SHARDS), resharded from whatever layout wrote it.
    Collective when there is a process group."""
    dcp.load(into, checkpoint_id=shards, no_dist=not dist.is_initialized())


def _model_from_shards(shards: Path) -> dict[str, torch.Tensor]:
    try:
        entries = dcp.FileSystemReader(shards).read_metadata().state_dict_metadata
        model = {
            key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in entries.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
        dcp.load({"model": model}, checkpoint_id=shards, no_dist=True)
    except Exception as exc:  # the sizes matched complete.json: a file's content is wrong
        raise Unreadable(f"{SHARDS}/ does not load ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
    return model


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
            state = torch.load(folder / STATE, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torn zip, a foreign pickle, an I/O error: all mean "cannot resume from it"
        raise Unreadable(f"{STATE} does not load ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
    if (folder / SHARDS).is_dir():  # the sharded format: model and optimizer are read by read_shards
        state[SHARDS] = folder / SHARDS
    return state
