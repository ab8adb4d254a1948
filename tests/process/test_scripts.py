"""Every stage script runs by hand: --help works and a missing config is a one-line error."""

import subprocess
import sys
from pathlib import Path

import pytest

from kiln import layout

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "workflow" / "scripts").glob("*.py"))
STAGES = [stage.name for stage in layout.STAGES] + list(layout.STAGE_OF_JOB) + ["sweep_report"]  # one script per rule


def test_one_script_per_stage():
    assert [p.stem for p in SCRIPTS] == sorted(STAGES)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_help(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # Snakemake passes a stage its sections (--params), the sweep report the sweep (--sweep)
    assert "--config" in result.stdout and ("--sweep" if script.stem == "sweep_report" else "--params") in result.stdout


def test_missing_config_is_a_clear_error(tmp_path):
    script = next(p for p in SCRIPTS if p.stem == "download")
    result = subprocess.run(
        [sys.executable, str(script), "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "raw")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "config file not found" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "raw").exists()
