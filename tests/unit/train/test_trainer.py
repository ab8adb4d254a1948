"""The training loop, in-process on CPU: loss falls, outputs, determinism, exact resume, checkpoint
safety, gradient-accumulation equivalence, in-training samples.

Every run uses a tiny model (1 layer, d_model 32) on a synthetic shard folder whose token stream
has learnable structure (tests/synthetic.py), so a handful of steps lowers the loss.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import PADDED_VOCAB, SEQ_LEN, TRAIN_ROWS, train_sections
from train_stage import run

from kiln import layout
from kiln.config.run_config import RunConfig
from kiln.data.loader import ShardRows, TrainBatches
from kiln.errors import KilnError
from kiln.generate.decode import generate
from kiln.model.build import load_model
from kiln.train import checkpoint
from kiln.train.schedule import lr_at

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def test_the_synthetic_shards_hold_three_train_shards(shards):
    assert ShardRows(shards, "train").manifest["splits"]["train"]["rows"] == TRAIN_ROWS
    assert len(ShardRows(shards, "train").shards) == 3


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def _state(out: Path, step: int) -> dict:
    return torch.load(out / "checkpoints" / f"step-{step:07d}" / "state.pt", map_location="cpu", weights_only=False)


def _assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


# ---------------------------------------------------------------------------------------------
# (1) a short run


def test_short_run_lowers_loss_and_writes_outputs(shards, tmp_path):
    sections = train_sections()
    out = tmp_path / "run"
    result = run(RunConfig.of(sections), shards, out)

    records = _records(out)
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    for r in records:
        assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "tokens"} <= r.keys()
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["tokens_per_s"] > 0
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, lr=1e-2, min_lr=1e-3, warmup_steps=2, max_steps=20))
        assert r["tokens"] == r["step"] * 8 * SEQ_LEN
    assert [r["step"] for r in records if "val_loss" in r] == [10, 20]
    assert result.losses == [r["loss"] for r in records]
    assert result.val_losses == [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert result.steps == 20 and result.tokens_seen == 20 * 8 * SEQ_LEN

    # Starts near uniform over the padded vocabulary and falls well below it.
    assert records[0]["loss"] < math.log(PADDED_VOCAB) + 0.3
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert records[-1]["val_loss"] < records[1]["val_loss"] < math.log(PADDED_VOCAB) - 0.5

    assert (out / "model.safetensors").is_file()
    assert json.loads((out / "model_config.json").read_text()) == {
        "family": "gpt2",
        "vocab_size": PADDED_VOCAB,
        "seq_len": SEQ_LEN,
        "n_layer": 1,
        "n_head": 2,
        "d_model": 32,
        "n_kv_head": 2,
        "d_ff": 128,
        "max_positions": SEQ_LEN,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "bias": False,
        "dropout": 0.0,
        "tie_embeddings": True,
        "qkv_bias": False,
        "rope_scaling": None,
        "sliding_window": None,
    }
    model = load_model(out)
    assert not model.training
    assert model.lm_head.weight is model.wte.weight  # tying survives the save/load
    _assert_same_weights(model.state_dict(), _state(out, 20)["model"])
    assert (out / "checkpoints" / checkpoint.MARKER).read_text().strip() == "step-0000020"
    assert not [p.name for p in out.rglob("*") if ".tmp" in p.name]


# ---------------------------------------------------------------------------------------------
# (2) determinism


def test_identical_runs_give_identical_losses_and_weights(shards, tmp_path):
    sections = train_sections(max_steps=10, log_every=2)
    run(RunConfig.of(sections), shards, tmp_path / "a")
    run(RunConfig.of(copy.deepcopy(sections)), shards, tmp_path / "b")
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert len(a) == 5
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    _assert_same_weights(load_model(tmp_path / "a").state_dict(), load_model(tmp_path / "b").state_dict())


def test_different_seed_gives_different_run(shards, tmp_path):
    run(RunConfig.of(train_sections(max_steps=4, log_every=1)), shards, tmp_path / "a")
    other = train_sections(max_steps=4, log_every=1)
    other["train"]["seed"] += 1
    run(RunConfig.of(other), shards, tmp_path / "b")
    assert [r["loss"] for r in _records(tmp_path / "a")] != [r["loss"] for r in _records(tmp_path / "b")]


def test_samples_at_each_validation_leave_the_run_unchanged(shards, tmp_path):
    modes = []

    def sampler(model, agree=None):
        modes.append(model.training)
        new = generate(model, [[1, 2, 3], [4, 5]], 4, agree=agree)
        return [{"prompt": str(p), "completion": str(n)} for p, n in zip(([1, 2, 3], [4, 5]), new)]

    sections = train_sections(max_steps=20)
    run(RunConfig.of(sections), shards, tmp_path / "plain")
    run(RunConfig.of(copy.deepcopy(sections)), shards, tmp_path / "sampled", sampler=sampler)
    assert modes == [False, False]  # sampled in eval mode, at steps 10 and 20
    assert [r["loss"] for r in _records(tmp_path / "plain")] == [r["loss"] for r in _records(tmp_path / "sampled")]
    rows = [json.loads(line) for line in (tmp_path / "sampled" / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["prompt"]) for r in rows] == [
        (10, "[1, 2, 3]"),
        (10, "[4, 5]"),
        (20, "[1, 2, 3]"),
        (20, "[4, 5]"),
    ]
    assert all(len(json.loads(r["completion"])) == 4 for r in rows)
    assert (tmp_path / "plain" / "samples.jsonl").read_text() == ""


# ---------------------------------------------------------------------------------------------
# (3) resume


N = 12
_COMPARED = ("step", "loss", "lr", "grad_norm", "tokens", "val_loss")


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: r[k] for k in _COMPARED if k in r} for r in records]


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory) -> tuple[dict, Path]:
    """A run to N steps with a checkpoint at N/2 and at N, both kept."""
    sections = train_sections(max_steps=N, log_every=2, eval_every=4, checkpoint_every=N // 2, keep_checkpoints=2)
    out = tmp_path_factory.mktemp("uninterrupted")
    run(RunConfig.of(sections), shards, out)
    return sections, out


def _assert_resume_matches(full: Path, resumed: Path, result) -> None:
    got, want = _records(resumed), _records(full)
    steps = [r["step"] for r in got]
    assert steps == sorted(set(steps)), f"duplicated or unordered steps: {steps}"
    assert steps == list(range(2, N + 1, 2))
    for g, w in zip(_comparable(got), _comparable(want)):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k] == pytest.approx(w[k], rel=1e-6, abs=1e-6), (g["step"], k)
    after = [r["loss"] for r in want if r["step"] > N // 2]
    assert result.losses == pytest.approx(after, rel=1e-6, abs=1e-6)
    assert result.tokens_seen == N * 8 * SEQ_LEN
    _assert_same_weights(load_model(resumed).state_dict(), load_model(full).state_dict(), atol=1e-6)
    _assert_same_weights(
        _state(resumed, N)["optimizer"]["state"]["wte.weight"],
        _state(full, N)["optimizer"]["state"]["wte.weight"],
        atol=1e-6,
    )


def test_resume_from_copied_mid_checkpoint_matches_uninterrupted(shards, tmp_path, uninterrupted):
    sections, full = uninterrupted
    out = tmp_path / "resumed"
    mid = f"step-{N // 2:07d}"
    shutil.copytree(full / "checkpoints" / mid, out / "checkpoints" / mid)
    (out / "checkpoints" / checkpoint.MARKER).write_text(mid + "\n")
    # A run killed after its last checkpoint has logged steps that the resumed run redoes.
    shutil.copy(full / "metrics.jsonl", out / "metrics.jsonl")
    result = run(RunConfig.of(copy.deepcopy(sections)), shards, out)
    _assert_resume_matches(full, out, result)


def test_resume_in_place_after_losing_the_final_checkpoint(shards, tmp_path, uninterrupted):
    sections, full = uninterrupted
    out = tmp_path / "inplace"
    shutil.copytree(full, out)
    shutil.rmtree(out / "checkpoints" / f"step-{N:07d}")
    (out / "model.safetensors").unlink()
    (out / "checkpoints" / checkpoint.MARKER).write_text(f"step-{N // 2:07d}\n")
    result = run(RunConfig.of(copy.deepcopy(sections)), shards, out)
    _assert_resume_matches(full, out, result)


def test_resume_when_a_newer_checkpoint_was_written_but_latest_not_moved(shards, tmp_path, uninterrupted):
    """Killed between renaming step-N into place and moving LATEST (and so before the run finished):
    step N is complete (its complete.json is there), so the resume starts from it, not from the
    older step LATEST names, and trains nothing."""
    sections, full = uninterrupted
    out = tmp_path / "stale-marker"
    shutil.copytree(full, out)
    (out / "checkpoints" / checkpoint.MARKER).write_text(f"step-{N // 2:07d}\n")
    result = run(RunConfig.of(copy.deepcopy(sections)), shards, out)
    assert result.losses == [] and _records(out) == _records(full)
    assert not (out / layout.SUPERSEDED).exists()
    _assert_same_weights(load_model(out).state_dict(), load_model(full).state_dict())


def test_a_rerun_of_a_finished_run_trains_nothing_and_writes_the_same_weights(shards, tmp_path, uninterrupted):
    """A train job that Snakemake reran without anything it trains on changing (an input rewritten
    with the same content, a smoke stage redone): it resumes the finished run at its last step, trains
    0 steps, and writes the same bytes; nothing is set aside."""
    sections, full = uninterrupted
    out = tmp_path / "kept"
    shutil.copytree(full, out)
    (out / "model.safetensors").unlink()  # Snakemake deletes a job's outputs before it runs it
    result = run(RunConfig.of(copy.deepcopy(sections)), shards, out)
    assert result.losses == [] and result.start_step == result.steps == N
    assert (out / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    assert _records(out) == _records(full) and not (out / layout.SUPERSEDED).exists()


def test_a_retrain_asked_for_trains_a_finished_run_again_from_the_start(shards, tmp_path, uninterrupted, caplog):
    """What `--forcerun train` does on a finished run (the Snakefile's onstart asks through
    kiln.layout.RETRAIN): the train job starts over (the same weights again, deterministic on CPU),
    the finished run's checkpoints and metrics set aside, not deleted; the request holds for one job."""
    sections, full = uninterrupted
    out = tmp_path / "again"
    shutil.copytree(full, out)
    layout.request_retrain(out)
    with caplog.at_level(logging.WARNING, logger="kiln.train"):
        result = run(RunConfig.of(copy.deepcopy(sections)), shards, out)
    assert len(result.losses) == N // 2  # every log step of the run, not zero
    assert _comparable(_records(out)) == _comparable(_records(full))
    _assert_same_weights(load_model(out).state_dict(), load_model(full).state_dict())
    [aside] = (out / layout.SUPERSEDED).iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "metrics.jsonl", "samples.jsonl"]
    assert _records(aside.parent / aside.name) == _records(full)
    assert (aside / "checkpoints" / f"step-{N:07d}" / checkpoint.MANIFEST).is_file()
    [line] = [r.getMessage() for r in caplog.records if "starting from step 0" in r.getMessage()]
    assert "a retrain was asked for" in line and str(aside) in line
    assert not (out / layout.RETRAIN).exists()
    assert (
        run(RunConfig.of(copy.deepcopy(sections)), shards, out).losses == []
    )  # the next job keeps what this one trained


def test_a_changed_training_setting_starts_over_naming_it(shards, tmp_path, uninterrupted, caplog):
    """An interrupted run rerun with another lr does not resume the old trajectory: it trains the
    new setting from step 0 (the weights of a fresh run at that lr) and says what changed."""
    sections, full = uninterrupted
    out = tmp_path / "changed"
    shutil.copytree(full, out)
    shutil.rmtree(out / "checkpoints" / f"step-{N:07d}")
    changed = copy.deepcopy(sections)
    changed["train"]["lr"] = sections["train"]["lr"] / 2
    with caplog.at_level(logging.WARNING, logger="kiln.train"):
        run(RunConfig.of(copy.deepcopy(changed)), shards, out)
    fresh = tmp_path / "fresh"
    run(RunConfig.of(copy.deepcopy(changed)), shards, fresh)
    _assert_same_weights(load_model(out).state_dict(), load_model(fresh).state_dict())
    assert _comparable(_records(out)) == _comparable(_records(fresh))
    message = " ".join(r.getMessage() for r in caplog.records)
    assert (
        f"step-{N // 2:07d} was trained with other settings: train.lr: {sections['train']['lr']!r} in the checkpoint, "
        f"{changed['train']['lr']!r} now" in message
    )


# ---------------------------------------------------------------------------------------------
# (4) checkpoint safety and pruning


def test_keep_checkpoints_prunes_old_ones(shards, tmp_path):
    out = tmp_path / "run"
    run(RunConfig.of(train_sections(max_steps=8, log_every=2, checkpoint_every=2, keep_checkpoints=2)), shards, out)
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [
        checkpoint.MARKER,
        "step-0000006",
        "step-0000008",
    ]
    assert root.joinpath(checkpoint.MARKER).read_text().strip() == "step-0000008"


def test_a_checkpoint_asked_for_by_name_must_be_this_runs(shards, tmp_path, monkeypatch):
    """KILN_RESUME_FROM resumes on purpose: a checkpoint of another model, seed or training setting
    is then an error naming what differs, never a silent fresh start."""
    out = tmp_path / "run"
    run(RunConfig.of(train_sections(max_steps=4, log_every=2, checkpoint_every=2, keep_checkpoints=1)), shards, out)
    root = out / "checkpoints"
    fingerprint = _state(out, 4)["fingerprint"]
    assert checkpoint.load_latest(root, fingerprint)["step"] == 4
    with pytest.raises(KilnError, match="fingerprint"):
        checkpoint.load_latest(root, "0" * 64)
    monkeypatch.setenv(checkpoint.RESUME_ENV, "step-0000004")
    with pytest.raises(KilnError, match="model.d_model: 32 in the checkpoint, 16 now"):
        run(RunConfig.of(train_sections(model={"n_layer": 1, "n_head": 2, "d_model": 16}, max_steps=4)), shards, out)
    other_seed = train_sections(max_steps=4)
    other_seed["train"]["seed"] += 1
    with pytest.raises(KilnError, match="seed: 7 in the checkpoint, 8 now"):
        run(RunConfig.of(other_seed), shards, out)
    with pytest.raises(KilnError, match=r"train.lr: 0.01 in the checkpoint, 0.005 now"):
        run(RunConfig.of(train_sections(max_steps=4, lr=5e-3)), shards, out)
    with pytest.raises(KilnError, match=r"steps trained: 4 in the checkpoint, 6 now"):
        run(RunConfig.of(train_sections(max_steps=6)), shards, out)
    assert checkpoint.kept(root)[-1][0] == 4 and not (out / layout.SUPERSEDED).exists()


def test_load_latest_ignores_half_written_checkpoint(shards, tmp_path):
    out = tmp_path / "run"
    run(RunConfig.of(train_sections(max_steps=4, log_every=2, checkpoint_every=2, keep_checkpoints=2)), shards, out)
    root = out / "checkpoints"
    fingerprint = _state(out, 4)["fingerprint"]
    # What a crash mid-save leaves: a temp folder, or a complete-looking folder LATEST never named.
    (root / ".step-0000006.tmp-99999").mkdir()
    (root / ".step-0000006.tmp-99999" / "state.pt").write_bytes(b"\x00garbage")
    (root / "step-0000099").mkdir()
    (root / "step-0000099" / "state.pt").write_bytes(b"\x00garbage")
    state = checkpoint.load_latest(root, fingerprint)
    assert state["step"] == 4
    # LATEST naming a missing folder is not trusted: the newest complete checkpoint is.
    (root / checkpoint.MARKER).write_text("step-0000077\n")
    assert checkpoint.load_latest(root, fingerprint)["step"] == 4


def test_load_latest_without_marker_is_a_fresh_start(tmp_path):
    assert checkpoint.load_latest(tmp_path / "nothing", "f") is None
    (tmp_path / "ckpt" / "step-0000005").mkdir(parents=True)
    assert checkpoint.load_latest(tmp_path / "ckpt", "f") is None


def test_checkpoint_save_never_prunes_what_latest_points_at(tmp_path):
    root = tmp_path / "ckpt"
    for step in (2, 4, 8):
        checkpoint.save(root, {"step": step, "fingerprint": "f"}, keep=5)
    (root / checkpoint.MARKER).write_text("step-0000004\n")  # step-8 written, LATEST not yet moved
    checkpoint.save(root, {"step": 5, "fingerprint": "f"}, keep=1)
    assert checkpoint.load_latest(root, "f")["step"] == 5
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-0000005"]
    checkpoint.save(root, {"step": 6, "fingerprint": "f"}, keep=2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-0000005", "step-0000006"]


def test_checkpoint_save_is_atomic_and_rng_roundtrips(tmp_path):
    root = tmp_path / "ckpt"
    torch.manual_seed(3)
    rng = checkpoint.rng_state()
    expected = torch.rand(3)
    checkpoint.save(root, {"step": 1, "fingerprint": "f", "rng": rng, "w": torch.ones(2)}, keep=3)
    checkpoint.save(root, {"step": 2, "fingerprint": "f", "rng": rng, "w": torch.full((2,), 2.0)}, keep=3)
    state = checkpoint.load_latest(root, "f")
    assert state["step"] == 2 and torch.equal(state["w"], torch.full((2,), 2.0))
    checkpoint.set_rng_state(state["rng"])
    assert torch.equal(torch.rand(3), expected)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.MARKER, "step-0000001", "step-0000002"]


# ---------------------------------------------------------------------------------------------
# (5) gradient accumulation


def test_loader_two_micro_batches_of_4_are_one_batch_of_8(shards):
    rows = ShardRows(shards, "train")
    assert len(rows) == TRAIN_ROWS
    small, big = TrainBatches(rows, 4, seed=7), TrainBatches(rows, 8, seed=7)
    for _ in range(2 * TRAIN_ROWS // 8):  # two epochs
        assert torch.equal(torch.cat([small.next(), small.next()]), big.next())
    # An epoch is one permutation: every row exactly once; the next epoch takes another order.
    loader = TrainBatches(rows, 8, seed=3)
    epochs = [torch.cat([loader.next() for _ in range(TRAIN_ROWS // 8)]) for _ in range(2)]
    every_row = sorted(map(tuple, rows.take(np.arange(TRAIN_ROWS)).tolist()))
    for epoch in epochs:
        assert sorted(map(tuple, epoch.tolist())) == every_row
    assert not torch.equal(epochs[0], epochs[1])


def test_grad_accum_matches_larger_micro_batch(shards, tmp_path):
    common = dict(max_steps=10, log_every=1, eval_every=100, checkpoint_every=100)
    # The same global batch of 8 rows x 16 tokens: one micro-batch of 8, or two of 4 accumulated.
    run(RunConfig.of(train_sections(micro_batch=8, batch_tokens=128, **common)), shards, tmp_path / "big")
    run(RunConfig.of(train_sections(micro_batch=4, batch_tokens=128, **common)), shards, tmp_path / "accum")
    big, accum = _records(tmp_path / "big"), _records(tmp_path / "accum")
    assert [r["tokens"] for r in big] == [r["tokens"] for r in accum]
    big_loss, accum_loss = [r["loss"] for r in big], [r["loss"] for r in accum]
    assert len(big_loss) == 10
    assert accum_loss == pytest.approx(big_loss, abs=1e-5, rel=0)
    assert [r["grad_norm"] for r in accum] == pytest.approx([r["grad_norm"] for r in big], rel=1e-4)
    _assert_same_weights(
        load_model(tmp_path / "accum").state_dict(), load_model(tmp_path / "big").state_dict(), atol=1e-5
    )


# ---------------------------------------------------------------------------------------------
# (6) families, precision, schedules and what each log step records


def test_llama_in_bf16_with_wsd_schedule_lowers_loss(shards, tmp_path):
    model = {"flavour": "debug", "n_layer": 1, "n_head": 2, "d_model": 32}
    sections = train_sections(
        model=model, precision="bf16", schedule="wsd", decay_fraction=0.5, cooldown="1-sqrt", max_steps=20, log_every=2
    )
    result = run(RunConfig.of(sections), shards, tmp_path / "run")
    records = _records(tmp_path / "run")
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert [r["lr"] for r in records] == pytest.approx(
        [
            lr_at(
                r["step"] - 1,
                lr=1e-2,
                min_lr=1e-3,
                warmup_steps=2,
                max_steps=20,
                kind="wsd",
                decay_fraction=0.5,
                cooldown="1-sqrt",
            )
            for r in records
        ]
    )
    assert records[4]["lr"] == 1e-2 and records[-1]["lr"] < 2e-3  # stable, then cooled down
    assert json.loads((tmp_path / "run" / "model_config.json").read_text())["family"] == "llama"
    assert result.n_params == load_model(tmp_path / "run").num_params(non_embedding=False)


def test_document_mask_reads_the_end_of_text_id_from_the_shards_and_trains(shards, tmp_path):
    """model.document_mask: the id the rows' documents end with comes from the shard manifest
    (kiln.data.shards.Documents) into the model the run trains and saves; a shard folder from before
    the manifest recorded it is an error that says to rerun the shard stage."""
    model = {"family": "llama", "n_layer": 1, "n_head": 2, "d_model": 32, "document_mask": True}
    run(RunConfig.of(train_sections(model=model, max_steps=10)), shards, tmp_path / "run")
    records = _records(tmp_path / "run")
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    saved = json.loads((tmp_path / "run" / "model_config.json").read_text())
    assert saved["document_mask"] is True and saved["eos_id"] == 0  # synthetic words end with 0
    old = tmp_path / "old-shards"
    shutil.copytree(shards, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["documents"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(KilnError, match="forcerun shard"):
        run(RunConfig.of(train_sections(model=model, max_steps=10)), old, tmp_path / "old-run")


def test_log_steps_record_throughput_memory_and_no_mfu_on_cpu(shards, tmp_path):
    result = run(RunConfig.of(train_sections(max_steps=4, log_every=2)), shards, tmp_path / "run")
    for r in _records(tmp_path / "run"):
        assert r["tokens_per_s"] > 0 and r["tflops"] > 0 and r["memory_mb"] > 0
        assert r["mfu"] is None and r["mfu_torchtitan"] is None  # no peak FLOP/s is known for a CPU
    assert result.tokens_per_s > 0 and result.tflops > 0 and result.mfu is None and result.mfu_torchtitan is None


def test_checkpoint_and_validation_time_is_left_out_of_tokens_per_s(shards, tmp_path, monkeypatch):
    """On a fake clock where a step takes 1 s, a checkpoint save 1,000 s and a validation 500 s: every
    log window and the steady rate read exactly one step's tokens per second."""
    from kiln.train import metrics
    from kiln.train import trainer as trainer_module

    now = [0.0]

    def advancing(fn, seconds):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            now[0] += seconds
            return out

        return wrapped

    monkeypatch.setattr(trainer_module, "Throughput", lambda *a, **k: metrics.Throughput(*a, **k, clock=lambda: now[0]))
    monkeypatch.setattr(trainer_module.Trainer, "train_step", advancing(trainer_module.Trainer.train_step, 1.0))
    monkeypatch.setattr(trainer_module.Trainer, "evaluate", advancing(trainer_module.Trainer.evaluate, 500.0))
    monkeypatch.setattr(checkpoint, "save", advancing(checkpoint.save, 1000.0))
    # checkpoints at 3 and 6 fall inside the log windows (2-4, 6-8); validation at 4 and 8
    result = run(
        RunConfig.of(train_sections(max_steps=8, log_every=2, checkpoint_every=3, eval_every=4)),
        shards,
        tmp_path / "run",
    )
    per_step = result.tokens_per_step
    assert [r["tokens_per_s"] for r in _records(tmp_path / "run")] == [per_step] * 4
    assert result.tokens_per_s == per_step


def test_batch_tokens_set_accumulation_and_must_divide(shards, tmp_path):
    result = run(
        RunConfig.of(train_sections(micro_batch=2, batch_tokens=8 * SEQ_LEN, max_steps=3)), shards, tmp_path / "run"
    )
    assert (result.grad_accum, result.tokens_per_step) == (4, 8 * SEQ_LEN)
    with pytest.raises(
        KilnError,
        match=r"train.batch_tokens: 100 is not a multiple of 1 ranks x "
        r"train.micro_batch 2 x shard.seq_len 16 = 32 tokens \(nearest that are: 96 or 128\)",
    ):
        train_sections(micro_batch=2, batch_tokens=100)


def test_wandb_offline_writes_under_the_run_folder(shards, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the config alone decides
    sections = train_sections(max_steps=3, log_every=1)
    sections["wandb"] = {"mode": "offline", "project": "kiln-test"}
    run(RunConfig.of(sections), shards, tmp_path / "run")
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inside inductor
def test_compiled_run_matches_eager_and_saves_plain_names(shards, tmp_path):
    """torch.compile (compiled in place) changes neither the losses nor the saved parameter names
    (no "_orig_mod." prefix: nanoGPT #325)."""
    run(RunConfig.of(train_sections(max_steps=4, log_every=1, compile=True)), shards, tmp_path / "compiled")
    run(RunConfig.of(train_sections(max_steps=4, log_every=1, compile=False)), shards, tmp_path / "eager")
    compiled, eager = _records(tmp_path / "compiled"), _records(tmp_path / "eager")
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], abs=1e-5, rel=0)
    _assert_same_weights(
        load_model(tmp_path / "compiled").state_dict(), load_model(tmp_path / "eager").state_dict(), atol=1e-5
    )


def test_each_rank_draws_its_own_dropout_stream_after_a_shared_init():
    from kiln.train.seeds import seed_everything, seed_rank_stream

    def draws(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        seed_everything(7)
        init = torch.rand(4)  # what every rank's model init draws
        seed_rank_stream(7, rank)
        return init, torch.rand(4)  # what dropout would draw

    (init0, drop0), (init1, drop1), (_, drop0b) = draws(0), draws(1), draws(0)
    assert torch.equal(init0, init1)  # same weights on every rank
    assert not torch.equal(drop0, drop1)  # different masks
    assert torch.equal(drop0, drop0b)  # and reproducible
