"""Batches: training order is a pure function of (seed, global sample index), the same rows per
step on any rank layout with the same global batch, ranks read disjoint rows, resume is exact (on
another rank count too), evaluation reads rows in stored order; no row of a shard is served before the shard's ids and
checksum have passed (an id past the vocabulary, a flipped byte, a swapped shard)."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest
import torch

from kiln.data.loader import ShardRows, TrainBatches, eval_batches, row_hash_sum
from kiln.data.shards import HEADER_BYTES, shard_split
from kiln.errors import KilnError
from kiln.io import write_json

ROW_LEN = 5
N_TRAIN, N_VAL = 53, 11


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """Row i of each split holds i*ROW_LEN .. i*ROW_LEN+ROW_LEN-1, so a row names its own index."""
    out = tmp_path_factory.mktemp("shards")
    splits = {
        split: shard_split(np.arange(n * ROW_LEN + 3, dtype=np.uint16), out, split, ROW_LEN, 8, vocab_size=1024)
        for split, n in (("train", N_TRAIN), ("val", N_VAL))
    }
    write_json(
        out / "manifest.json",
        {
            "seq_len": ROW_LEN - 1,
            "row_len": ROW_LEN,
            "dtype": "uint16",
            "vocab_size": 1000,
            "padded_vocab_size": 1024,
            "splits": splits,
        },
    )
    return out


@pytest.fixture(scope="module")
def train_rows(shard_dir):
    return ShardRows(shard_dir, "train")


def row_ids(batch: torch.Tensor) -> list[int]:
    assert batch.dtype == torch.int64 and batch.shape[1] == ROW_LEN
    first = batch[:, 0]
    # Each row is a run of consecutive ids: a row was read whole, from one place.
    assert torch.equal(batch, first[:, None] + torch.arange(ROW_LEN))
    return (first // ROW_LEN).tolist()


def take(loader: TrainBatches, n: int) -> list[list[int]]:
    return [row_ids(loader.next()) for _ in range(n)]


def test_shard_rows_spans_shards(train_rows):
    assert len(train_rows) == N_TRAIN
    assert len(train_rows.shards) == 7  # 53 rows in shards of 8
    idx = np.array([0, 7, 8, 15, 16, 52, 3, 8])
    assert row_ids(train_rows.take(idx)) == idx.tolist()


def test_order_is_a_pure_function_of_seed(train_rows):
    a = TrainBatches(train_rows, micro_batch=4, seed=3)
    b = TrainBatches(train_rows, micro_batch=4, seed=3)
    assert take(a, 40) == take(b, 40)
    c = TrainBatches(train_rows, micro_batch=4, seed=4)
    assert take(TrainBatches(train_rows, 4, seed=3), 13) != take(c, 13)


def test_epoch_is_a_permutation_and_epochs_roll_over(train_rows):
    loader = TrainBatches(train_rows, micro_batch=4, seed=1)
    assert loader.per_epoch == loader.steps_per_epoch == N_TRAIN // 4 == 13
    epoch0 = [r for b in take(loader, 13) for r in b]
    assert loader.epoch == 1 and loader.state_dict()["sample"] == 52
    assert len(set(epoch0)) == len(epoch0) == 52  # no row twice; one row left over this epoch
    epoch1 = [r for b in take(loader, 13) for r in b]
    assert loader.epoch == 2
    assert len(set(epoch1)) == 52 and epoch1 != epoch0
    assert epoch0 != sorted(epoch0)  # shuffled
    take(loader, 1)
    assert loader.state_dict()["sample"] == 2 * 52 + 4


def test_ranks_read_disjoint_rows_within_an_epoch(train_rows):
    ranks = [TrainBatches(train_rows, micro_batch=3, seed=9, rank=r, world=2) for r in range(2)]
    assert ranks[0].per_epoch == ranks[1].per_epoch == N_TRAIN // 6 == 8
    for _ in range(3):  # three epochs
        seen = [[r for b in take(loader, 8) for r in b] for loader in ranks]
        assert len(seen[0]) == len(seen[1]) == 24
        assert len(set(seen[0])) == 24 and len(set(seen[1])) == 24
        assert not set(seen[0]) & set(seen[1])
    # Rank r's micro-batch is the r-th slice of each step's global batch of the epoch permutation.
    perm = np.random.default_rng([9, 0]).permutation(N_TRAIN)
    fresh = TrainBatches(train_rows, micro_batch=3, seed=9, rank=1, world=2)
    assert take(fresh, 8) == [perm[6 * k + 3 : 6 * k + 6].tolist() for k in range(8)]


# (world, grad_accum, micro_batch): each a global batch of 8 rows
LAYOUTS = [(1, 1, 8), (1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 1, 2), (1, 8, 1), (8, 1, 1)]


def global_steps(rows, world: int, accum: int, micro: int, steps: int, seed: int = 2, state: dict | None = None):
    """The rows of each optimizer step (every rank's micro-batches, rank by rank), and each step's
    row-hash sum over the ranks, as a run on this layout reads them."""
    loaders = [TrainBatches(rows, micro, seed, rank=r, world=world, grad_accum=accum) for r in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(dict(state))
    out = [[r for loader in loaders for _ in range(accum) for r in row_ids(loader.next())] for _ in range(steps)]
    sums = [sum(s) for s in zip(*(loader.drain_step_sums() for loader in loaders))]
    return out, sums, loaders[0].state_dict()


def test_the_rows_of_a_step_do_not_depend_on_the_rank_layout(train_rows):
    # 53 rows hold 6 global batches of 8: 20 steps cross three epoch boundaries.
    reference, ref_sums, ref_state = global_steps(train_rows, 1, 1, 8, 20)
    assert len({r for step in reference[:6] for r in step}) == 48
    assert reference[6] != reference[0] and len(set(ref_sums)) == 20
    for world, accum, micro in LAYOUTS[1:]:
        steps, sums, state = global_steps(train_rows, world, accum, micro, 20)
        assert steps == reference, (world, accum, micro)
        assert sums == ref_sums and state == ref_state


@pytest.mark.parametrize("before, after", [((2, 1, 4), (1, 2, 4)), ((1, 2, 4), (2, 1, 4)), ((2, 2, 2), (4, 1, 2))])
@pytest.mark.parametrize("stop", [3, 6, 11])  # mid-epoch, at an epoch boundary, in the second epoch
def test_resume_on_another_rank_count_continues_the_same_rows(train_rows, before, after, stop):
    reference, ref_sums, _ = global_steps(train_rows, *before, 20)
    _, _, state = global_steps(train_rows, *before, stop)
    assert state == {"sample": stop * 8, "global_rows": 8, "seed": 2}
    resumed, sums, _ = global_steps(train_rows, *after, 20 - stop, state=state)
    assert resumed == reference[stop:] and sums == ref_sums[stop:]


def test_row_hash_sum_tells_rows_apart_and_ignores_their_order(train_rows):
    a, b = train_rows.take(np.array([1, 2, 3])), train_rows.take(np.array([3, 1, 2]))
    assert row_hash_sum(a) == row_hash_sum(b)
    assert row_hash_sum(a) != row_hash_sum(train_rows.take(np.array([1, 2, 4])))
    swapped = a.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]  # the same tokens in another order
    assert row_hash_sum(swapped) != row_hash_sum(a)


@pytest.mark.parametrize("stop", [0, 5, 13, 14, 30])
def test_state_dict_resumes_exact_batches(train_rows, stop):
    uninterrupted = TrainBatches(train_rows, micro_batch=4, seed=5)
    take(uninterrupted, stop)
    state = uninterrupted.state_dict()
    assert state == {"sample": 4 * stop, "global_rows": 4, "seed": 5}
    expected = take(uninterrupted, 20)

    resumed = TrainBatches(train_rows, micro_batch=4, seed=5)
    take(resumed, 3)  # wherever it was, the state wins
    resumed.load_state_dict(dict(state))
    assert take(resumed, 20) == expected


def test_load_state_dict_refuses_other_seed_or_global_batch(train_rows):
    state = TrainBatches(train_rows, micro_batch=2, seed=5, world=1).state_dict()
    with pytest.raises(KilnError, match="seed 5 and a global batch of 2 rows; this run has seed 6 and 2 rows"):
        TrainBatches(train_rows, micro_batch=2, seed=6).load_state_dict(state)
    with pytest.raises(
        KilnError,
        match=r"seed 5 and a global batch of 2 rows; this run has seed 5 and 4 rows "
        r"\(2 ranks x 1 x 2\)",
    ):
        TrainBatches(train_rows, micro_batch=2, seed=5, rank=0, world=2).load_state_dict(state)
    with pytest.raises(KilnError, match="start the run over"):  # a checkpoint of the per-rank order
        TrainBatches(train_rows, micro_batch=2, seed=5).load_state_dict({"epoch": 0, "batch": 3, "seed": 5, "world": 1})


def test_state_dict_is_taken_between_steps(train_rows):
    loader = TrainBatches(train_rows, micro_batch=2, seed=5, grad_accum=2)
    loader.next()
    with pytest.raises(RuntimeError, match="middle of a step"):
        loader.state_dict()
    loader.next()
    assert loader.state_dict()["sample"] == 4


def test_too_few_rows_for_one_batch_raises(train_rows):
    with pytest.raises(
        KilnError,
        match=r"53 training rows cannot fill one global batch of 60 rows \(2 ranks x "
        r"1 micro-batches x train.micro_batch 30\)",
    ):
        TrainBatches(train_rows, micro_batch=30, seed=0, world=2)


def test_eval_batches_cover_rows_in_order_or_spread_over_them(shard_dir):
    rows = ShardRows(shard_dir, "val")
    assert len(rows) == N_VAL
    batches = [row_ids(b) for b in eval_batches(rows, micro_batch=4, max_batches=100)]
    assert [len(b) for b in batches] == [4, 4, 3]
    assert [r for b in batches for r in b] == list(range(N_VAL))
    # Fewer batches than the split holds: rows spread evenly over it, in order.
    spread = [row_ids(b) for b in eval_batches(rows, micro_batch=2, max_batches=2)]
    assert spread == [[0, 2], [5, 8]]
    # Two ranks split the rows between them, each in stored order, together covering all.
    shares = [[r for b in eval_batches(rows, 2, 100, rank=k, world=2) for r in row_ids(b)] for k in range(2)]
    assert shares == [list(range(0, N_VAL, 2)), list(range(1, N_VAL, 2))]


# ---------------------------------------------------------------------------------------------
# Shard checks before use (ids against the manifest's vocab_size, sha256 against the manifest)


@pytest.fixture()
def own_shards(shard_dir, tmp_path):
    """A copy of the shard folder this test may corrupt."""
    return shutil.copytree(shard_dir, tmp_path / "shards")


def _poke(path, token: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 2 * token : HEADER_BYTES + 2 * token + 2] = struct.pack("<H", value)
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_refused_before_its_shard_serves_a_row(own_shards):
    path = own_shards / "train-00002.bin"  # rows 16..23
    entry = ShardRows(own_shards, "train", verify=False).manifest["splits"]["train"]["shards"][2]
    _poke(path, 7, 16 * ROW_LEN + 6)  # was 16*ROW_LEN + 7: still a valid id, only the hash can tell
    rows = ShardRows(own_shards, "train", verify_threads=0)  # no background: only what take() needs
    assert row_ids(rows.take(np.array([0, 15, 24, 52]))) == [0, 15, 24, 52]  # other shards are served
    with pytest.raises(KilnError) as info:
        rows.take(np.array([3, 17]))
    message = str(info.value)
    assert str(path) in message and f"manifest says {entry['sha256']}" in message and "sha256 " in message
    with pytest.raises(KilnError, match="sha256"):  # and it stays refused
        rows.take(np.array([0]))


def test_an_id_past_the_vocabulary_names_file_offset_and_values(own_shards):
    # 1000 is below the header's padded size (1024), so only the tokenizer's vocab_size catches it.
    _poke(own_shards / "train-00003.bin", 11, 1000)
    rows = ShardRows(own_shards, "train", verify_threads=0)
    with pytest.raises(KilnError) as info:
        rows.take(np.array([25]))
    message = str(info.value)
    assert str(own_shards / "train-00003.bin") in message
    assert f"token 11 (byte offset {HEADER_BYTES + 22}) is id 1000, expected ids below the vocab size 1000" in message


def test_a_shard_swapped_for_another_valid_one_is_refused(own_shards):
    shutil.copyfile(own_shards / "train-00004.bin", own_shards / "train-00001.bin")  # same header and size
    rows = ShardRows(own_shards, "train", verify_threads=0)
    with pytest.raises(KilnError, match=r"train-00001.bin: sha256 [0-9a-f]{64}, manifest says [0-9a-f]{64}"):
        rows.take(np.array([8]))


def test_background_checks_stop_the_stream_before_the_bad_shard_comes_up(own_shards):
    _poke(own_shards / "train-00006.bin", 0, 999)  # the last shard; rows 48..52
    rows = ShardRows(own_shards, "train", verify_threads=1)
    rows.checks.wait()  # the background thread has gone through the shards and found it
    assert rows.checks.ok.tolist() == [True] * 6 + [False]
    with pytest.raises(KilnError, match="train-00006.bin: sha256"):
        rows.take(np.array([0]))  # a row of a good shard: the run stops now, not when row 48 comes up


def test_intact_shards_pass_in_the_background_and_stop_being_checked(shard_dir):
    rows = ShardRows(shard_dir, "train", verify_threads=2)
    rows.checks.wait()
    assert rows.checks.complete and rows.checks.ok.all()
    assert row_ids(rows.take(np.arange(N_TRAIN))) == list(range(N_TRAIN))


def test_a_shard_that_passed_is_not_read_again_unless_it_changed(own_shards):
    first = ShardRows(own_shards, "train", verify_threads=1)
    first.checks.wait()
    assert first.checks.complete
    again = ShardRows(own_shards, "train", verify_threads=0)  # no thread: only a cache could pass it
    assert again.checks.complete and again.checks.ok.all()
    _poke(own_shards / "train-00005.bin", 2, 999)  # rewritten since: checked again, and refused
    changed = ShardRows(own_shards, "train", verify_threads=0)
    assert not changed.checks.complete and changed.checks.ok.sum() == 6
    with pytest.raises(KilnError, match="train-00005.bin: sha256"):
        changed.take(np.array([40]))


def _node_ranks(shards, monkeypatch, tmp_path) -> list[ShardRows]:
    """The train rows as two ranks of one node build them under torchrun (LOCAL_RANK,
    LOCAL_WORLD_SIZE and the job's run id from the environment), stamps in tmp_path. Nothing has
    passed in this process before (loader.forget_checked) and no background thread runs: each rank
    checks what its take() needs."""
    import tempfile

    from kiln.data import loader

    loader.forget_checked()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "node-share-test")
    ranks = []
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        ranks.append(ShardRows(shards, "train", verify_threads=0))
    return ranks


def _take_all_in_threads(ranks: list[ShardRows]) -> list[BaseException | None]:
    import threading

    errors: list[BaseException | None] = [None, None]

    def take(r):
        try:
            ranks[r].take(np.arange(N_TRAIN))
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            errors[r] = exc

    threads = [threading.Thread(target=take, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def test_the_ranks_of_a_node_read_and_hash_each_shard_once_between_them(own_shards, monkeypatch, tmp_path):
    from kiln.data import loader

    read = []
    real = loader.verify_shard
    monkeypatch.setattr(loader, "verify_shard", lambda path, *a: (read.append(path.name), real(path, *a))[1])
    ranks = _node_ranks(own_shards, monkeypatch, tmp_path)
    assert _take_all_in_threads(ranks) == [None, None]
    assert sorted(read) == sorted(p.name for p in own_shards.glob("train-*.bin"))  # 7 shards, each once
    assert all(r.checks.complete for r in ranks)


def test_a_bad_shard_another_rank_of_the_node_checked_is_refused_with_its_message(own_shards, monkeypatch, tmp_path):
    _poke(own_shards / "train-00002.bin", 0, 999)  # shard 2: local rank 0's (2 % 2)
    errors = _take_all_in_threads(_node_ranks(own_shards, monkeypatch, tmp_path))
    assert all(isinstance(e, KilnError) and "train-00002.bin: sha256" in str(e) for e in errors), errors


def test_local_rank_0_removes_the_stamp_folders_of_agents_no_longer_alive(monkeypatch, tmp_path):
    """A job's stamps outlive it (no rank knows when the node's others are done): the next job's local
    rank 0 removes the folders named after a torchrun agent that has exited, not a live one's, and
    the other local ranks remove nothing."""
    import subprocess
    import sys
    import tempfile

    from kiln.data.loader import NodeShare

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{NodeShare.PREFIX}run-a-{gone.pid}"
    live = tmp_path / f"{NodeShare.PREFIX}run-b-{os.getpid()}"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "stamp").write_text("passed")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert NodeShare.from_env().local_rank == 1 and dead.exists() and live.exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    share = NodeShare.from_env()
    assert not dead.exists() and live.exists() and share.folder.parent == tmp_path
