"""Which checkpoint the ranks of a run resume is rank 0's answer (kiln.train.checkpoint.resume_state):
rank 0 alone hashes the files and picks, the others follow it, so every rank continues the same step
whatever each would have found, and an error on rank 0 is an error on every rank, not a rank left
waiting at the next collective. One torchrun launch of 2 gloo ranks (tests/resume_worker.py) runs
every case; the checkpoints are small states (no model), as in test_checkpoint.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kiln.train import checkpoint, launch

TESTS = Path(__file__).resolve().parents[1]


def _save(root: Path, step: int) -> Path:
    state = {"step": step, "fingerprint": "f", "model": {"w": torch.full((64,), float(step))}, "tokens_seen": step}
    return checkpoint.save(root, state, keep=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> list[dict]:
    base = tmp_path_factory.mktemp("resume")
    good, torn = base / "good", base / "torn"
    for step in (2, 4):
        _save(good, step)
        _save(torn, step)
    state = torn / "step-0000004" / checkpoint.STATE  # a flipped byte: same size, only its hash tells
    data = state.read_bytes()
    state.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    cases = [
        {"name": "newest", "root": str(good), "fingerprint": "f"},
        {"name": "torn newest", "root": str(torn), "fingerprint": "f"},
        {"name": "asked for", "root": str(good), "fingerprint": "f", "requested": "step-0000002"},
        {"name": "asked for, torn", "root": str(torn), "fingerprint": "f", "requested": "step-0000004"},
        {"name": "another run", "root": str(good), "fingerprint": "g"},
        {"name": "none", "root": str(base / "empty"), "fingerprint": "f"},
        # rank 0 set the checkpoints aside (superseded) before rank 1 looked, or after: rank 0 decides
        {"name": "rank 0 starts over", "root": str(good), "fingerprint": "f", "start_over_on": [0]},
        {"name": "rank 1 alone would", "root": str(good), "fingerprint": "f", "start_over_on": [1]},
    ]
    plan = base / "plan.json"
    plan.write_text(json.dumps({"out": str(base), "cases": cases}))
    argv = launch.command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": f"127.0.0.1:{_free_port()}"},
        [str(TESTS / "resume_worker.py"), str(plan)],
    )
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads((base / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize(
    "name, step",
    [
        ("newest", 4),
        ("torn newest", 2),
        ("asked for", 2),
        ("none", None),
        ("rank 0 starts over", None),
        ("rank 1 alone would", 4),
    ],
)
def test_every_rank_resumes_the_checkpoint_rank_0_picks(resumed, name, step):
    assert [rank[name] for rank in resumed] == [{"step": step}] * 2


@pytest.mark.parametrize(
    "name, why",
    [
        ("asked for, torn", "is unusable: state.pt's sha256 differs"),
        ("another run", "fingerprint"),
    ],
)
def test_an_error_on_rank_0_is_an_error_on_every_rank(resumed, name, why):
    rank0, rank1 = (rank[name]["error"] for rank in resumed)
    assert why in rank0 and why in rank1
    assert "resuming failed on rank 0" in rank1
