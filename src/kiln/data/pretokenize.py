"""Documents to token ids: split by document hash, FIM on the train side, EOS after every document.

Output (one directory): train.bin and val.bin, the concatenated ids of each split as raw uint16
(uint32 when the padded vocabulary exceeds 65,536), val_ids.txt (which documents are held out) and
meta.json (counts, dtype, FIM modes). The validation side is never FIM-transformed, so its loss,
perplexity and bits per byte measure plain language modelling.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np

from kiln.data.fim import fim_pieces
from kiln.data.sources import Document, iter_parts
from kiln.data.tokenizer import EOS, encode_batch, load_tokenizer, padded_vocab_size
from kiln.errors import KilnError
from kiln.io import read_json, stable_hash

log = logging.getLogger("kiln.pretokenize")
SPLITS = ("train", "val")


def is_val(doc_id: str, val_fraction: float) -> bool:
    """Held out or not, from the document id alone: stable across seeds, workers and reruns."""
    return stable_hash("split", doc_id) < val_fraction * 2**64


def token_dtype(padded_vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if padded_vocab <= 2**16 else np.dtype(np.uint32)


def _encode_part(docs: list[Document], tokenizer, seed: int, cfg: dict, modes: Counter):
    """Yield (split, ids) per document; one batched encode call for all text pieces of the part."""
    special = {tok: tokenizer.token_to_id(tok) for tok in ("<fim_prefix>", "<fim_middle>", "<fim_suffix>")}
    eos = tokenizer.token_to_id(EOS)
    layouts, texts = [], []
    for doc in docs:
        split = "val" if is_val(doc.id, cfg["val_fraction"]) else "train"
        if split == "val":
            pieces = [("text", doc.text)]
        else:
            mode, pieces = fim_pieces(doc.text, seed, doc.id, cfg["fim"])
            modes[mode] += 1
        layout = []
        for kind, value in pieces:
            if kind == "special":
                layout.append(special[value])
            else:
                layout.append(None)
                texts.append(value)
        layouts.append((split, layout))
    encoded = iter(encode_batch(tokenizer, texts))
    for split, layout in layouts:
        ids: list[int] = []
        for slot in layout:
            if slot is None:
                ids.extend(next(encoded))
            else:
                ids.append(slot)
        ids.append(eos)
        yield split, ids


def pretokenize(raw_dir: Path, tokenizer_path: Path, out_dir: Path, seed: int, cfg: dict) -> dict:
    manifest = read_json(raw_dir / "manifest.json")
    tokenizer = load_tokenizer(tokenizer_path)
    padded = padded_vocab_size(tokenizer.get_vocab_size())
    dtype = token_dtype(padded)
    counts = {s: Counter() for s in SPLITS}
    modes: Counter = Counter()
    files = {s: open(out_dir / f"{s}.bin", "wb") for s in SPLITS}
    n_parts = sum(len(src["parts"]) for src in manifest["sources"].values())
    try:
        with open(out_dir / "val_ids.txt", "w", encoding="utf-8") as val_ids:
            for i, docs in enumerate(iter_parts(raw_dir, manifest)):
                per_split: dict[str, list[int]] = {s: [] for s in SPLITS}
                for doc, (split, ids) in zip(docs, _encode_part(docs, tokenizer, seed, cfg, modes)):
                    per_split[split].extend(ids)
                    counts[split]["docs"] += 1
                    counts[split]["tokens"] += len(ids)
                    counts[split]["bytes"] += len(doc.text.encode("utf-8"))
                    if split == "val":
                        val_ids.write(doc.id + "\n")
                for split, ids in per_split.items():
                    np.asarray(ids, dtype=dtype).tofile(files[split])
                log.info("part %d/%d encoded (%d train, %d val tokens so far)",
                         i + 1, n_parts, counts["train"]["tokens"], counts["val"]["tokens"])
    finally:
        for f in files.values():
            f.close()
    for split in SPLITS:
        if counts[split]["docs"] == 0:
            raise KilnError(
                f"pretokenize: the {split} split is empty ({sum(c['docs'] for c in counts.values())} "
                "documents in all); add documents or change pretokenize.val_fraction"
            )
    return {
        "dtype": dtype.name,
        "vocab_size": tokenizer.get_vocab_size(),
        "padded_vocab_size": padded,
        "eos_id": tokenizer.token_to_id(EOS),
        "splits": {s: dict(counts[s]) for s in SPLITS},
        "fim_modes": dict(modes),
    }
