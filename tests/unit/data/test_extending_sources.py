"""docs/extending.md's worked source kind, added the way the doc says: its zip folder written into a
scratch copy of src/ and its registry line added at the bottom of registry.py there, nothing else. A
config with kind: zip then validates (its default filled in, its required key asked for, config still
free of the reader, pyarrow and datasets), the download stage writes the archives' documents in one job
and, scattered, in download_part jobs and a gather, and the schema and docs/settings.md name the kind and
its keys. Then the registry's own contract: an unknown or twice registered kind is named."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kiln.data.source_kinds import registry
from kiln.errors import KilnError

REPO = Path(__file__).parents[3]
DOC = REPO / "docs" / "extending.md"
# A python block of the doc whose first line names its file: "# src/kiln/data/source_kinds/zip/config.py"
FILE_BLOCK = re.compile(r"```python\n# ([\w/.]+)[^\n]*\n(.*?)```", re.S)
KINDS = "src/kiln/data/source_kinds"
FOLDER = f"{KINDS}/zip/"
REGISTRY = f"{KINDS}/registry.py"

# Run in the scratch copy: what validation, the download stage and the generated files make of the kind.
RUN = """
import json, sys
from pathlib import Path
from kiln.config.data_sections import DownloadSection
from kiln.errors import KilnError

base = Path(sys.argv[1])
sources = [{"name": "notes", "kind": "zip", "archives": [str(base / "a.zip"), str(base / "b.zip")],
            "members": ["*.md", "*.txt"]}, {"name": "more", "kind": "zip", "archives": [str(base / "a.zip")]}]
out = {"validated": [s.as_dict() for s in DownloadSection.of({"sources": sources}).sources]}
out["config_alone"] = sorted(m for m in sys.modules if m.split(".")[0] in ("pyarrow", "datasets", "torch")
                             or m.startswith("kiln.data.source_kinds.zip.reader"))
errors = [{"name": "n", "kind": "zip"}, {"name": "n", "kind": "zip", "archives": []},
          {"name": "n", "kind": "zip", "archives": ["a.zip"], "paths": ["x"]}]
out["errors"] = []
for spec in errors:
    try:
        DownloadSection.of({"sources": [spec]})
    except KilnError as exc:
        out["errors"].append(str(exc))

from kiln.data.raw import write_raw
from kiln.data.raw_scatter import download_plan, part_verdicts, write_part
from kiln.data.sources import read_documents

def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes().hex() for p in sorted(folder.rglob("*")) if p.is_file()}

cfg = DownloadSection.of({"sources": sources[:1], "rows_per_part": 2, "scatter_mb": 1e-6})
manifest = write_raw(cfg, base / "one")
out["manifest"] = manifest["sources"]["notes"]
out["documents"] = [[d.id, str(d.text), d.path, d.source] for d in read_documents(base / "one", manifest)]
plan = download_plan(cfg)
dirs = [base / "parts" / str(index) for index in range(plan.parts)]
for index, folder in enumerate(dirs):
    folder.mkdir(parents=True)
    write_part(cfg, plan, index, folder)
write_raw(cfg, base / "scattered", part_verdicts(cfg, plan, dirs))
out["part_jobs"] = plan.parts
out["scatter_same"] = files_of(base / "scattered") == files_of(base / "one")

from kiln.config.schema import json_schema
from kiln.config.settings import markdown_table
out["schema"] = json_schema()["$defs"]["Source"]["properties"]
out["settings"] = [line for line in markdown_table().splitlines() if line.startswith("| `download.sources`")]
print(json.dumps(out))
"""


def text(k: int) -> str:
    """Document k: words enough for the near-duplicate index to see it, none alike another's."""
    return " ".join(f"w{k}x{i}" for i in range(40)) + "\n"


def _archive(path: Path, members: dict[str, bytes | None]) -> None:
    """A zip file of `members` (None: a folder entry), in this order."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            if data is None:
                archive.writestr(zipfile.ZipInfo(name), b"")
            else:
                archive.writestr(name, data)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A copy of src/ with the doc's folder written into it and its registry line added, as the doc says."""
    root = tmp_path_factory.mktemp("extending-sources")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    blocks = dict(FILE_BLOCK.findall(DOC.read_text(encoding="utf-8")))
    for path, body in blocks.items():
        if path.startswith(FOLDER):
            (root / path).parent.mkdir(exist_ok=True)
            (root / path).write_text(body, encoding="utf-8")
    with open(root / REGISTRY, "a", encoding="utf-8") as f:
        f.write(blocks[REGISTRY])
    return root


@pytest.fixture(scope="module")
def made(scratch, tmp_path_factory) -> dict:
    """What RUN reports of two archives, read by the scratch copy's kiln."""
    data = tmp_path_factory.mktemp("zip-data")
    _archive(
        data / "a.zip",
        {
            "docs/": None,
            "docs/intro.md": text(0).encode(),
            "docs/image.png": b"\x89PNG not read",
            "docs/latin1.txt": b"caf\xe9\n",  # not UTF-8: skipped and counted
            "notes.txt": text(1).encode(),
        },
    )
    _archive(data / "b.zip", {"again.md": text(0).encode(), "last.md": text(2).encode()})
    env = os.environ | {"PYTHONPATH": str(scratch / "src")}  # the scratch copy's kiln, not this checkout's
    done = subprocess.run([sys.executable, "-c", RUN, str(data)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) | {"data": data.as_posix()}


def test_the_kind_is_one_new_folder_and_one_line(scratch):
    compared = filecmp.dircmp(REPO / KINDS, scratch / KINDS)
    assert compared.left_only == [] and compared.right_only == ["zip"]
    assert compared.diff_files == ["registry.py"]
    added = (scratch / REGISTRY).read_text().removeprefix((REPO / REGISTRY).read_text())
    assert added.count("\n") == 1 and added.startswith('register("zip", ')
    assert sorted(p.name for p in (scratch / FOLDER).iterdir()) == ["__init__.py", "config.py", "reader.py"]


def test_the_docs_kind_keeps_the_layers(scratch):
    """Its config.py is kiln.config's (registry PART_OF), its reader.py kiln.data's: every import points down."""
    found = importlib.util.spec_from_file_location("layers", REPO / "tests" / "unit" / "test_layers.py")
    layers = importlib.util.module_from_spec(found)
    found.loader.exec_module(layers)
    assert layers.layer_problems(scratch / "src") == []


def test_a_config_of_the_docs_kind_validates_without_the_reader(made):
    notes, more = made["validated"]
    assert notes == {
        "name": "notes",
        "kind": "zip",
        "archives": [f"{made['data']}/a.zip", f"{made['data']}/b.zip"],
        "members": ["*.md", "*.txt"],
        "quality": "none",
    }
    assert more["members"] == ["*"]  # the kind's default
    assert made["config_alone"] == []  # no reader, pyarrow, datasets or torch to validate a config
    missing, empty, foreign = made["errors"]
    assert missing == "download.sources.0: kind zip needs key archives"
    assert empty.startswith("download.sources.0.archives: Tuple should have at least 1 item")
    assert foreign.startswith("download.sources.0: kind zip has no key paths (its keys: archives, kind, max_bytes")


def test_the_download_stage_writes_the_archives_documents_scattered_or_not(made):
    a, b = f"notes/{made['data']}/a.zip", f"notes/{made['data']}/b.zip"
    assert made["documents"] == [
        [f"{a}/docs/intro.md", text(0), "docs/intro.md", "notes"],
        [f"{a}/notes.txt", text(1), "notes.txt", "notes"],
        [f"{b}/last.md", text(2), "last.md", "notes"],
    ]
    manifest = made["manifest"]
    assert manifest["kind"] == "zip" and manifest["skipped_non_utf8"] == 1 and manifest["skipped_duplicate"] == 1
    assert made["part_jobs"] == 2 and made["scatter_same"]  # a job per archive; the bytes of one job


def test_the_schema_and_the_settings_doc_name_the_kind_and_its_keys(made):
    schema = made["schema"]
    assert schema["kind"]["enum"] == ["stdlib", "local", "hf", "zip"]
    assert schema["kind"]["description"].endswith("; zip: the members of zip archives, each a document.")
    assert schema["archives"]["description"] == "(zip) Zip files, read in order. Required."
    assert schema["archives"]["anyOf"][0]["minItems"] == 1
    assert schema["members"]["description"].endswith('the others are skipped. Default: ["*"].')
    assert "local none, hf none, zip none)" in schema["quality"]["description"]
    (row,) = made["settings"]
    assert "each with its kind's keys (stdlib, local, hf, zip)" in row


def test_an_unknown_or_twice_registered_kind_is_named():
    with pytest.raises(KilnError, match=r"download.sources: kind 'zip' is not one of stdlib, local, hf"):
        registry.get("zip")
    with pytest.raises(KilnError, match="source kind 'local' is registered twice"):
        registry.register("local", "elsewhere.local", "again")
    assert registry.names() == ("stdlib", "local", "hf")
