"""Every run file shipped in config/ rehearses (`kiln rehearse`) as its header runs it: a sweep laid
over the run its header names, each of its arms rehearsed; a run that continues a stock checkpoint
beside a stand-in of that checkpoint's folder at its real shape (config.json and a tokenizer of its
vocabulary; the weights are not read before training). Each is the GPU run's work at its real shapes
and ranks, on fake tensors: if a shipped config stops fitting its card or stops starting, this fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hf_folder import write_hf_shape
from tiny import ROOT

from kiln import config as kiln_config
from kiln.main import main

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

CONFIGS = ROOT / "config"
# HuggingFaceTB/SmolLM2-135M's config.json, as config/experiments/continue-smollm2-135m.yaml's header cites it
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
}
STAND_INS = {"sources/SmolLM2-135M": (SMOLLM2, "<|endoftext|>")}  # a config's checkpoint folder: its shape


def as_its_header_runs_it(path: Path) -> list[Path]:
    """The files a run file's header gives to --configfile with it (a sweep names the run it lays
    over), or the file alone."""
    own = path.relative_to(ROOT).as_posix()
    for line in path.read_text().splitlines():
        found = re.search(r"--configfile((?:\s+\S+\.yaml)+)", line) if line.startswith("#") else None
        if found and own in found.group(1).split():
            return [ROOT / name for name in found.group(1).split()]
    return [path]


SHIPPED = sorted(CONFIGS.rglob("*.yaml"))


def test_every_sweep_names_the_run_it_lays_over():
    for path in SHIPPED:
        if "sweep" in kiln_config.read_yaml(path) and "download" not in kiln_config.read_yaml(path):
            assert len(as_its_header_runs_it(path)) > 1, f"{path}: a sweep whose header names no run to lay it over"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_config_rehearses_on_its_gpu(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where a config's relative paths (a checkpoint's folder) resolve
    for folder, (shape, eos) in STAND_INS.items():
        write_hf_shape(tmp_path / folder, shape, eos)
    files = as_its_header_runs_it(path)
    runs = kiln_config.resolve_experiment(files, {}).runs
    assert main(["rehearse", "--configfile", *map(str, files)]) == 0
    printed = capsys.readouterr().out
    for run in runs:
        assert f"# Rehearsal of {run}:" in printed
    assert printed.count("eval: held-out loss") == len(runs)  # each run's eval stage too (kiln.rehearse.eval_stage)
    assert "DOES NOT FIT" not in printed
