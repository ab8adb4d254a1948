"""The tiny run the DAG tests drive (tests/configs/tiny.yaml), where its stages land (kiln.layout), and
Snakemake started on it as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    CompletedProcess, output captured."""
    environ = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    return subprocess.run([*cmd, "--cores", "2", *args], capture_output=True, text=True, env=environ, timeout=timeout)
