"""The eval stage's memory does not grow with the train split, and validation never holds the logits.

- The unigram counts and the contamination check stream train.bin a piece at a time
  (kiln.eval.stream): their results are exactly those of the whole-array computation (np.bincount;
  a set of every train 13-gram), and the memory they allocate (numpy reports its buffers to
  tracemalloc) is the same for a split four times as long.
- Validation (Trainer.evaluate, and the eval stage's batches_loss) goes through training's chunked
  loss: no tensor of every position's logits is ever made, and the loss is the full-logit one.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from synthetic import PADDED_VOCAB, TINY_MODEL, train_sections, write_shards
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.config.run_config import RunConfig
from kiln.data.loader import eval_batches
from kiln.errors import KilnError
from kiln.eval import contamination
from kiln.eval.perplexity import batches_loss, unigram_counts
from kiln.eval.stream import TokenFile
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _token_file(path, ids: np.ndarray, dtype: str = "uint16") -> TokenFile:
    ids.astype(dtype).tofile(path)
    return TokenFile(path, dtype)


def test_chunks_cover_the_file_once_with_their_overlap(tmp_path):
    ids = np.arange(1003) % 500
    train = _token_file(tmp_path / "train.bin", ids)
    assert len(train) == 1003
    pieces = list(train.chunks(100, overlap=12))
    assert len(pieces) == 11 and all(not isinstance(p, np.memmap) for p in pieces)
    assert np.array_equal(np.concatenate([pieces[0]] + [p[12:] for p in pieces[1:]]), ids)
    assert all(np.array_equal(a[-12:], b[:12]) for a, b in zip(pieces, pieces[1:]))


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_unigram_counts_streamed_equal_bincount_exactly(tmp_path, dtype):
    rng = np.random.default_rng(0)
    vocab = 70_000 if dtype == "uint32" else 512
    ids = rng.zipf(1.3, size=50_001) % vocab  # a skewed distribution, a ragged last piece
    train = _token_file(tmp_path / "train.bin", ids, dtype)
    counts = unigram_counts(train, vocab, chunk=4096)
    assert counts.dtype == np.int64 and counts.shape == (vocab,)
    assert np.array_equal(counts, np.bincount(ids, minlength=vocab))


def test_unigram_counts_name_an_id_outside_the_vocabulary(tmp_path):
    train = _token_file(tmp_path / "train.bin", np.array([1, 2, 600]))
    with pytest.raises(KilnError, match="token id 600 is outside the padded vocabulary of 512"):
        unigram_counts(train, 512)


def test_contamination_is_exact_whatever_the_chunk(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 5000, size=3000)
    train = _token_file(tmp_path / "train.bin", ids)
    grams = {tuple(ids[i : i + 13]) for i in range(len(ids) - 12)}
    items = [
        list(ids[100:160]),  # inside the split
        list(ids[250:270]) + [7000 + i for i in range(20)],  # one part seen, one not
        list(ids[1019:1040]),  # across a piece boundary for chunk 1024
        [7000 + i for i in range(40)],
        [1, 2, 3],
    ]  # never seen; shorter than a 13-gram
    expected_found = [sum(tuple(it[i : i + 13]) in grams for i in range(len(it) - 12)) for it in items]
    n_grams = sum(max(len(it) - 12, 0) for it in items)
    for chunk in (64, 1024, 1 << 22):
        result = contamination.overlaps(train, {"eval": items, "none": []}, chunk=chunk)
        assert result["eval"] == {
            "items": 5,
            "contaminated_items": 3,
            "contaminated_fraction": 3 / 5,
            "ngram_overlap": sum(expected_found) / n_grams,
        }
        assert result["none"]["items"] == 0 and result["none"]["ngram_overlap"] is None


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_of_the_train_statistics_does_not_grow_with_the_split(tmp_path):
    """The whole-split versions allocate 8 bytes a token (np.bincount's int64 copy, one hash per
    13-gram): 16 MB at 1x here, 64 MB at 4x. Streamed, both sizes allocate the same."""
    rng = np.random.default_rng(2)
    n = 1 << 21
    items = {"val": [list(rng.integers(0, 512, size=200)) for _ in range(20)]}
    peaks = {}
    for scale in (1, 4):
        train = _token_file(tmp_path / f"train-{scale}.bin", rng.integers(0, 512, size=n * scale))
        peaks[scale] = (
            _peak_bytes(lambda: unigram_counts(train, 512, chunk=1 << 17)),
            _peak_bytes(lambda: contamination.overlaps(train, items, chunk=1 << 17)),
        )
    for one, four in zip(peaks[1], peaks[4]):
        assert four < one * 1.2 + (1 << 20), peaks
        assert four < 8 * n, peaks  # far below the 4x split's int64 size (8 bytes x 4n tokens)


class _LogitWatch(TorchDispatchMode):
    """The most positions any new tensor of vocabulary-wide rows held (numel / V of an output whose
    last dimension is V), over every op run under it; views (the head weight transposed, a
    flattened chunk) hold no memory of their own and are left out."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def _full_logit_loss(model, batches) -> float:
    """The old validation: every position's logits, in fp32, one cross-entropy per batch."""
    with torch.no_grad():
        losses = [F.cross_entropy(model(b[:, :-1])[0].float().flatten(0, 1), b[:, 1:].flatten()) for b in batches]
    return float(torch.stack(losses).mean())


@pytest.fixture
def chunk_of_16_rows(monkeypatch):
    """Loss chunks of 16 positions (the budget a flagship vocabulary gets, scaled to V = 64)."""
    monkeypatch.setattr("kiln.config.models.LOSS_CHUNK_ELEMENTS", 16 * PADDED_VOCAB)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_validation_loss_is_chunked_and_equals_the_full_logit_loss(tmp_path, chunk_of_16_rows, family):
    shards = write_shards(tmp_path / "shards")
    trainer = Trainer(
        RunConfig.of(train_sections({**TINY_MODEL, "family": family}, micro_batch=8, eval_batches=2)), shards
    )
    batches = list(eval_batches(trainer.val_rows, 8, 2))
    watch = _LogitWatch(PADDED_VOCAB)
    with watch:
        loss = trainer.evaluate()
    assert 0 < watch.rows <= 16  # never the batch's 8 x 16 = 128 positions at once
    assert loss == pytest.approx(_full_logit_loss(trainer.model, batches), rel=1e-5)
    assert trainer.model.training  # evaluate hands the model back in train mode

    trainer.model.eval()
    watch = _LogitWatch(PADDED_VOCAB)
    with watch:
        mean, n = batches_loss(trainer.model, batches)  # the eval stage's held-out loss
    assert 0 < watch.rows <= 16 and n == 2 * 8 * 16
    assert mean == pytest.approx(_full_logit_loss(trainer.model, batches), rel=1e-5)
