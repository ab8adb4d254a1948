"""What the train stage trains on, in-process on CPU (issue 11, items 2 and 7): a corrupt shard stops
the run before any step uses it, naming the file, offset, expected and actual values; a resume on
another rank layout with the same global batch trains on the same rows per step, across an epoch
boundary (the batch hashes in metrics.jsonl); a checkpoint of another shard set, tokenizer, model,
seed or global batch is refused, naming what changed. (Two ranks resumed on one: test_distributed.)
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import SEQ_LEN, TRAIN_ROWS, VOCAB, train_sections, write_shards
from train_stage import run

from kiln.config.run_config import RunConfig
from kiln.data.loader import ShardRows, TrainBatches
from kiln.data.shards import HEADER_BYTES
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.model.build import load_model
from kiln.train import checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
GLOBAL_BATCH = 8 * SEQ_LEN  # 8 rows a step: the 64 train rows are an epoch of 8 steps
STEPS = 12  # crosses the epoch boundary after step 8
LONG = dict(max_steps=STEPS, log_every=1, eval_every=100, checkpoint_every=6, keep_checkpoints=2)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _resume_from(folder: Path, out: Path) -> Path:
    """out/checkpoints holding a copy of one checkpoint folder (as a rerun would find it)."""
    shutil.copytree(folder, out / "checkpoints" / folder.name)
    (out / "checkpoints" / checkpoint.MARKER).write_text(folder.name + "\n")
    return out


# ---------------------------------------------------------------------------------------------
# Corrupt shards never reach a step


def _first_step_row(shards: Path) -> tuple[int, int]:
    """(shard, row within it) of the first row step 1 trains on (micro-batch 8, the tests' seed) from
    one of the two 24-row shards (train-00000 and train-00001: each can stand in for the other)."""
    rows = ShardRows(shards, "train", verify=False)
    step1 = TrainBatches(rows, 8, train_sections()["train"]["seed"]).step_indices()
    first = int(next(i for i in step1 if i < 48))
    shard = int(np.searchsorted(rows.starts, first, side="right") - 1)
    return shard, first - int(rows.starts[shard])


def _set_token(path: Path, token: int, value: int) -> int:
    data = bytearray(path.read_bytes())
    at = HEADER_BYTES + 2 * token
    old = struct.unpack_from("<H", data, at)[0]
    data[at : at + 2] = struct.pack("<H", value)
    path.write_bytes(bytes(data))
    return old


@pytest.mark.parametrize("fault", ["id past the embedding", "byte flip to a valid id", "shard swapped"])
def test_a_corrupt_shard_stops_the_run_before_a_step_uses_it(shards, tmp_path, fault):
    corrupt = shutil.copytree(shards, tmp_path / "shards")
    shard, row = _first_step_row(corrupt)
    path = corrupt / f"train-{shard:05d}.bin"
    token = row * (SEQ_LEN + 1) + 3
    if fault == "id past the embedding":  # was a bare IndexError inside nn.Embedding, naming no file
        _set_token(path, token, 200)
        expected = (
            f"token {token} (byte offset {HEADER_BYTES + 2 * token}) is id 200, expected ids below the "
            f"vocab size {VOCAB}"
        )
    elif fault == "byte flip to a valid id":
        old = _set_token(path, token, 0)
        _set_token(path, token, old ^ 1)  # the low bit of a valid id: still below the vocabulary
        expected = "manifest says " + read_json(corrupt / "manifest.json")["splits"]["train"]["shards"][shard]["sha256"]
    else:  # the other 24-row shard copied over it: header, size and ids all valid
        shutil.copyfile(corrupt / f"train-{1 - shard:05d}.bin", path)
        expected = "manifest says"
    out = tmp_path / "run"
    with pytest.raises(KilnError) as info:
        run(RunConfig.of(train_sections(max_steps=4, log_every=1, checkpoint_every=1)), corrupt, out)
    assert str(path) in str(info.value) and expected in str(info.value)
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()
    assert not list(out.glob("checkpoints/step-*")), "a step ran on the corrupt shard"


# ---------------------------------------------------------------------------------------------
# The same rows per step on another layout, across an epoch boundary


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory) -> Path:
    """12 steps of 1 rank x 1 micro-batch of 8 rows, a checkpoint at step 6."""
    out = tmp_path_factory.mktemp("reference")
    run(RunConfig.of(train_sections(micro_batch=8, batch_tokens=GLOBAL_BATCH, **LONG)), shards, out)
    return out


def test_resume_with_more_accumulation_trains_on_the_same_rows(shards, reference, tmp_path):
    ref = _records(reference)
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1))
    assert len({r["batch_hash"] for r in ref}) == STEPS  # one hash per step, all different
    assert TRAIN_ROWS // 8 == 8  # so steps 9-12 are the second epoch
    out = _resume_from(reference / "checkpoints" / "step-0000006", tmp_path / "resumed")
    result = run(RunConfig.of(train_sections(micro_batch=4, batch_tokens=GLOBAL_BATCH, **LONG)), shards, out)
    assert result.grad_accum == 2
    resumed = _records(out)[-6:]
    assert [r["step"] for r in resumed] == list(range(7, STEPS + 1))
    assert [r["batch_hash"] for r in resumed] == [r["batch_hash"] for r in ref[6:]]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in ref[6:]], abs=1e-5, rel=0)
    ours, theirs = load_model(out).state_dict(), load_model(reference).state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)


def test_the_batch_hash_follows_the_rows(shards, reference, tmp_path):
    """Another seed (another data order) gives other hashes from the first step on."""
    sections = train_sections(micro_batch=8, batch_tokens=GLOBAL_BATCH, **LONG | {"max_steps": 3})
    sections["train"]["seed"] += 1
    run(RunConfig.of(sections), shards, tmp_path / "other")
    other = [r["batch_hash"] for r in _records(tmp_path / "other")]
    assert not set(other) & {r["batch_hash"] for r in _records(reference)}


# ---------------------------------------------------------------------------------------------
# A checkpoint of another run, asked for by name, is refused, naming what changed


def _changed_shards(shards: Path, tmp_path: Path, what: str) -> Path:
    if what == "tokenizer":  # the same ids, recorded as made with another tokenizer file
        out = shutil.copytree(shards, tmp_path / "other-shards")
        manifest = read_json(out / "manifest.json")
        write_json(out / "manifest.json", manifest | {"tokenizer_sha256": "f" * 64})
        return out
    stream = np.random.default_rng(5).integers(1, VOCAB, size=TRAIN_ROWS * (SEQ_LEN + 1) + 5).astype(np.uint16)
    return write_shards(tmp_path / "other-shards", train_tokens=stream)


@pytest.mark.parametrize(
    "what, sections, message",
    [
        ("shards", {}, r"train shards: train-00000.bin sha256 [0-9a-f]{12}… in the checkpoint, [0-9a-f]{12}… now"),
        ("tokenizer", {}, r"tokenizer: sha256 None in the checkpoint, f{12}… now"),
        (None, {"model": {"n_layer": 1, "n_head": 2, "d_model": 16}}, r"model.d_model: 32 in the checkpoint, 16 now"),
        (
            None,
            {"micro_batch": 4, "batch_tokens": 4 * SEQ_LEN},
            rf"train.batch_tokens: {8 * SEQ_LEN} in the checkpoint, {4 * SEQ_LEN} now",
        ),
        (None, {"seed": 8}, r"seed: 7 in the checkpoint, 8 now"),  # train.seed, the model seed
    ],
)
def test_a_checkpoint_of_another_run_is_refused_naming_what_changed(
    shards, reference, tmp_path, what, sections, message, monkeypatch
):
    """Asked for by name (KILN_RESUME_FROM), a checkpoint of other data or settings is an error naming
    what changed; without a name such a run starts over (tests/unit/train/test_trainer.py)."""
    monkeypatch.setenv(checkpoint.RESUME_ENV, "step-0000012")
    data = _changed_shards(shards, tmp_path, what) if what else shards
    out = _resume_from(reference / "checkpoints" / "step-0000012", tmp_path / "run")
    sections = dict(sections)
    model, seed = sections.pop("model", None), sections.pop("seed", None)
    train = {"micro_batch": 8, "batch_tokens": GLOBAL_BATCH} | LONG | sections | {"max_steps": 14}
    config = train_sections(model=model, **train)
    if seed is not None:
        config["train"]["seed"] = seed
    with pytest.raises(KilnError, match=message) as info:
        run(RunConfig.of(config), data, out)
    assert "step-0000012/state.pt: checkpoint fingerprint does not match this run's" in str(info.value)


def test_another_micro_batch_with_the_same_global_batch_is_the_same_run(shards, reference, tmp_path):
    out = _resume_from(reference / "checkpoints" / "step-0000012", tmp_path / "run")
    result = run(
        RunConfig.of(train_sections(micro_batch=2, batch_tokens=GLOBAL_BATCH, **LONG | {"max_steps": 13})), shards, out
    )
    assert result.grad_accum == 4 and [r["step"] for r in _records(out)][-1] == 13
