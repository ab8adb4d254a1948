"""The tiny run the DAG tests drive (tests/configs/tiny.yaml) and where its stages land (kiln.layout)."""

from __future__ import annotations

from pathlib import Path

from kiln import run_config
from kiln.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"


def tiny_layout(workdir: Path, *configfiles: Path, **overrides) -> Layout:
    """The layout of the tiny run (or of `configfiles`, with --config `overrides`) under workdir/results."""
    cfg = run_config.resolve(list(configfiles) or [TINY], overrides)
    return Layout(cfg, root=Path(workdir) / "results")
