"""tiktoken carrying a trained byte-level BPE: the same ids as `tokenizers` (tricky text, arbitrary
Unicode, the whole default corpus), refused where it cannot be exact; long texts encoded a slice at
a time give the ids of the whole text."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TRICKY_TEXTS, download_cfg, tokenizer_cfg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from kiln.data.encoders import Encoder, safe_slices, tiktoken_encoding, tokenizer_from_tiktoken
from kiln.data.raw import write_raw
from kiln.data.source_kinds.stdlib.reader import stdlib_root
from kiln.data.sources import read_documents
from kiln.data.tokenizer_build import build_tokenizer, encode_batch
from kiln.errors import KilnError
from kiln.io import read_json

HYPOTHESIS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_tiktoken_ids_equal_tokenizers_on_tricky_text(tokenizer):
    encoding = tiktoken_encoding(tokenizer)
    texts = TRICKY_TEXTS + ["", " ", "\r\n\t\x00", "🙂" * 9, "a  b\n\n\n  c", "<|endoftext|><fim_middle>"]
    assert [encoding.encode_ordinary(t) for t in texts] == encode_batch(tokenizer, texts)
    encoder = Encoder(tokenizer, "tiktoken")
    assert [ids.tolist() for ids in encoder.encode(texts)] == encode_batch(tokenizer, texts)


@HYPOTHESIS
@given(text=st.text())
def test_tiktoken_ids_equal_tokenizers_on_any_unicode(tokenizer, text):
    assert tiktoken_encoding(tokenizer).encode_ordinary(text) == tokenizer.encode(text, add_special_tokens=False).ids


def test_special_tokens_keep_their_ids(tokenizer):
    encoding = tiktoken_encoding(tokenizer)
    assert encoding._special_tokens == {t: tokenizer.token_to_id(t) for t in encoding._special_tokens}
    assert len(encoding._special_tokens) == 7


def test_tiktoken_is_refused_for_what_it_cannot_reproduce(tokenizer):
    normalized = Tokenizer.from_str(tokenizer.to_str())
    normalized.normalizer = normalizers.NFKC()
    with pytest.raises(KilnError, match="without a normalizer"):
        tiktoken_encoding(normalized)
    word_level = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(KilnError, match="BPE"):
        tiktoken_encoding(word_level)
    metaspace = Tokenizer.from_str(tokenizer.to_str())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    with pytest.raises(KilnError, match="not a byte-level split"):
        tiktoken_encoding(metaspace)


def test_tiktoken_round_trip_through_tokenizer_json(tokenizer):
    back = tokenizer_from_tiktoken(tiktoken_encoding(tokenizer), extra_special=("<extra>",))
    assert back.token_to_id("<extra>") == tokenizer.get_vocab_size()
    assert encode_batch(back, TRICKY_TEXTS) == encode_batch(tokenizer, TRICKY_TEXTS)
    assert tiktoken_encoding(back).encode_ordinary(TRICKY_TEXTS[0]) == encode_batch(tokenizer, TRICKY_TEXTS[:1])[0]


@HYPOTHESIS
@given(
    words=st.lists(
        st.sampled_from(["def", " ", "  ", "\n", "x", "é", "🙂", "=", "1234", "\t", "(", "a b"]), max_size=400
    ),
    max_chars=st.integers(min_value=4, max_value=64),
)
def test_slices_cut_where_no_pre_token_crosses(tokenizer, words, max_chars):
    text = "".join(words)
    slices = list(safe_slices(text, 0, len(text), max_chars))
    assert slices[0][0] == 0 and slices[-1][1] == len(text)
    assert all(a < b or len(text) == 0 for a, b in slices) and all(
        slices[i][1] == slices[i + 1][0] for i in range(len(slices) - 1)
    )
    encoder = Encoder(tokenizer, "tiktoken", max_chars=max_chars)
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    hard_cuts = [b for a, b in slices[:-1] if not (text[b] == " " and not text[b - 1].isspace())]
    if not hard_cuts:
        assert np.concatenate(list(encoder.encode_long(text, 0, len(text)))).tolist() == whole


def test_long_code_is_sliced_with_the_same_ids(tokenizer):
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib_root().glob("json/*.py")))
    for backend in ("tiktoken", "tokenizers"):
        encoder = Encoder(tokenizer, backend, np.uint16, max_chars=2000)
        pieces = list(encoder.encode_long(text, 0, len(text)))
        assert len(pieces) > 10 and all(p.dtype == np.uint16 for p in pieces)
        assert np.concatenate(pieces).tolist() == tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.slow
def test_tiktoken_equals_tokenizers_on_the_whole_default_corpus(tmp_path):
    """The default corpus (every .py file of the standard library) with an 8192-token BPE: every
    document gets the same ids from tiktoken as from tokenizers."""
    raw = tmp_path / "raw"
    write_raw(download_cfg([{"name": "stdlib", "kind": "stdlib", "include": ["**/*.py"]}], rows_per_part=500), raw)
    tokenizer, _ = build_tokenizer(
        raw, tokenizer_cfg(vocab_size=8192, train_bytes=8_000_000, heldout_docs=10), seed=1337
    )
    texts = [d.text for d in read_documents(raw, read_json(raw / "manifest.json"))]
    assert sum(map(len, texts)) > 20_000_000
    reference = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    encoding = tiktoken_encoding(tokenizer)
    differing = [i for i, (t, ids) in enumerate(zip(texts, reference)) if encoding.encode_ordinary(t) != ids]
    assert differing == []
