"""Binary token shards: fixed-length rows that training memory-maps.

Layout of a shard file (little endian):
  bytes 0..255  header: magic b"KILNSHRD", version u32, itemsize u32 (2 = uint16, 4 = uint32),
                n_tokens u64, row_len u64, vocab_size u64, zero padding
  bytes 256..   n_tokens ids, n_tokens = rows * row_len
Each row holds seq_len + 1 consecutive tokens of the packed document stream: inputs are row[:-1],
targets row[1:]. Rows are cut back to back, so no token is stored twice; the few tokens after the
last full row of a split are dropped (counted in the manifest).

Opening a shard checks magic, version, dtype and that the file size matches the header (cheap);
`verify_shards` also checks every id against the vocabulary size and the sha256 of every shard
against the manifest. Errors name the file, the byte offset, and the expected and actual values.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.io import sha256_file

MAGIC = b"KILNSHRD"
VERSION = 1
HEADER_BYTES = 256
_HEADER = struct.Struct("<8sIIQQQ")
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def write_shard(path: Path, rows: np.ndarray, vocab_size: int) -> None:
    """Write a (n_rows, row_len) array of ids as one shard."""
    if rows.ndim != 2:
        raise ValueError(f"rows must be 2-D (n_rows, row_len), got shape {rows.shape}")
    dtype = _DTYPES[rows.dtype.itemsize]
    header = _HEADER.pack(MAGIC, VERSION, rows.dtype.itemsize, rows.size, rows.shape[1], vocab_size)
    with open(path, "wb") as f:
        f.write(header.ljust(HEADER_BYTES, b"\0"))
        np.ascontiguousarray(rows, dtype=dtype).tofile(f)


def open_shard(path: Path) -> np.ndarray:
    """Memory-map a shard as (n_rows, row_len) after checking its header against its size."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise KilnError(f"{path}: truncated header: {len(head)} bytes, expected {HEADER_BYTES}")
    magic, version, itemsize, n_tokens, row_len, _vocab = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise KilnError(f"{path}: offset 0: bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise KilnError(f"{path}: offset 8: version {version}, expected {VERSION}")
    if itemsize not in _DTYPES:
        raise KilnError(f"{path}: offset 12: itemsize {itemsize}, expected 2 or 4")
    expected = HEADER_BYTES + n_tokens * itemsize
    if size != expected:
        raise KilnError(
            f"{path}: size {size} bytes, expected {expected} "
            f"({n_tokens} tokens x {itemsize} bytes + {HEADER_BYTES} header): truncated or padded at offset {size}"
        )
    if row_len == 0 or n_tokens % row_len:
        raise KilnError(f"{path}: offset 24: {n_tokens} tokens is not a whole number of rows of {row_len}")
    data = np.memmap(path, dtype=_DTYPES[itemsize], mode="r", offset=HEADER_BYTES, shape=(n_tokens,))
    return data.reshape(-1, row_len)


def _check_ids(ids: np.ndarray, vocab_size: int, where: str, first: int, offset: int, itemsize: int) -> None:
    """KilnError naming where, the token index and byte offset of the first id >= vocab_size."""
    too_big = np.flatnonzero(ids >= vocab_size)
    if len(too_big):
        at = int(too_big[0])
        raise KilnError(
            f"{where}: token {first + at} (byte offset {offset + (first + at) * itemsize}) is id {int(ids[at])}, "
            f"expected ids below the vocab size {vocab_size}"
        )


def shard_split(
    tokens: np.ndarray, out_dir: Path, split: str, row_len: int, rows_per_shard: int, vocab_size: int
) -> dict:
    """Cut a split's token stream (a memmap of tokens/<split>.bin, say) into rows and write them as
    shards, one shard in memory at a time; return its manifest entry."""
    n_rows = len(tokens) // row_len
    if n_rows == 0:
        raise KilnError(
            f"shard: the {split} split has {len(tokens)} tokens, fewer than one row of {row_len} "
            "(shard.seq_len + 1); lower shard.seq_len or add data"
        )
    where = f"shard: {getattr(tokens, 'filename', None) or split + ' tokens'}"
    rows = tokens[: n_rows * row_len].reshape(n_rows, row_len)
    shards = []
    for index, start in enumerate(range(0, n_rows, rows_per_shard)):
        chunk = np.asarray(rows[start : start + rows_per_shard])
        _check_ids(chunk.reshape(-1), vocab_size, where, start * row_len, 0, tokens.dtype.itemsize)
        path = out_dir / f"{split}-{index:05d}.bin"
        write_shard(path, chunk, vocab_size)
        shards.append({"file": path.name, "rows": len(chunk), "sha256": sha256_file(path)})
    return {"rows": n_rows, "tokens": n_rows * row_len, "dropped_tokens": len(tokens) - n_rows * row_len,
            "shards": shards}


def verify_shards(shard_dir: Path, manifest: dict) -> dict:
    """Check every shard's header, size, ids (below the header's vocab size) and sha256 against the
    manifest; return counts per split."""
    checked = {}
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            path = Path(shard_dir) / shard["file"]
            rows = open_shard(path)
            if len(rows) != shard["rows"]:
                raise KilnError(f"{path}: {len(rows)} rows, manifest says {shard['rows']}")
            with open(path, "rb") as f:
                vocab_size = _HEADER.unpack_from(f.read(HEADER_BYTES))[5]
            flat = rows.reshape(-1)
            for first in range(0, len(flat), 1 << 24):
                _check_ids(flat[first : first + (1 << 24)], vocab_size, str(path), first, HEADER_BYTES,
                           rows.dtype.itemsize)
            actual = sha256_file(path)
            if actual != shard["sha256"]:
                raise KilnError(f"{path}: sha256 {actual}, manifest says {shard['sha256']}")
        checked[split] = {"shards": len(entry["shards"]), "rows": sum(s["rows"] for s in entry["shards"])}
    return checked
