"""The tiny run the DAG tests drive (tests/configs/tiny.yaml), where its stages land (kiln.layout), and
Snakemake started on it as a user would."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import warm_python

from kiln import config as kiln_config
from kiln.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
VENV_BIN = str(Path(sys.executable).parent)


def tiny_layout(workdir: Path, *configfiles: Path, **overrides) -> Layout:
    """The layout of the tiny run (or of `configfiles`, with --config `overrides`) under workdir/results."""
    cfg = kiln_config.resolve(list(configfiles) or [TINY], overrides)
    return Layout(cfg, root=Path(workdir) / "results")


def snakemake(workdir: Path, *args: str, env: dict[str, str | None] | None = None, timeout: float = 900):
    """`snakemake -s Snakefile --directory workdir --cores 2 *args`, the venv's bin first on PATH (the
    rules run python, torchrun and kiln from it) and `env`'s variables set (None: unset). Returns the
    CompletedProcess, output captured.

    Snakemake and its jobs start through tests/warm_python.py's shim (`python -m snakemake`, and the
    jobs' `python`), so each forks from an interpreter that has imported Snakemake, torch and Kiln
    already: ~1.5 s saved on Snakemake's start, ~2 s on each job's (half of the tiny run's wall time).
    A one-rank train job runs its script without torchrun; a launch of several ranks runs torchrun
    cold, as a user's does (tests/dag/test_kill_resume.py). tests/process and tests/slurm start their
    processes with their own commands."""
    path = [str(warm_shim().parent), VENV_BIN, os.environ.get("PATH", "")]
    environ = dict(os.environ, PATH=os.pathsep.join(path))
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    cmd = [str(warm_shim()), "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    return subprocess.run([*cmd, "--cores", "2", *args], capture_output=True, text=True, env=environ, timeout=timeout)


_WARM: list[Path] = []  # the shim, once this process has started the server


def warm_shim() -> Path:
    """tests/warm_python.py's `python` shim: the server started on first use, ended with this process."""
    if not _WARM:
        server, shim_bin = warm_python.start(Path(tempfile.mkdtemp(prefix="kiln-warm-")))
        atexit.register(os.killpg, server.pid, signal.SIGKILL)
        _WARM.append(shim_bin / "python")
    return _WARM[0]
