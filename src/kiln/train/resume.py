"""Where a train job starts: the checkpoint it continues, or step 0 (Trainer.fit, before its loop).

A job continues the newest checkpoint of its own trajectory (the fingerprint: kiln.train.fingerprint),
or the one KILN_RESUME_FROM names; a finished run's last one too, so a train job that reran without
anything it trains on changing trains 0 steps and writes the same weights. Checkpoints of another
trajectory (settings changed), or of any run when a retrain was asked for (--forcerun train:
kiln.layout.RETRAIN), are set aside, never deleted, and the job starts over. Rank 0
decides and every rank acts on its answer (kiln.train.checkpoint.resume_state), so the ranks cannot
disagree when rank 0 moves files another rank is about to look at.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kiln import layout
from kiln.io import remove_dead_temps
from kiln.train import checkpoint

log = logging.getLogger("kiln.train")


def remove_dead_writers_files(out_dir: Path) -> None:
    """What a killed job's writers left in out_dir and its checkpoints (rank 0 only); a live writer's
    temporary files are left alone."""
    checkpoint.remove_dead_temps(out_dir / layout.CHECKPOINTS)
    for path in remove_dead_temps(out_dir):
        log.info("removed %s, left by a writer that died", path)


def state_to_resume(out_dir: Path, fingerprint: dict, *, rank: int, world: int, is_main: bool) -> dict | None:
    """The state of the checkpoint this job continues (every rank memory-maps it: one copy in the
    node's page cache, not one per rank), or None to start from step 0. Rank 0 picks it for every
    rank (its superseded verdict counts). Collective when there are several ranks."""
    ckpt_root = out_dir / layout.CHECKPOINTS
    requested = os.environ.get(checkpoint.RESUME_ENV)  # resumed on purpose: an error if it is another run's
    retrain = is_main and layout.take_retrain_request(out_dir)  # --forcerun train: for this job only
    superseded = not requested and _set_aside_if_superseded(out_dir, fingerprint, is_main, retrain)
    return checkpoint.resume_state(ckpt_root, fingerprint, requested, rank=rank, world=world, start_over=superseded)


def _set_aside_if_superseded(out_dir: Path, fingerprint: dict, is_main: bool, retrain: bool) -> bool:
    """Whether the checkpoints in out_dir are another trajectory's (settings changed) or ones a retrain
    was asked for over (`retrain`): then the run starts over, and rank 0 moves that trajectory's files
    to train/superseded/<time>/ (kiln.layout.set_aside), never deleting them. No collective: rank 0's
    answer is the one every rank acts on (checkpoint.resume_state); a rank that looks after rank 0 has
    moved the files would answer otherwise."""
    why = checkpoint.superseded_by(out_dir / layout.CHECKPOINTS, fingerprint, retrain=retrain)
    if why is not None and is_main:
        moved = layout.set_aside(out_dir)
        log.warning("train: starting from step 0: %s; the earlier run's checkpoints and metrics are in %s", why, moved)
    return why is not None
