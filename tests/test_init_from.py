"""train.init_from: a run that starts from another model's weights (kiln.train.init_from), through
the trainer as the train stage runs it: a finished run's final weights, its Hugging Face export, a
checkpoint with its AdamW state; the first validation is the source's last; a model or tokenizer
that does not match is an error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from synthetic import train_sections, write_shards

from kiln import hf, layout
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.model.build import load_model
from kiln.train import checkpoint, fingerprint
from kiln.train.init_from import InitSource
from kiln.train.trainer import Trainer, run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def source(shards, tmp_path_factory) -> Path:
    """results/source/train: a finished 10-step run (validated at its last step) and its HF export."""
    results = tmp_path_factory.mktemp("results")
    out = results / "source" / "train"
    run(train_sections(max_steps=10, eval_every=10, checkpoint_every=10), shards, out)
    hf.export(load_model(out), out / "hf")
    return out


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / layout.METRICS).read_text().splitlines()]


def last_val(out: Path) -> float:
    return [r["val_loss"] for r in records(out) if "val_loss" in r][-1]


@pytest.mark.parametrize(
    "spec", [{"run": "source"}, {"hf": "HF"}, {"checkpoint": "CKPT"}], ids=["run", "hf", "checkpoint"]
)
def test_the_first_validation_is_the_sources_last(shards, source, spec):
    """Same data, same eval batches: the continued run's step-0 validation equals the source's final one
    (exactly: the same weights), and it then trains its own schedule from there."""
    spec = {
        k: {"HF": str(source / "hf"), "CKPT": str(source / "checkpoints" / "step-0000010")}.get(v, v)
        for k, v in spec.items()
    }
    out = source.parents[1] / f"continued-{next(iter(spec))}" / "train"
    result = run(train_sections(max_steps=6, warmup_steps=1, init_from=spec), shards, out)
    first = records(out)[0]
    assert first["step"] == 0 and first["tokens"] == 0 and "loss" not in first
    assert first["val_loss"] == pytest.approx(last_val(source), rel=1e-6, abs=1e-7)
    assert result.init_from == first["init_from"] and next(iter(spec)) in result.init_from
    fresh = run(
        train_sections(max_steps=6, warmup_steps=1), shards, out.parent.parent / f"fresh-{next(iter(spec))}" / "train"
    )
    assert result.losses[0] < fresh.losses[0] - 0.5  # it starts where the source was, not at ln(vocab)


def test_the_optimizer_state_comes_too_when_asked_and_the_settings_stay_this_runs(shards, source):
    sections = train_sections(max_steps=6, weight_decay=0.0, init_from={"run": "source", "optimizer": True})
    trainer = Trainer(sections, shards)
    trainer.init_source = InitSource.of(sections["train"]["init_from"], source.parents[1])
    trainer._start_from(trainer.init_source)
    saved = checkpoint.load_full(source / "checkpoints" / "step-0000010")["optimizer"]
    ours = trainer.optimizer.state_dict()
    assert ours["state"][0]["exp_avg"].equal(saved["state"]["wte.weight"]["exp_avg"])
    assert float(ours["state"][0]["step"]) == 10
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} <= {0.0}  # this run's, not the source's 0.1
    weights = load_model(source).state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())


def test_another_model_shape_is_an_error_naming_the_weight(shards, source, tmp_path):
    sections = train_sections(model={"n_layer": 1, "n_head": 2, "d_model": 16}, init_from={"hf": str(source / "hf")})
    with pytest.raises(
        KilnError,
        match=r"train.init_from: hf .*/hf \(weights\): weight \S+ is \(\d+, 32\), this run's "
        r"model has \(\d+, 16\); set model: to the source's shape",
    ):
        run(sections, shards, tmp_path / "results" / "x" / "train")


def test_another_tokenizer_is_an_error(shards, source, tmp_path):
    other = write_shards(tmp_path / "other")
    write_json(other / "manifest.json", read_json(other / "manifest.json") | {"tokenizer_sha256": "f" * 64})
    hf_dir = tmp_path / "hf"
    hf.export(load_model(source), hf_dir)
    (hf_dir / "tokenizer.json").write_text("{}")  # the export's tokenizer: another one than the shards'
    with pytest.raises(KilnError, match="was trained with another tokenizer"):
        run(train_sections(init_from={"hf": str(hf_dir)}), other, tmp_path / "results" / "y" / "train")


def test_a_retrained_source_is_another_trajectory():
    """The source's weights are in the fingerprint: a continued run whose source changed starts over."""
    train = train_sections(init_from={"run": "a"})["train"]
    old = fingerprint.trajectory(train, 10, "ab" * 32)
    new = fingerprint.trajectory(train, 10, "cd" * 32)
    assert fingerprint.differences({"train": old}, {"train": new}) == [
        "train.init_from's weights (sha256): abababababab… in the checkpoint, cdcdcdcdcdcd… now"
    ]


def test_a_missing_source_is_an_error_naming_it(shards, tmp_path):
    with pytest.raises(KilnError, match=r"train.init_from: .*results/nope/train/model.safetensors not found"):
        run(train_sections(init_from={"run": "nope"}), shards, tmp_path / "results" / "z" / "train")
