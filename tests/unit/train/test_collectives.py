"""Collectives go through kiln.train.distributed, which puts each tensor where the group's backend
takes it: NCCL (every GPU run's default group) takes only CUDA tensors, gloo (the CPU tests') takes
host tensors too, so a host tensor handed straight to torch.distributed passes every CPU test and
crashes the first multi-GPU job (issue 18: smoke's checkpoint timing all-reduced a CPU scalar).
No GPU here: the device choice is checked as a function of the backend, and a scan of the source
fails on any torch.distributed collective called anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kiln.train.distributed import collective_device

REPO = Path(__file__).resolve().parents[3]
HELPERS = REPO / "src" / "kiln" / "train" / "distributed.py"
# torch.distributed's collectives and point-to-point calls (distributed_c10d's public ones).
COLLECTIVES = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
}
MODULES = {"torch.distributed", "torch.distributed.distributed_c10d"}


@pytest.mark.parametrize(
    "backend, device, expected",
    [
        ("nccl", "cpu", "cuda"),  # a host scalar (a timing, a count) goes to the current GPU
        ("nccl", "cuda:1", "cuda:1"),  # a tensor on this rank's GPU stays there
        ("gloo", "cpu", "cpu"),
        ("gloo", "cuda:0", "cuda:0"),  # gloo reduces CUDA tensors too
        ("cpu:gloo,cuda:nccl", "cpu", "cpu"),  # init_process_group(backend=None): one backend per device
        ("cpu:gloo,cuda:nccl", "cuda:0", "cuda:0"),
        ("cuda:nccl", "cpu", "cuda"),
        ("cpu:gloo", "cuda:0", "cpu"),
    ],
)
def test_collective_device_is_one_the_backend_takes(backend, device, expected):
    assert collective_device(backend, torch.device(device)) == torch.device(expected)


def _collective_calls(path: Path) -> list[str]:
    """file:line: name of every torch.distributed collective the file calls or imports by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = set(MODULES)  # names bound to torch.distributed
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name in MODULES and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            aliases |= {a.asname or a.name for a in node.names if a.name == "distributed"}
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found += [f"{path}:{node.lineno}: {a.name}" for a in node.names if a.name in COLLECTIVES]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in COLLECTIVES and ast.unparse(node.value) in aliases:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_collective_bypasses_the_helpers():
    files = sorted((REPO / "src").rglob("*.py")) + sorted((REPO / "workflow").rglob("*.py"))
    stray = [hit for path in files if path != HELPERS for hit in _collective_calls(path)]
    assert not stray, "call these through kiln.train.distributed's helpers: " + "; ".join(stray)
    # The scan sees the helpers' own calls: it is not blind to the spellings used.
    names = {hit.rsplit(".", 1)[-1] for hit in _collective_calls(HELPERS)}
    assert {"all_reduce", "all_gather_object", "broadcast_object_list", "barrier"} <= names
