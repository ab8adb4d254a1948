"""Very long texts held as UTF-8 bytes: character-indexed like a str, written to and read from parquet
without a copy, and a big file through the download stage and back."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import download_cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.data.raw import write_raw
from kiln.data.sources import SourceReader, read_part, read_rows
from kiln.data.utf8text import BIG_TEXT_BYTES, Utf8Text, first_invalid_byte, string_column, texts_of, utf8_size
from kiln.errors import KilnError
from kiln.io import read_json

CHARS = st.sampled_from(["a", " ", "\n", "é", "漢", "🙂", "\x00", "\u2028"])


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(CHARS, max_size=3000),
    cuts=st.lists(st.integers(min_value=-3100, max_value=3100), min_size=2, max_size=2),
)
def test_slices_and_length_match_the_string(text, cuts):
    wrapped = Utf8Text(text.encode("utf-8"))
    assert len(wrapped) == len(text) and wrapped.nbytes == utf8_size(text) == utf8_size(wrapped)
    a, b = cuts
    assert wrapped[a:b] == text[a:b]
    if text:
        assert wrapped[a % len(text)] == text[a % len(text)] and wrapped[-1] == text[-1]


def test_character_index_spans_blocks():
    text = ("é🙂" * 300_000) + "end"  # 1.8 MB: the index has two blocks, characters straddle them
    wrapped = Utf8Text(text.encode("utf-8"))
    assert len(wrapped) == len(text)
    for start in (0, 174_761, 349_524, 349_525, len(text) - 5):
        assert wrapped[start : start + 7] == text[start : start + 7]
    with pytest.raises(ValueError, match="step 1"):
        wrapped[::2]


def test_first_invalid_byte_finds_the_offset_across_chunks():
    good = ("x" * 1_048_575 + "é" + "y" * 10).encode("utf-8")  # "é" straddles the 1 MiB chunk boundary
    assert first_invalid_byte(good) is None
    bad = good[:1_048_575] + b"\xc3" + b"(" + good[1_048_577:]
    assert first_invalid_byte(bad) == 1_048_575
    assert first_invalid_byte(b"ok \xff") == 3


def test_blank_is_ascii_whitespace_only():
    assert Utf8Text(b" \n\t" * 10).is_blank() and not Utf8Text(b"   x  ").is_blank()


def test_arrow_column_round_trip_without_strings():
    long_text = "line 🙂\n" * 1000
    column = string_column(["a", Utf8Text(long_text.encode()), "b", "c"])
    assert column.num_chunks == 3 and column.to_pylist() == ["a", long_text, "b", "c"]
    values = texts_of(column, big_bytes=100)
    assert [type(v).__name__ for v in values] == ["str", "Utf8Text", "str", "str"]
    assert values[1][5:20] == long_text[5:20] and texts_of(column, None)[1] == long_text
    assert texts_of(pa.chunked_array([], pa.string()), 10) == []


def test_a_big_file_goes_through_download_as_bytes(tmp_path):
    text = ("def f(x):\n    return 'é' * x  # 🙂\n" * (BIG_TEXT_BYTES // 30))[: BIG_TEXT_BYTES + 1000]
    path = tmp_path / "big.py"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "small.py").write_text("x = 1\n", encoding="utf-8")
    cfg = download_cfg(
        [{"name": "code", "kind": "local", "paths": [str(tmp_path / "big.py"), str(tmp_path / "small.py")]}]
    )
    (spec,) = cfg.sources
    read = list(SourceReader(spec).read())
    assert isinstance(read[0].text, Utf8Text) and isinstance(read[1].text, str)
    manifest = write_raw(cfg, tmp_path / "raw")
    assert manifest["bytes"] == len(text.encode("utf-8")) + 6
    part = tmp_path / "raw" / "code" / manifest["sources"]["code"]["parts"][0]["file"]
    assert [d.text for d in read_part(part)] == [text, "x = 1\n"]
    as_bytes = read_part(part, big_bytes=1 << 20)
    assert isinstance(as_bytes[0].text, Utf8Text) and as_bytes[0].text[-40:] == text[-40:]
    assert list(read_rows(part, {1})) == [1] and read_json(tmp_path / "raw" / "manifest.json") == manifest
    (tmp_path / "big.py").write_bytes(text.encode("utf-8")[:-3] + b"\xff\xfe\xfd")
    with pytest.raises(KilnError, match=rf"big.py: not valid UTF-8 \(byte {len(text.encode()) - 3}"):
        list(SourceReader(spec, "fail").read())
