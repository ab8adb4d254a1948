"""A setting is declared once (kiln.config.declare): one field in a scratch copy of the package, and the
JSON Schema, docs/settings.md, validation and the rule params follow it, with nothing else edited; a
field without its stages fails the table check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ANCHOR = "class TrainSection(Section):\n"
KNOB = """
    new_knob: int = setting(3, "How many knobs the loop turns.", TRAIN_RUN, ge=1)
"""
PROBE = """
import json, sys
from kiln import config as kiln_config
from kiln.config import schema, settings
settings.check_table()
cfg = kiln_config.resolve([sys.argv[1]])
try:
    kiln_config.resolve([sys.argv[1]], {"train": {"new_knob": 0}})
    error = None
except kiln_config.ConfigError as exc:
    error = str(exc)
print(json.dumps({
    "schema": schema.json_schema()["$defs"]["TrainSection"]["properties"].get("new_knob"),
    "docs": [line for line in settings.markdown_table().splitlines() if "train.new_knob" in line],
    "value": cfg["train"]["new_knob"],
    "tracked": json.loads(settings.tracked(cfg, "train"))["train"].get("new_knob"),
    "untracked": json.loads(str(settings.untracked(cfg, "train")))["train"].get("new_knob"),
    "error": error,
}))
"""


def _scratch_package(tmp_path: Path, field: str) -> Path:
    """src/ copied, with `field` added as TrainSection's first field: the one edit a new key needs."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    module = src / "kiln" / "config" / "train_sections.py"
    text = module.read_text(encoding="utf-8")
    head, body = text.split(ANCHOR)
    docstring_end = body.index('"""', body.index('"""') + 3) + 3
    module.write_text(head + ANCHOR + body[:docstring_end] + "\n" + field + body[docstring_end:], encoding="utf-8")
    return src


def _probe(src: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "tests" / "configs" / "tiny.yaml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_a_new_key_is_one_field_and_the_schema_docs_and_params_follow(tmp_path):
    done = _probe(_scratch_package(tmp_path, KNOB))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["schema"]["default"] == 3 and seen["schema"]["minimum"] == 1
    assert seen["schema"]["x-read-to-run"] == ["train"] and seen["schema"]["x-reruns"] == {}
    assert len(seen["docs"]) == 1 and "How many knobs the loop turns." in seen["docs"][0]
    assert seen["value"] == 3  # the declared default fills a config that does not set it
    assert seen["tracked"] is None and seen["untracked"] == 3  # read to run: in the params Snakemake ignores
    assert "train.new_knob: Input should be greater than or equal to 1 (got 0)" in seen["error"]


@pytest.mark.parametrize("tag", ["", ", None"])
def test_a_new_key_without_its_stages_fails_the_table(tmp_path, tag):
    field = textwrap.dedent(f'''
        new_knob: int = setting(3, "How many knobs the loop turns."{tag})
    ''').replace("\n", "\n    ")
    done = _probe(_scratch_package(tmp_path, field))
    assert done.returncode != 0
    assert "train.new_knob: a setting declared without the stages it concerns" in done.stderr
