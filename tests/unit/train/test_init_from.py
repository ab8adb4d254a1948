"""train.init_from: a run that starts from another model's weights (kiln.train.init_from), through
the trainer as the train stage runs it: a finished run's final weights, its Hugging Face export, a
checkpoint with its AdamW state; the first validation is the source's last; a model or tokenizer
that does not match is an error naming it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch
from synthetic import PADDED_VOCAB, SEQ_LEN, TINY_MODEL, VOCAB, train_sections, write_shards
from train_stage import run
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Starcoder2Config,
    Starcoder2ForCausalLM,
)

from kiln import hf, layout
from kiln.config import hf_source
from kiln.config.run_config import RunConfig
from kiln.config.train_sections import TrainSection
from kiln.errors import ConfigError, KilnError
from kiln.io import read_json, write_json
from kiln.model.build import load_model
from kiln.train import checkpoint, fingerprint, init_from
from kiln.train.init_from import InitSource
from kiln.train.schedule import schedule_from_config
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

STOCK_DIMS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def source(shards, tmp_path_factory) -> Path:
    """results/source/train: a finished 10-step run (validated at its last step) and its HF export."""
    results = tmp_path_factory.mktemp("results")
    out = results / "source" / "train"
    run(RunConfig.of(train_sections(max_steps=10, eval_every=10, checkpoint_every=10)), shards, out)
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
    result = run(RunConfig.of(train_sections(max_steps=6, warmup_steps=1, init_from=spec)), shards, out)
    first = records(out)[0]
    assert first["step"] == 0 and first["tokens"] == 0 and "loss" not in first
    assert first["val_loss"] == pytest.approx(last_val(source), rel=1e-6, abs=1e-7)
    assert result.init_from == first["init_from"] and next(iter(spec)) in result.init_from
    fresh = run(
        RunConfig.of(train_sections(max_steps=6, warmup_steps=1)),
        shards,
        out.parent.parent / f"fresh-{next(iter(spec))}" / "train",
    )
    assert result.losses[0] < fresh.losses[0] - 0.5  # it starts where the source was, not at ln(vocab)


def test_the_optimizer_state_comes_too_when_asked_and_the_settings_stay_this_runs(shards, source):
    sections = train_sections(max_steps=6, weight_decay=0.0, init_from={"run": "source", "optimizer": True})
    trainer = Trainer(RunConfig.of(sections), shards)
    trainer.init_source = InitSource.of(sections["train"]["init_from"], source.parents[1])
    trainer._start_from(trainer.init_source)
    saved = checkpoint.load_full(source / "checkpoints" / "step-0000010")["optimizer"]
    ours = trainer.optimizer.state_dict()
    assert ours["state"][0]["exp_avg"].equal(saved["state"]["wte.weight"]["exp_avg"])
    assert float(ours["state"][0]["step"]) == 10
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} <= {0.0}  # this run's, not the source's 0.1
    weights = load_model(source).state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())


def test_another_model_shape_is_an_error_naming_the_weight(shards, source):
    sections = train_sections(model={"n_layer": 1, "n_head": 2, "d_model": 16}, init_from={"run": "source"})
    with pytest.raises(
        KilnError,
        match=r"train.init_from: run .*/source/train \(weights\): weight \S+ is \(\d+, 32\), this run's "
        r"model has \(\d+, 16\); set model: to the source's shape",
    ):
        run(RunConfig.of(sections), shards, source.parents[1] / "x" / "train")


def test_a_model_section_that_contradicts_a_hf_source_is_a_config_error(source, tmp_path):
    """With {hf: FOLDER} the model section is the folder's config.json shape: a key that says
    otherwise is refused when the config is read, naming both values."""
    with pytest.raises(ConfigError, match=r"model.d_model: 16 in the config, but the source has n_embd = 32 \("):
        train_sections(model={"n_layer": 1, "n_head": 2, "d_model": 16}, init_from={"hf": str(source / "hf")})
    with pytest.raises(ConfigError, match=r"train.init_from.hf: \S+/nope/config.json: not found"):
        train_sections(model={}, init_from={"hf": str(tmp_path / "nope")})


STOCK = {  # transformers' own models, tiny: Llama 3.1's RoPE scaling, Qwen2's q/k/v biases, StarCoder2
    "llama3": lambda: LlamaForCausalLM(
        LlamaConfig(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            **STOCK_DIMS,
        )
    ),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**STOCK_DIMS)),
    # a window as long as the run's rows: the longest context Kiln computes exactly for it
    "starcoder2": lambda: Starcoder2ForCausalLM(Starcoder2Config(sliding_window=SEQ_LEN, **STOCK_DIMS)),
}


@pytest.mark.parametrize("family", STOCK)
def test_a_stock_checkpoint_is_the_model_when_the_config_gives_none(shards, tmp_path, family):
    """model: left out: the run's model is the checkpoint's shape (its config.json) with this run's
    padded vocabulary and context, starts from its weights (the 4 rows beyond its 60 at their
    mean) and trains."""
    torch.manual_seed(0)
    STOCK[family]().save_pretrained(tmp_path / "stock")
    sections = train_sections(model={}, max_steps=4, warmup_steps=1, init_from={"hf": str(tmp_path / "stock")})
    assert sections["model"] == hf_source.model_section(tmp_path / "stock")
    expected = hf_source.source_config(tmp_path / "stock")
    assert (expected.qkv_bias, expected.rope_scaling is not None) == (family == "qwen2", family == "llama3")
    trainer = Trainer(RunConfig.of(sections), shards)
    assert trainer.model_config == dataclasses.replace(expected, vocab_size=PADDED_VOCAB, seq_len=SEQ_LEN)
    trainer.init_source = InitSource.of(sections["train"]["init_from"], tmp_path)
    trainer._start_from(trainer.init_source)
    ours, theirs = trainer.model.state_dict(), hf.load(tmp_path / "stock").state_dict()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items() if k not in ("wte.weight", "lm_head.weight"))
    assert torch.equal(ours["wte.weight"][:VOCAB], theirs["wte.weight"])
    result = run(RunConfig.of(sections), shards, tmp_path / "results" / family / "train")
    assert result.val_losses[-1][0] == 4 and all(math.isfinite(v) for _, v in result.val_losses)
    assert load_model(tmp_path / "results" / family / "train").config == trainer.model_config


def _stock_gpt2(folder: Path, vocab: int) -> dict[str, torch.Tensor]:
    """transformers' own GPT-2 in TINY_MODEL's shape with `vocab` rows, saved; its weights, Kiln-named."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=SEQ_LEN, n_embd=32, n_layer=1, n_head=2)).save_pretrained(
        folder
    )
    return hf.load(folder).state_dict()


def test_a_stock_gpt2s_unpadded_rows_fill_the_runs_padded_vocabulary(shards, tmp_path):
    """A source with the tokenizer's 60 rows, unpadded (as GPT-2's 50,257), into a run of 64: its rows
    are the run's first 60, the 4 beyond start at their mean, the head stays tied, every other
    weight is the source's."""
    source = _stock_gpt2(tmp_path / "gpt2", VOCAB)
    sections = train_sections(model=TINY_MODEL | {"bias": True}, init_from={"hf": str(tmp_path / "gpt2")})
    trainer = Trainer(RunConfig.of(sections), shards)
    trainer.init_source = InitSource.of(sections["train"]["init_from"], tmp_path)
    trainer._start_from(trainer.init_source)
    ours = trainer.model.state_dict()
    assert ours["wte.weight"].shape == (PADDED_VOCAB, 32)
    assert torch.equal(ours["wte.weight"][:VOCAB], source["wte.weight"])
    mean = source["wte.weight"].mean(dim=0)
    assert all(torch.allclose(row, mean) for row in ours["wte.weight"][VOCAB:])
    assert trainer.model.lm_head.weight is trainer.model.wte.weight
    assert all(torch.equal(ours[k], v) for k, v in source.items() if k not in ("wte.weight", "lm_head.weight"))


def test_a_source_with_more_rows_than_the_run_is_an_error(shards, tmp_path):
    _stock_gpt2(tmp_path / "gpt2", PADDED_VOCAB + 6)
    sections = train_sections(model=TINY_MODEL | {"bias": True}, init_from={"hf": str(tmp_path / "gpt2")})
    with pytest.raises(KilnError, match=r"weight wte.weight is \(70, 32\), this run's model has \(64, 32\)"):
        run(RunConfig.of(sections), shards, tmp_path / "results" / "w" / "train")


def test_another_tokenizer_is_an_error(shards, source, tmp_path):
    other = write_shards(tmp_path / "other")
    write_json(other / "manifest.json", read_json(other / "manifest.json") | {"tokenizer_sha256": "f" * 64})
    hf_dir = tmp_path / "hf"
    hf.export(load_model(source), hf_dir)
    (hf_dir / "tokenizer.json").write_text("{}")  # the export's tokenizer: another one than the shards'
    with pytest.raises(KilnError, match="was trained with another tokenizer"):
        run(RunConfig.of(train_sections(init_from={"hf": str(hf_dir)})), other, tmp_path / "results" / "y" / "train")


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
        run(RunConfig.of(train_sections(init_from={"run": "nope"})), shards, tmp_path / "results" / "z" / "train")


def _warmup_from_source(folder: Path, results: Path) -> float:
    """What the train stage resolves warmup_from: source to for init_from {checkpoint: folder}."""
    train = RunConfig.of(train_sections(init_from={"checkpoint": str(folder), "warmup_from": "source"})).train
    return init_from.resolved_warmup(train, results).init_from.warmup_from


def test_warmup_from_source_reads_the_lr_a_checkpoints_last_step_trained_at(source):
    """The trainer records the LR of the last step trained in its checkpoints: warmup_from: source for
    {checkpoint: FOLDER} is exactly the schedule's LR at step 9 of the source's 10, the last LR its
    metrics.jsonl logged (the record of step 10: the LR its last step took)."""
    folder = source / layout.CHECKPOINTS / checkpoint.step_name(10)
    schedule = schedule_from_config(TrainSection.of(train_sections(max_steps=10)["train"]), 10)
    assert _warmup_from_source(folder, source.parents[1]) == schedule(9) != schedule(10)
    logged = [r for r in records(source) if "lr" in r][-1]
    assert logged["step"] == 10 and logged["lr"] == schedule(9)


def test_warmup_from_source_reads_a_sharded_checkpoint_of_a_run_still_going(shards, tmp_path):
    """The sharded format's state.pt records it too; a checkpoint mid-run has its own step's LR, not the run's last."""
    out = tmp_path / "results" / "sharded" / "train"
    sections = train_sections(max_steps=6, warmup_steps=1, log_every=3, checkpoint_every=3, checkpoint_format="sharded")
    run(RunConfig.of(sections), shards, out)
    folder = out / layout.CHECKPOINTS / checkpoint.step_name(3)
    assert (folder / checkpoint.SHARDS).is_dir()
    schedule = schedule_from_config(TrainSection.of(sections["train"]), 6)
    assert _warmup_from_source(folder, out.parents[1]) == schedule(2) != schedule(5)
    assert {r["step"]: r["lr"] for r in records(out) if "lr" in r}[3] == schedule(2)


def test_a_checkpoint_that_records_no_lr_is_an_error_asking_for_the_number(source, tmp_path):
    """A checkpoint written before Kiln recorded the LR (its state re-saved without it, complete.json
    rewritten by the checkpoint writer itself) names itself and asks for the LR as a number."""
    state = dict(checkpoint.load_full(source / layout.CHECKPOINTS / checkpoint.step_name(10)))
    del state["lr"]
    folder = checkpoint.save(tmp_path / "old", state, keep=1)
    assert checkpoint.kept(tmp_path / "old") == [(10, folder)] and "lr" not in checkpoint.read_state(folder)
    with pytest.raises(
        KilnError,
        match=rf"train.init_from.warmup_from: source: checkpoint {re.escape(str(folder))} records no LR \(it was written before "
        r"Kiln recorded the LR\); give the LR as a number",
    ):
        _warmup_from_source(folder, tmp_path)
