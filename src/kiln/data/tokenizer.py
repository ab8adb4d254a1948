"""Byte-level BPE trained with Hugging Face `tokenizers`, with the StarCoder2 special tokens.

Byte-level means every string round-trips: the 256 byte symbols are always in the vocabulary, so
decode(encode(x)) == x for any text. The special tokens take ids 0..6 in the StarCoder2 order, and
text that merely *contains* a special token's spelling is encoded as ordinary text
(`encode_special_tokens`), so a document quoting "<|endoftext|>" cannot end itself early; special
ids enter a sequence only where Kiln puts them (EOS, FIM sentinels).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.config import SPECIAL_TOKENS
from kiln.data.sources import read_documents
from kiln.errors import KilnError
from kiln.io import read_json, stable_hash

log = logging.getLogger("kiln.tokenizer")

EOS = "<|endoftext|>"
VOCAB_MULTIPLE = 64


def padded_vocab_size(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Embedding rows for a vocabulary of n tokens: rounded up so matmuls tile evenly on GPUs."""
    return -(-n // multiple) * multiple


def train_bpe(texts: Iterable[str], vocab_size: int, length: int | None = None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    # Not stored in tokenizer.json by every tokenizers release; set it on every load.
    tokenizer.encode_special_tokens = True
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}


def encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of each text (no special tokens added); runs in parallel inside `tokenizers`."""
    return [enc.ids for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]


def bytes_per_token(tokenizer: Tokenizer, texts: list[str]) -> float:
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(ids) for ids in encode_batch(tokenizer, texts))
    return n_bytes / max(n_tokens, 1)


def train_from_raw(raw_dir: Path, cfg: dict, seed: int) -> tuple[Tokenizer, dict]:
    """Train on the download stage's documents: hold out `heldout_docs` (chosen by a hash of seed
    and id), train on the rest in stored order up to `train_bytes`, measure bytes/token held out."""
    manifest = read_json(Path(raw_dir) / "manifest.json")
    ids = [doc.id for doc in read_documents(raw_dir, manifest)]
    heldout = set(sorted(ids, key=lambda i: stable_hash(seed, "tokenizer-heldout", i))[: cfg["heldout_docs"]])
    if len(heldout) == len(ids):
        raise KilnError(
            f"tokenizer: tokenizer.heldout_docs={cfg['heldout_docs']} leaves none of the {len(ids)} "
            "documents to train on; lower it or add documents"
        )
    used = {"docs": 0, "bytes": 0}

    def training_texts():
        for doc in read_documents(raw_dir, manifest):
            if doc.id in heldout:
                continue
            size = len(doc.text.encode("utf-8"))
            if used["docs"] and used["bytes"] + size > cfg["train_bytes"]:
                return  # at most train_bytes (the first document always, so training is never empty)
            used["docs"] += 1
            used["bytes"] += size
            yield doc.text

    started = time.perf_counter()
    log.info("training a %d-token BPE on up to %d bytes", cfg["vocab_size"], cfg["train_bytes"])
    tokenizer = train_bpe(training_texts(), cfg["vocab_size"])
    log.info("trained in %.1f s on %d documents (%d bytes)", time.perf_counter() - started,
             used["docs"], used["bytes"])
    heldout_texts = [doc.text for doc in read_documents(raw_dir, manifest) if doc.id in heldout]
    stats = {
        "vocab_size": tokenizer.get_vocab_size(),
        "padded_vocab_size": padded_vocab_size(tokenizer.get_vocab_size()),
        "special_token_ids": special_ids(tokenizer),
        "train_docs": used["docs"],
        "train_bytes": used["bytes"],
        "heldout_docs": len(heldout_texts),
        "heldout_bytes_per_token": bytes_per_token(tokenizer, heldout_texts),
    }
    return tokenizer, stats
