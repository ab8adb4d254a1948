"""Very long documents held once, as their UTF-8 bytes, never also as a Python string.

A Python string takes up to 4 bytes a character, and turning Arrow or file bytes into one copies
them, so a 200 MB document could cost a gigabyte several times over. `Utf8Text` wraps the bytes
(a file's, or an Arrow buffer's, zero-copy) and answers what Kiln asks of a text (its length in
characters, slices by character index) by decoding only the slice asked for. The download stage reads
files above BIG_TEXT_BYTES this way and writes them to parquet without a copy; the pretokenize
workers read documents above their slice size this way and encode them a slice at a time.
"""

from __future__ import annotations

import codecs

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BIG_TEXT_BYTES = 16 << 20  # the download stage keeps larger files as Utf8Text
_BLOCK = 1 << 20  # bytes per block of the character index
_UTF8_CHUNK = 1 << 20


class Utf8Text:
    """A text as UTF-8 bytes, read by character index (len, slices) without decoding it whole."""

    def __init__(self, data) -> None:
        self.data = np.frombuffer(data, dtype=np.uint8)
        leads = [np.count_nonzero((self.data[i : i + _BLOCK] & 0xC0) != 0x80) for i in range(0, self.data.size, _BLOCK)]
        self._chars_before = np.concatenate([[0], np.cumsum(leads, dtype=np.int64)])  # per block

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        return int(self._chars_before[-1])

    def _offset(self, char: int) -> int:
        """Byte offset where character `char` starts (the size at the end)."""
        if char >= len(self):
            return self.nbytes
        block = int(np.searchsorted(self._chars_before, char, side="right")) - 1
        leads = np.flatnonzero((self.data[block * _BLOCK : (block + 1) * _BLOCK] & 0xC0) != 0x80)
        return block * _BLOCK + int(leads[char - self._chars_before[block]])

    def __getitem__(self, key: slice | int) -> str:
        if isinstance(key, int):
            key = slice(key, key + 1) if key >= 0 else slice(len(self) + key, len(self) + key + 1)
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("Utf8Text slices have step 1")
        return bytes(self.data[self._offset(start) : self._offset(max(start, stop))]).decode("utf-8")

    def is_blank(self) -> bool:
        """No byte but ASCII whitespace (other Unicode spaces count as content in so long a text)."""
        return all(not bytes(self.data[i : i + _BLOCK]).strip() for i in range(0, self.nbytes, _BLOCK))


def utf8_size(text: str | Utf8Text) -> int:
    """UTF-8 bytes of a text without copying it whole (ASCII: its length)."""
    if isinstance(text, Utf8Text):
        return text.nbytes
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + _UTF8_CHUNK].encode("utf-8")) for i in range(0, len(text), _UTF8_CHUNK))


def first_invalid_byte(data: bytes) -> int | None:
    """Offset of the first byte that makes `data` invalid UTF-8, decoded a chunk at a time; None if valid."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(view), _UTF8_CHUNK):
        pending = len(decoder.getstate()[0])  # bytes of a character cut at the previous chunk's end
        try:
            decoder.decode(view[start : start + _UTF8_CHUNK], final=start + _UTF8_CHUNK >= len(view))
        except UnicodeDecodeError as exc:
            return start - pending + exc.start
    return None


def string_column(texts: list[str | Utf8Text]) -> pa.ChunkedArray:
    """An Arrow string column of `texts`, each Utf8Text a chunk over its own bytes (no copy)."""
    chunks, run = [], []
    for text in texts:
        if isinstance(text, Utf8Text):
            if run:
                chunks.append(pa.array(run, pa.string()))
                run = []
            offsets = pa.py_buffer(np.array([0, text.nbytes], dtype=np.int32))
            chunks.append(pa.StringArray.from_buffers(1, offsets, pa.py_buffer(text.data)))
        else:
            run.append(text)
    if run or not chunks:
        chunks.append(pa.array(run, pa.string()))
    return pa.chunked_array(chunks, pa.string())


def texts_of(column: pa.ChunkedArray, big_bytes: int | None) -> list[str | Utf8Text]:
    """The values of an Arrow string column: Python strings, or Utf8Text over the Arrow buffer for
    values above big_bytes (None: strings throughout)."""
    if big_bytes is None or len(column) == 0 or pc.max(pc.binary_length(column)).as_py() <= big_bytes:
        return column.to_pylist()
    texts: list[str | Utf8Text] = []
    for chunk in column.chunks:
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
        data = np.frombuffer(data_buffer, dtype=np.uint8)
        for i in range(len(chunk)):
            start, end = int(offsets[i]), int(offsets[i + 1])
            if end - start > big_bytes:
                texts.append(Utf8Text(data[start:end]))
            else:
                texts.append(chunk[i].as_py())
    return texts
