"""A run's random streams from its one seed (Trainer.__init__): the same initial weights on every rank
(FSDP2 shards without broadcasting, so the ranks must draw alike), then each rank's own stream, so
dropout masks differ between ranks. A checkpoint holds every rank's RNG states (kiln.train.checkpoint),
so a resumed run draws on where it left off."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """One seed for Python, NumPy and torch (every device): initial weights, dropout, sampling."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def seed_rank_stream(seed: int, rank: int) -> None:
    """After init, which every rank draws alike from `seed` (FSDP2 shards without broadcasting),
    give each rank its own torch stream (CPU and its GPU) so dropout masks differ between ranks;
    rank 0 of W and the only rank of 1 draw alike. Resume restores each rank's own state."""
    if rank:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))
