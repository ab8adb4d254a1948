"""The `slurm_cluster` fixture: a real two-node Slurm cluster (n1, n2; partitions cpu and gpu; 8 fake
GPUs per node) brought up once per session by tests/slurm/cluster.py, installing Debian's packages
the first time (~1 min) and starting in a few seconds after that.

    pytestmark = pytest.mark.slurm

    def test_x(slurm_cluster, tmp_path):
        subprocess.run(["sbatch", "--wait", ...], env=slurm_cluster.env(), check=True)
        rows = slurm_cluster.wait_done([job_id])

Snakemake on it: `snakemake --executor slurm --slurm-init-seconds-before-status-checks 2 ...` with
env=slurm_cluster.env() (the default 40 s before the first status check makes every job slow).

Skips only where the cluster cannot work at all (not Linux, not root, no binaries and no apt-get);
anything that breaks during installation or start-up is an error, not a skip. Sessions running at
the same time share the cluster; the last one to end stops it. KILN_SLURM_KEEP=1 leaves it running
(the next session reuses it), and so is one brought up by hand (`python tests/slurm/cluster.py up`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("kiln_test_slurm_cluster", Path(__file__).with_name("cluster.py"))
cluster_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cluster_mod  # dataclasses look the module up by name
_spec.loader.exec_module(cluster_mod)


@pytest.fixture(scope="session")
def slurm_cluster():
    try:
        cluster_mod.check_possible()
    except cluster_mod.SlurmUnavailable as e:
        pytest.skip(f"SLURM TESTS SKIPPED: {e}")
    # SlurmError (installation or start-up broke) fails the tests that use the cluster.
    with cluster_mod.session(keep=os.environ.get("KILN_SLURM_KEEP") == "1") as cluster:
        yield cluster
