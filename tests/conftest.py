"""Shared fixtures: a small raw download folder and a small tokenizer trained on it, built once per
session so the data tests stay fast (a few stdlib packages, a 512-token BPE); and the lanes.

The tree: tests/unit/<package>/ mirrors src/kiln/ (in-process tests of one component); tests/dag runs
Snakemake on real configs; tests/process starts whole processes (torchrun ranks, stage scripts, kills);
tests/bench runs the bench scripts; tests/slurm needs the Slurm test cluster. Each test is marked with
its folder's lane (pyproject.toml lists the markers), so `-m "not dag"` and the like pick lanes."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Everything the tests read through `datasets` is local; never let it reach for the Hub.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from kiln import config as kiln_config
from kiln.config.data_sections import DownloadSection, Source, TokenizerSection
from kiln.config.run_config import RunConfig
from kiln.data.raw import write_raw
from kiln.data.tokenizer_build import build_tokenizer

TESTS = Path(__file__).parent
TINY = TESTS / "configs" / "tiny.yaml"
LANES = ("dag", "process", "bench", "slurm")  # a folder of tests/ and its marker; the rest are unit tests


def pytest_collection_modifyitems(items):
    for item in items:
        lane = Path(item.path).relative_to(TESTS).parts[0]
        if lane in LANES:
            item.add_marker(lane)


STDLIB_INCLUDE = ["json/*.py", "collections/*.py", "logging/*.py", "http/*.py"]
TOKENIZER_CFG = {"kind": "train", "vocab_size": 512, "train_bytes": 10**8, "heldout_docs": 3}
SEED = 7

# Documents that quote special-token spellings or are not ASCII: they must stay ordinary text.
TRICKY_TEXTS = [
    f"doc {i}: the stream ends at <|endoftext|> but this one does not\n"
    f"an infill looks like <fim_prefix>a<fim_suffix>c<fim_middle>b and <fim_pad><file_sep>\n"
    f"héllo wörld ✓ 漢字 🙂 {i}\n" + "x = 1\n" * 20
    for i in range(12)
]


def typed_section(name: str, values: dict):
    """The typed section `name` that `values` mean in tests/configs/tiny.yaml's run: validated as a run
    file is (the schema's defaults filled in, the rules checked), then read by kiln.config.RunConfig."""
    return getattr(RunConfig.of(kiln_config.validate(kiln_config.read_yaml(TINY) | {name: values})), name)


def download_cfg(sources: list[dict], **settings) -> DownloadSection:
    """A download section with the schema's defaults (retries without waiting)."""
    return typed_section(
        "download", {"sources": sources, "rows_per_part": 8, "retries": 2, "retry_backoff_s": 0.0} | settings
    )


def source(**spec) -> Source:
    """One download source, with its kind's defaults."""
    return download_cfg([spec]).sources[0]


def tokenizer_cfg(**values) -> TokenizerSection:
    """TOKENIZER_CFG's trained BPE, with `values` set."""
    return typed_section("tokenizer", TOKENIZER_CFG | values)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    """A download folder: a stdlib source (several parts) and a local jsonl of tricky documents."""
    base = tmp_path_factory.mktemp("raw-fixture")
    write_jsonl(base / "inputs" / "tricky.jsonl", [{"text": t} for t in TRICKY_TEXTS])
    out = base / "raw"
    # A relative path keeps the document ids (and so the train/val split) the same on every run.
    cwd = os.getcwd()
    os.chdir(base)
    try:
        write_raw(
            download_cfg(
                [
                    {"name": "stdlib", "kind": "stdlib", "include": STDLIB_INCLUDE},
                    {"name": "tricky", "kind": "local", "paths": ["inputs/tricky.jsonl"], "text_column": "text"},
                ]
            ),
            out,
        )
    finally:
        os.chdir(cwd)
    return out


@pytest.fixture(scope="session")
def trained(raw_dir):
    """(tokenizer, stats) from build_tokenizer on the raw fixture."""
    return build_tokenizer(raw_dir, tokenizer_cfg(), SEED)


@pytest.fixture(scope="session")
def tokenizer_path(trained, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    trained[0].save(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    from kiln.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors run fastest on one thread, and do not stall when the CPUs are shared (a module
    opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """(workdir, results/tiny, the CompletedProcess) of the tiny run (tests/configs/tiny.yaml) run to
    the end by Snakemake, once a session. Tests that change it work on a copy."""
    from tiny import TINY, snakemake

    workdir = tmp_path_factory.mktemp("run")
    result = snakemake(workdir, "--configfile", str(TINY))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir, workdir / "results" / "tiny", result


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """tests/synthetic.py's learnable stream in a shard folder (three train shards), one per module:
    a test that corrupts or rewrites it works on a copy."""
    from synthetic import write_shards

    return write_shards(tmp_path_factory.mktemp("shards") / "shards")
