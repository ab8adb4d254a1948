"""Binary token shards: fixed-length rows that training memory-maps.

Layout of a shard file (little endian):
  bytes 0..255  header: magic b"KILNSHRD", version u32, itemsize u32 (2 = uint16, 4 = uint32),
                n_tokens u64, row_len u64, vocab_size u64, zero padding
  bytes 256..   n_tokens ids, n_tokens = rows * row_len
Each row holds seq_len + 1 consecutive tokens of the packed document stream: inputs are row[:-1],
targets row[1:]. Rows are cut back to back, so no token is stored twice; the few tokens after the
last full row of a split are dropped (counted in the manifest).

Opening a shard checks magic, version, dtype and that the file size matches the header (cheap).
`verify_shard` reads a shard once, hashing each chunk and checking its ids below the vocabulary
size in the same pass, and compares rows and sha256 with the shard's manifest entry: training
(kiln.data.loader.ShardRows) runs it on every shard before serving one of its rows, and the
`verify` rule on a whole folder (`verify_shards`). Errors name the file, the byte offset, and the
expected and actual values.

The manifest also says how the rows' documents are delimited (`Documents`: the end-of-text id each ends
with, the BOS id each starts with), copied from pretokenize's meta.json, so that what trains on the
rows (model.document_mask: `row_model`) reads it from the folder it trains on.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kiln.config.models import ModelConfig, model_config
from kiln.data import faults
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file, write_json

MAGIC = b"KILNSHRD"
VERSION = 1
HEADER_BYTES = 256
_HEADER = struct.Struct("<8sIIQQQ")
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_VERIFY_CHUNK = 16 << 20  # bytes read, hashed and id-checked at a time: a multiple of both itemsizes


@dataclass(frozen=True)
class Documents:
    """How the documents sit in the rows: each ends with eos_id (the tokenizer's end-of-text token) and,
    when the tokenizer has a BOS, starts with bos_id. The manifest's "documents" entry."""

    eos_id: int
    bos_id: int | None

    KEY = "documents"

    @classmethod
    def of(cls, manifest: dict, where: Path | str = "manifest.json") -> Documents:
        if cls.KEY not in manifest:
            raise KilnError(
                f"{where}: no {cls.KEY} entry (the end-of-text id), which shard folders record since "
                "model.document_mask: rerun the shard stage (`snakemake --forcerun shard`)"
            )
        return cls(**manifest[cls.KEY])


def row_model(section: dict, manifest: dict) -> ModelConfig:
    """The model a config's model section means on the rows a shard manifest describes: their
    (padded) vocabulary and context, and with model.document_mask the id their documents end with."""
    eos_id = Documents.of(manifest).eos_id if section.get("document_mask") else None
    return model_config(section, manifest["padded_vocab_size"], manifest["seq_len"], eos_id)


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
        faults.kill_point("shard")  # KILN_DATA_FAULT: killed with the folder half written
        shards.append({"file": path.name, "rows": len(chunk), "sha256": sha256_file(path)})
    return {
        "rows": n_rows,
        "tokens": n_rows * row_len,
        "dropped_tokens": len(tokens) - n_rows * row_len,
        "shards": shards,
    }


def write_shards(tokens_dir: Path, out_dir: Path, seq_len: int, rows_per_shard: int) -> dict:
    """The shard stage's output in out_dir (an existing, empty folder): every split the pretokenize
    folder tokens_dir lists in its meta.json cut into rows of seq_len + 1, then manifest.json (what
    the loader, verify_shards and the train fingerprint read). Returns the manifest."""
    meta = read_json(tokens_dir / "meta.json")
    row_len = seq_len + 1
    splits = {
        split: shard_split(
            np.memmap(tokens_dir / f"{split}.bin", dtype=meta["dtype"], mode="r"),
            out_dir,
            split,
            row_len,
            rows_per_shard,
            meta["padded_vocab_size"],
        )
        # meta.json's list, not pretokenize's SPLITS: training imports this module, and importing
        # pretokenize would bring the cleaning's packages with it (tests/unit/test_train_imports.py)
        for split in meta["splits"]
    }
    manifest = {
        "seq_len": seq_len,
        "row_len": row_len,
        "dtype": meta["dtype"],
        "vocab_size": meta["vocab_size"],
        "padded_vocab_size": meta["padded_vocab_size"],
        "splits": splits,
        "sources": meta["sources"],
        "tokenizer_sha256": meta.get("tokenizer_sha256"),
        Documents.KEY: asdict(Documents(meta["eos_id"], meta.get("bos_id"))),  # bos_id: recorded later
    }
    if meta.get("source_tokenizer_sha256"):  # an hf tokenizer's source (kiln.train.init_from)
        manifest["source_tokenizer_sha256"] = meta["source_tokenizer_sha256"]
    write_json(out_dir / "manifest.json", manifest)
    return manifest


def header_vocab(path: Path) -> int:
    """The vocab size a shard's header records (the padded vocabulary it was written for)."""
    with open(path, "rb") as f:
        return _HEADER.unpack_from(f.read(HEADER_BYTES).ljust(HEADER_BYTES, b"\0"))[5]


def verify_shard(path: Path, entry: dict, vocab_size: int | None = None) -> None:
    """Check one shard against its manifest entry ({"file", "rows", "sha256"}): header and size
    (open_shard), row count, every id below vocab_size (default: the header's), and the sha256 of
    the whole file. One read of the file: each chunk is hashed and its ids checked in turn (both
    release the GIL, so this runs beside training in a background thread)."""
    path = Path(path)
    rows = open_shard(path)
    if len(rows) != entry["rows"]:
        raise KilnError(f"{path}: {len(rows)} rows, manifest says {entry['rows']}")
    dtype, itemsize = rows.dtype, rows.dtype.itemsize
    del rows  # the memmap: this pass reads the file itself
    limit = header_vocab(path) if vocab_size is None else vocab_size
    digest, buf, pos = hashlib.sha256(), bytearray(_VERIFY_CHUNK), 0
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            digest.update(view[:n])
            skip = max(HEADER_BYTES - pos, 0)  # the header is hashed, not id-checked
            if n > skip:
                ids = np.frombuffer(buf, dtype=dtype, count=(n - skip) // itemsize, offset=skip)
                if ids.max() >= limit:
                    _check_ids(ids, limit, str(path), (pos + skip - HEADER_BYTES) // itemsize, HEADER_BYTES, itemsize)
            pos += n
    actual = digest.hexdigest()
    if actual != entry["sha256"]:
        raise KilnError(
            f"{path}: sha256 {actual}, manifest says {entry['sha256']} "
            "(changed since the shard stage wrote it: rerun it, or restore the file)"
        )


def verify_shards(shard_dir: Path, manifest: dict) -> dict:
    """Check every shard's header, size, ids (below the manifest's vocab_size, else the header's)
    and sha256 against the manifest; return counts per split."""
    checked = {}
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            verify_shard(Path(shard_dir) / shard["file"], shard, manifest.get("vocab_size"))
        checked[split] = {"shards": len(entry["shards"]), "rows": sum(s["rows"] for s in entry["shards"])}
    return checked


def check_tokenizer(shard_dir: Path, tokenizer: Path) -> None:
    """A KilnError unless `tokenizer` is the file the shards were made with (the manifest's
    tokenizer_sha256; folders made before it was recorded are not checked)."""
    want = read_json(Path(shard_dir) / "manifest.json").get("tokenizer_sha256")
    actual = sha256_file(tokenizer)
    if want is not None and actual != want:
        raise KilnError(
            f"{tokenizer}: sha256 {actual}, but the shards in {shard_dir} were made with a tokenizer "
            f"of sha256 {want} (manifest.json); rerun pretokenize and shard, or pass that tokenizer"
        )


def tokens_per_byte(manifest: dict, split: str) -> float | None:
    """A split's tokens per UTF-8 byte of the documents they encode (the manifest's per-source
    counts, before the shard stage's cut), which turns a loss in nats per token into bits per byte;
    None for shards written without source counts."""
    counts = [source[split] for source in manifest.get("sources", {}).values() if split in source]
    n_bytes = sum(c["bytes"] for c in counts)
    return sum(c["tokens"] for c in counts) / n_bytes if n_bytes else None
