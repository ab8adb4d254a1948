"""Binary shards: exact round trips, headers that refuse bad files by name, and checked manifests."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kiln.data.shards import (
    HEADER_BYTES,
    MAGIC,
    VERSION,
    Documents,
    open_shard,
    row_model,
    shard_split,
    verify_shards,
    write_shard,
    write_shards,
)
from kiln.errors import KilnError
from kiln.io import sha256_file, write_json


@pytest.mark.parametrize("dtype, vocab", [(np.uint16, 512), (np.uint16, 65536), (np.uint32, 100_000)])
def test_write_open_roundtrip(tmp_path, dtype, vocab):
    rng = np.random.default_rng(0)
    rows = rng.integers(0, vocab, size=(13, 9)).astype(dtype)
    rows[0, 0], rows[-1, -1] = 0, vocab - 1
    path = tmp_path / "s.bin"
    write_shard(path, rows, vocab_size=vocab)
    assert path.stat().st_size == HEADER_BYTES + rows.size * np.dtype(dtype).itemsize
    back = open_shard(path)
    assert back.shape == (13, 9)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, rows)
    magic, version, itemsize, n_tokens, row_len, vocab_size = struct.unpack_from("<8sIIQQQ", path.read_bytes())
    assert (magic, version, itemsize, n_tokens, row_len, vocab_size) == (MAGIC, VERSION, rows.itemsize, 117, 9, vocab)


def test_write_shard_rejects_1d(tmp_path):
    with pytest.raises(ValueError, match="2-D"):
        write_shard(tmp_path / "s.bin", np.zeros(5, dtype=np.uint16), 10)


@pytest.fixture()
def shard(tmp_path):
    path = tmp_path / "train-00000.bin"
    write_shard(path, np.arange(40, dtype=np.uint16).reshape(4, 10), vocab_size=64)
    return path


def test_bad_magic_names_file_and_offset(shard):
    data = bytearray(shard.read_bytes())
    data[0:8] = b"NOTASHRD"
    shard.write_bytes(bytes(data))
    with pytest.raises(KilnError) as info:
        open_shard(shard)
    message = str(info.value)
    assert str(shard) in message and "offset 0" in message and "KILNSHRD" in message and "NOTASHRD" in message


def test_wrong_version_names_file_and_expected_value(shard):
    data = bytearray(shard.read_bytes())
    data[8:12] = struct.pack("<I", VERSION + 1)
    shard.write_bytes(bytes(data))
    with pytest.raises(KilnError) as info:
        open_shard(shard)
    message = str(info.value)
    assert str(shard) in message and "offset 8" in message
    assert f"version {VERSION + 1}, expected {VERSION}" in message


def test_bad_itemsize_names_offset(shard):
    data = bytearray(shard.read_bytes())
    data[12:16] = struct.pack("<I", 3)
    shard.write_bytes(bytes(data))
    with pytest.raises(KilnError, match=r"offset 12: itemsize 3"):
        open_shard(shard)


def test_truncated_data_names_file_and_expected_size(shard):
    full = shard.read_bytes()
    shard.write_bytes(full[:-3])
    with pytest.raises(KilnError) as info:
        open_shard(shard)
    message = str(info.value)
    assert str(shard) in message
    assert f"size {len(full) - 3} bytes, expected {len(full)}" in message and "truncated" in message


def test_padded_data_is_refused(shard):
    shard.write_bytes(shard.read_bytes() + b"\0\0")
    with pytest.raises(KilnError, match="truncated or padded"):
        open_shard(shard)


def test_truncated_header_names_file(shard):
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(KilnError) as info:
        open_shard(shard)
    message = str(info.value)
    assert str(shard) in message and "truncated header" in message and f"expected {HEADER_BYTES}" in message


def test_row_len_not_dividing_tokens_is_refused(shard):
    data = bytearray(shard.read_bytes())
    data[24:32] = struct.pack("<Q", 7)  # 40 tokens are not whole rows of 7
    shard.write_bytes(bytes(data))
    with pytest.raises(KilnError, match=r"offset 24: 40 tokens .* rows of 7"):
        open_shard(shard)


def test_shard_split_rejects_out_of_vocab_id_naming_file_offset_and_values(tmp_path):
    tokens = np.arange(100, dtype=np.uint16) % 50
    tokens[77] = 50
    tokens[90] = 999
    source = tmp_path / "train.bin"
    tokens.tofile(source)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KilnError) as info:
        shard_split(
            np.memmap(source, dtype=np.uint16, mode="r"), out, "train", row_len=10, rows_per_shard=4, vocab_size=50
        )
    message = str(info.value)
    assert str(source) in message
    assert "token 77 (byte offset 154) is id 50, expected ids below the vocab size 50" in message
    with pytest.raises(KilnError, match=r"train tokens: token 77 .* is id 50"):
        shard_split(tokens, out, "train", row_len=10, rows_per_shard=8, vocab_size=50)


def test_shard_split_rejects_stream_shorter_than_a_row(tmp_path):
    with pytest.raises(KilnError, match="val split has 5 tokens, fewer than one row of 6"):
        shard_split(np.zeros(5, dtype=np.uint16), tmp_path, "val", row_len=6, rows_per_shard=4, vocab_size=8)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_shard_split_rows_are_back_to_back_cuts(tmp_path, dtype):
    n, row_len, per_shard = 1010, 17, 10
    tokens = (np.arange(n) * 7 % 70_000 if dtype == np.uint32 else np.arange(n) % 60_000).astype(dtype)
    entry = shard_split(tokens, tmp_path, "train", row_len, per_shard, vocab_size=70_000)
    n_rows = n // row_len
    assert entry["rows"] == n_rows == 59
    assert entry["tokens"] == n_rows * row_len
    assert entry["dropped_tokens"] == n - n_rows * row_len == 7
    assert [s["file"] for s in entry["shards"]] == [f"train-{i:05d}.bin" for i in range(6)]
    assert [s["rows"] for s in entry["shards"]] == [10] * 5 + [9]
    rows = np.concatenate([open_shard(tmp_path / s["file"]) for s in entry["shards"]])
    assert rows.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(rows.reshape(-1), tokens[: n_rows * row_len])
    for s in entry["shards"]:
        assert s["sha256"] == sha256_file(tmp_path / s["file"])


def _sharded(tmp_path):
    tokens = np.arange(500, dtype=np.uint16) % 97
    splits = {
        "train": shard_split(tokens, tmp_path, "train", 11, 8, vocab_size=128),
        "val": shard_split(tokens[:100], tmp_path, "val", 11, 8, vocab_size=128),
    }
    return {"row_len": 11, "splits": splits}


def test_verify_shards_catches_flipped_byte(tmp_path):
    manifest = _sharded(tmp_path)
    path = tmp_path / "train-00002.bin"
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 4] ^= 0x01  # the low byte of token 2: still a valid id
    path.write_bytes(bytes(data))
    open_shard(path)  # the header is intact: only the hash can tell
    with pytest.raises(KilnError) as info:
        verify_shards(tmp_path, manifest)
    message = str(info.value)
    assert str(path) in message and "sha256" in message
    assert manifest["splits"]["train"]["shards"][2]["sha256"] in message


def test_verify_shards_catches_row_count_mismatch(tmp_path):
    manifest = _sharded(tmp_path)
    manifest["splits"]["val"]["shards"][0]["rows"] += 1
    with pytest.raises(KilnError) as info:
        verify_shards(tmp_path, manifest)
    message = str(info.value)
    assert str(tmp_path / "val-00000.bin") in message and "8 rows, manifest says 9" in message


def test_verify_shards_catches_missing_or_truncated_shard(tmp_path):
    manifest = _sharded(tmp_path)
    path = tmp_path / "val-00001.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(KilnError, match="truncated"):
        verify_shards(tmp_path, manifest)


def test_verify_shards_catches_an_id_beyond_the_vocab_naming_offset_and_values(tmp_path):
    manifest = _sharded(tmp_path)
    path = tmp_path / "train-00001.bin"
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 2 * 5 : HEADER_BYTES + 2 * 6] = struct.pack("<H", 500)  # token 5 of the shard
    path.write_bytes(bytes(data))
    open_shard(path)  # header and size are fine
    with pytest.raises(KilnError) as info:
        verify_shards(tmp_path, manifest)
    message = str(info.value)
    assert str(path) in message and f"token 5 (byte offset {HEADER_BYTES + 10}) is id 500" in message
    assert "below the vocab size 128" in message


def test_verify_shards_reports_what_it_checked(tmp_path):
    assert verify_shards(tmp_path, _sharded(tmp_path)) == {
        "train": {"shards": 6, "rows": 45},
        "val": {"shards": 2, "rows": 9},
    }


def test_the_manifest_says_how_documents_end_and_a_model_with_document_mask_reads_it(tmp_path):
    """kiln.data.shards.Documents: pretokenize's eos_id and bos_id, carried into the shard manifest,
    and from there into the model a run trains on those rows (row_model); only a model with
    model.document_mask takes the id, and a manifest from before it was recorded says what to rerun."""
    tokens, shards = tmp_path / "tokens", tmp_path / "shards"
    tokens.mkdir()
    shards.mkdir()
    for split in ("train", "val"):
        np.arange(40, dtype=np.uint16).tofile(tokens / f"{split}.bin")
    meta = {"dtype": "uint16", "vocab_size": 60, "padded_vocab_size": 64, "splits": ["train", "val"], "sources": {}}
    write_json(tokens / "meta.json", meta | {"eos_id": 3, "bos_id": None})
    manifest = write_shards(tokens, shards, seq_len=7, rows_per_shard=10)
    assert Documents.of(manifest) == Documents(eos_id=3, bos_id=None)
    section = {"family": "llama", "n_layer": 1, "n_head": 2, "d_model": 16}
    assert row_model(section | {"document_mask": True}, manifest).eos_id == 3
    plain = row_model(section, manifest)
    assert (plain.vocab_size, plain.seq_len, plain.eos_id) == (64, 7, None)
    del manifest["documents"]
    assert row_model(section, manifest) == plain  # a run without the setting does not need the entry
    with pytest.raises(KilnError, match="forcerun shard"):
        row_model(section | {"document_mask": True}, manifest)
