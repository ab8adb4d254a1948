"""Documents to token ids: a validation split of a fixed token count chosen by document, FIM on the
train side, an optional token budget shared among sources by mixture weights; in parallel worker
processes, at tiktoken speed, in memory that does not grow with the corpus.

Output (one directory): train.bin and val.bin, the concatenated ids of each split as raw uint16
(uint32 when the padded vocabulary exceeds 65,536), with <|endoftext|> after every sample;
val_ids.txt (the documents held out) and meta.json (counts per split and source, dtype, encoder,
FIM modes). The validation side is never FIM-transformed, so its loss, perplexity and bits per byte
measure plain language modelling. val.bin holds the sources one after another (in manifest order,
each in stored order), and meta.json's `val_sources` gives each source's [start, end) token range
in it with its docs, tokens and bytes, so that loss and bits per byte can be measured per source.

Validation: each source gives the samples with the smallest split hash (a hash of the sample's id
alone: stable across seeds, order and worker count) until it reaches its share of `val_tokens` (its
mixture weight, else its share of the corpus bytes); a sample is a document, or a repository with
repository context. Found in rounds without holding the corpus: a round encodes only the samples
whose hash falls below a rate estimated from the corpus size, and a later round raises the rate
when they fell short. Training: every other sample of the sources with a weight, in stored order,
FIM-transformed by (seed, document id); with `train_tokens`, source s contributes its first samples
until weight_s * train_tokens tokens.

Encoder (`encoder`): tiktoken carrying the vocabulary when it can and its ids equal those of
`tokenizers` on a check sample of every source (auto), or the one named.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter, deque
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow.parquet as pq

from kiln.config.run_config import PretokenizeSection
from kiln.data import faults
from kiln.data.encoders import MAX_CHARS, Encoder, tiktoken_encoding
from kiln.data.sources import part_paths
from kiln.data.tokenize_parts import COUNT_COLUMNS, Settings, WorkerPool, train_part, val_candidates
from kiln.data.tokenizer import EOS, id_space, load_tokenizer, padded_vocab_size, role_ids, source_tokenizer_sha256
from kiln.data.utf8text import utf8_size
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file, write_json

log = logging.getLogger("kiln.pretokenize")
SPLITS = ("train", "val")
VAL_MARGIN = 1.25  # a validation round encodes this many times the tokens it expects to need
CHECK_BYTES = 64 << 10  # per source: the sample on which tiktoken must reproduce tokenizers


def token_dtype(padded_vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if padded_vocab <= 2**16 else np.dtype(np.uint32)


def _shares(manifest: dict, mixture: Mapping[str, float]) -> dict[str, float]:
    """Each source's share of the tokens: its mixture weight (0 when unlisted), else its share of bytes."""
    if mixture:
        total = sum(mixture.values())
        return {name: mixture.get(name, 0) / total for name in manifest["sources"]}
    return {name: src["bytes"] / max(manifest["bytes"], 1) for name, src in manifest["sources"].items()}


def _check_texts(raw_dir: Path, manifest: dict) -> dict[str, list[str]]:
    """The first documents of each source, up to CHECK_BYTES each."""
    texts: dict[str, list[str]] = {}
    for name, source in manifest["sources"].items():
        texts[name], size = [], 0
        first_part = pq.ParquetFile(raw_dir / name / source["parts"][0]["file"])
        rows = (t for b in first_part.iter_batches(batch_size=16, columns=["text"]) for t in b.column(0).to_pylist())
        for text in rows:
            if size >= CHECK_BYTES:
                break
            texts[name].append(text[: CHECK_BYTES - size])
            size += utf8_size(texts[name][-1])
    return texts


def choose_encoder(tokenizer, wanted: str, texts: list[str]) -> tuple[Encoder, dict]:
    """An Encoder by tiktoken or by tokenizers, and why: auto takes tiktoken only when it reproduces
    the ids of tokenizers on `texts`."""
    if wanted == "tokenizers":
        return Encoder(tokenizer, "tokenizers"), {"reason": "configured"}
    try:
        encoding = tiktoken_encoding(tokenizer)
    except KilnError as exc:
        if wanted == "tiktoken":
            raise KilnError(f"pretokenize.encoder: tiktoken cannot carry this tokenizer: {exc}") from None
        return Encoder(tokenizer, "tokenizers"), {"reason": f"tiktoken cannot carry this tokenizer: {exc}"}
    reference = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    differ = sum(encoding.encode_ordinary(t) != r.ids for t, r in zip(texts, reference))
    check = {"checked_docs": len(texts), "checked_bytes": sum(utf8_size(t) for t in texts), "differing_docs": differ}
    if differ and wanted == "auto":
        log.warning(
            "tiktoken gives other ids than tokenizers on %d of %d check documents: using tokenizers", differ, len(texts)
        )
        return Encoder(tokenizer, "tokenizers"), {"reason": "tiktoken ids differ on the check sample", **check}
    return Encoder(tokenizer, "tiktoken", encoding=encoding), check


def _select_val(
    pool: WorkerPool, parts: list, quotas: dict[str, int], expected: dict[str, float], scratch: Path
) -> list[dict]:
    """The validation samples (smallest split hashes per source up to its quota), in stored order;
    their ids wait in scratch files (see val_candidates)."""
    rates = {s: min(1.0, VAL_MARGIN * q / max(expected[s], 1.0)) for s, q in quotas.items() if q > 0}
    done_below = dict.fromkeys(rates, 0.0)
    found: dict[str, list[dict]] = {s: [] for s in rates}
    pending = set(rates)
    for round_ in itertools.count():
        if not pending:
            break
        todo = [(i, s, path) for i, s, path in parts if s in pending]
        bounds = {s: (int(done_below[s] * 2**64), 2**64 if rates[s] >= 1 else int(rates[s] * 2**64)) for s in pending}
        tasks = [(i, str(path), *bounds[s], str(scratch / f"val-{round_}-{i:06d}.bin")) for i, s, path in todo]
        for (_, s, _), candidates in zip(todo, pool.imap(val_candidates, tasks)):
            found[s].extend(candidates)
        for s in list(pending):
            got = sum(c["tokens"] for c in found[s])
            if got >= quotas[s] or rates[s] >= 1:
                pending.discard(s)
            else:
                log.info(
                    "source %s: %d of %d validation tokens below rate %.3g; raising it", s, got, quotas[s], rates[s]
                )
                done_below[s] = rates[s]
                rates[s] = min(1.0, rates[s] * (max(2.0, VAL_MARGIN * quotas[s] / got) if got else 4.0))
    selected = []
    for s, candidates in found.items():
        total = 0
        for candidate in sorted(candidates, key=lambda c: c["hash"]):
            if total >= quotas[s]:
                break
            selected.append(candidate)
            total += candidate["tokens"]
    return sorted(selected, key=lambda c: (c["part"], c["row"]))


def _copy_range(dst, src_path: Path, start: int, n_bytes: int) -> None:
    with open(src_path, "rb") as src:
        src.seek(start)
        while n_bytes > 0:
            block = src.read(min(n_bytes, 8 << 20))
            if not block:
                raise KilnError(f"pretokenize: {src_path} ended {n_bytes} bytes early")
            dst.write(block)
            n_bytes -= len(block)


def _write_train(
    pool: WorkerPool,
    parts: list,
    skip: dict[int, set[int]],
    targets: dict[str, int | None],
    out_dir: Path,
    scratch: Path,
    itemsize: int,
) -> dict[str, Counter]:
    """Encode the train side part by part into train.bin, each source cut at its target; per-source counts."""
    counts = {s: Counter() for s in targets}
    done: set[str] = set()
    order: deque = deque()

    def tasks():
        for i, s, path in parts:
            if s not in done and targets[s] != 0:
                order.append((i, s))
                yield i, str(path), frozenset(skip.get(i, ())), str(scratch / f"{i:06d}.bin")

    with open(out_dir / "train.bin", "wb") as train:
        for samples in pool.imap(train_part, tasks()):
            i, s = order.popleft()
            part_file = scratch / f"{i:06d}.bin"
            if s in done:  # encoded while the source's budget was being reached
                part_file.unlink()
                continue
            if targets[s] is not None:
                reached = np.cumsum(samples[:, 0]) >= targets[s] - counts[s]["tokens"]
                if reached.any():
                    samples = samples[: int(np.argmax(reached)) + 1]
                    done.add(s)
            _copy_range(train, part_file, 0, int(samples[:, 0].sum()) * itemsize)
            part_file.unlink()
            if faults.planned():  # KILN_DATA_FAULT: killed with train.bin part written, on disk
                train.flush()
                faults.kill_point("pretokenize")
            counts[s].update(dict(zip(COUNT_COLUMNS, samples.sum(axis=0).tolist())))
            log.info(
                "part %d/%d (%s) encoded: %d train tokens so far",
                i + 1,
                len(parts),
                s,
                sum(c["tokens"] for c in counts.values()),
            )
    return counts


def _write_val(val: list[dict], parts: list, names: list[str], out_dir: Path, itemsize: int) -> dict[str, dict]:
    """val.bin (the selected samples' ids, from the scratch files) and val_ids.txt: source after source
    in manifest order, each in stored order. Returns each source's place in val.bin: {source: {start,
    end (token offsets, end exclusive), docs, tokens, bytes}}, every source listed (empty ones with
    start == end), in the order of `names` (the manifest's)."""
    source_of = {i: s for i, s, _ in parts}
    ranges = {}
    at = 0
    with open(out_dir / "val.bin", "wb") as f, open(out_dir / "val_ids.txt", "w", encoding="utf-8") as ids:
        for s in names:
            entry = ranges[s] = {"start": at, "end": at, "docs": 0, "tokens": 0, "bytes": 0}
            for sample in (v for v in val if source_of[v["part"]] == s):  # val is in (part, row) order
                _copy_range(f, Path(sample["file"]), sample["offset"] * itemsize, sample["tokens"] * itemsize)
                ids.writelines(doc_id + "\n" for doc_id in sample["doc_ids"])
                entry["docs"] += len(sample["doc_ids"])
                entry["tokens"] += sample["tokens"]
                entry["bytes"] += sample["bytes"]
                at += sample["tokens"]
            entry["end"] = at
    return ranges


def _per_source(
    manifest: dict,
    parts: list,
    val: list[dict],
    train: dict[str, Counter],
    shares: dict[str, float],
    quotas: dict[str, int],
    targets: dict[str, int | None],
) -> dict[str, dict]:
    """What each source gave to each split, beside what it was asked for."""
    source_of = {i: s for i, s, _ in parts}
    sources = {}
    for s, src in manifest["sources"].items():
        mine = [v for v in val if source_of[v["part"]] == s]
        held = {
            "docs": sum(len(v["doc_ids"]) for v in mine),
            "tokens": sum(v["tokens"] for v in mine),
            "bytes": sum(v["bytes"] for v in mine),
        }
        used = {k: train[s][k] for k in ("docs", "tokens", "bytes")}
        if targets[s] and used["tokens"] < targets[s]:
            log.warning(
                "source %s: %d train tokens, short of the %d its weight asks for; download more of it",
                s,
                used["tokens"],
                targets[s],
            )
        sources[s] = {
            "share": shares[s],
            "train_target_tokens": targets[s],
            "val_target_tokens": quotas[s],
            "train": used,
            "val": held,
            "unused_docs": src["rows"] - used["docs"] - held["docs"],
        }
    return sources


def pretokenize(
    raw_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    seed: int,
    cfg: PretokenizeSection,
    workers: int = 1,
    max_chars: int = MAX_CHARS,
) -> dict:
    """Write train.bin, val.bin, val_ids.txt and last meta.json to out_dir; return the meta. Texts longer than
    max_chars characters are encoded a slice at a time (see kiln.data.encoders)."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    manifest = read_json(raw_dir / "manifest.json")
    tokenizer = load_tokenizer(tokenizer_path)
    vocab = id_space(tokenizer)
    dtype = token_dtype(padded_vocab_size(vocab))
    check = _check_texts(raw_dir, manifest)
    local, encoder_info = choose_encoder(tokenizer, cfg.encoder, [t for texts in check.values() for t in texts])
    log.info("encoding with %s (%d worker processes)", local.backend, workers)
    expected = {}  # tokens per source, from its size and the bytes per token of its check sample
    for s, texts in check.items():
        sample_tokens = sum(len(ids) for ids in local.encode(texts))
        expected[s] = manifest["sources"][s]["bytes"] * sample_tokens / max(sum(map(utf8_size, texts)), 1)
    shares = _shares(manifest, cfg.mixture)
    quotas = {s: math.ceil(cfg.val_tokens * share) for s, share in shares.items()}
    budget = cfg.train_tokens
    targets = {s: 0 if share == 0 else None if budget is None else round(budget * share) for s, share in shares.items()}
    parts = [(i, s, path) for i, (s, path) in enumerate(part_paths(raw_dir, manifest))]
    settings = Settings(str(tokenizer_path), local.backend, dtype.name, seed, cfg.fim, cfg.repo_context, max_chars)
    scratch = out_dir / ".scratch"
    scratch.mkdir()
    with WorkerPool(workers, settings) as pool:
        val = _select_val(pool, parts, quotas, expected, scratch)
        val_sources = _write_val(val, parts, list(manifest["sources"]), out_dir, dtype.itemsize)
        for leftover in scratch.iterdir():
            leftover.unlink()
        skip: dict[int, set[int]] = {}
        for sample in val:
            skip.setdefault(sample["part"], set()).add(sample["row"])
        train = _write_train(pool, parts, skip, targets, out_dir, scratch, dtype.itemsize)
    scratch.rmdir()
    sources = _per_source(manifest, parts, val, train, shares, quotas, targets)
    splits = {
        split: {k: sum(src[split][k] for src in sources.values()) for k in ("docs", "tokens", "bytes")}
        for split in SPLITS
    }
    for split in SPLITS:
        if splits[split]["docs"] == 0:
            raise KilnError(
                f"pretokenize: the {split} split is empty ({manifest['rows']} documents in all); add documents "
                f"or change pretokenize.val_tokens (now {cfg.val_tokens})"
            )
    meta = {
        "dtype": dtype.name,
        "vocab_size": vocab,
        "padded_vocab_size": padded_vocab_size(vocab),
        "tokenizer_sha256": sha256_file(tokenizer_path),  # checkpoints compare it (kiln.train.fingerprint)
        "eos_id": role_ids(tokenizer, tokenizer_path)[EOS],
        "encoder": {"name": local.backend, **encoder_info},
        "splits": splits,
        "sources": sources,
        "val_sources": val_sources,
        "fim_modes": {m: sum(train[s][m] for s in train) for m in COUNT_COLUMNS[3:]},
        "repo_context": cfg.repo_context,
    }
    if source_tokenizer_sha256(tokenizer_path):  # an hf tokenizer's source: init_from takes it as the same one
        meta["source_tokenizer_sha256"] = source_tokenizer_sha256(tokenizer_path)
    write_json(out_dir / "meta.json", meta)  # what the shard stage, eval and the report read
    return meta
