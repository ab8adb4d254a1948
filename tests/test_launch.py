"""kiln.train.launch: the argv that starts a stage's ranks. The Slurm path (srun + c10d on the
allocation's first host) runs for real in tests/slurm/test_pipeline_on_slurm.py."""

import subprocess
import sys

import pytest

from kiln.errors import KilnError
from kiln.train.launch import command

ONE_NODE = {"nproc_per_node": 4, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": ""}


def test_one_node_is_a_standalone_torchrun_of_this_python():
    argv = command(ONE_NODE, ["train.py", "--x"], env={})
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "--standalone",
                    "train.py", "--x"]


def test_nodes_started_by_hand_meet_at_the_static_endpoint():
    train = ONE_NODE | {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "node0:29400"}
    argv = command(train, ["train.py"], env={"SLURM_JOB_ID": "7"})  # an endpoint wins over Slurm
    assert argv[3:] == ["--nproc_per_node=4", "--nnodes=2", "--node_rank=1", "--rdzv_backend=static",
                        "--rdzv_endpoint=node0:29400", "train.py"]


def test_several_nodes_without_slurm_or_an_endpoint_name_the_keys():
    with pytest.raises(KilnError, match="train.nnodes: 2 nodes need a Slurm allocation.*train.rdzv_endpoint"):
        command(ONE_NODE | {"nnodes": 2}, ["train.py"], env={})


def test_the_module_reports_the_error_in_one_line_and_exits_1():
    result = subprocess.run([sys.executable, "-m", "kiln.train.launch", "--train",
                             '{"nproc_per_node": 1, "nnodes": 3, "node_rank": 0, "rdzv_endpoint": ""}',
                             "--", "train.py"], capture_output=True, text=True, env={"PATH": ""})
    assert result.returncode == 1 and "train.nnodes: 3 nodes need a Slurm allocation" in result.stderr
