"""What every pretokenize job starts from: the Plan, a pure function of the raw folder, the tokenizer
and the settings, so the plan job, the part jobs and the gather (kiln.data.pretokenize), each making
it, agree. It picks the encoder (tiktoken where it reproduces tokenizers on a check sample of every
source), the token dtype, each source's share of the tokens, validation quota and train target, the
first validation round's rate per source, and which parts' train sides the part jobs encode (under a
`train_tokens` budget, those the budget is expected to reach); each part's stamp is what its encoding
depends on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow.parquet as pq

from kiln.config.data_sections import PretokenizeSection
from kiln.data.encoders import MAX_CHARS, Encoder, tiktoken_encoding
from kiln.data.sources import part_paths
from kiln.data.tokenize_parts import Settings
from kiln.data.tokenizer import EOS, bos_id, id_space, load_tokenizer, padded_vocab_size, role_ids
from kiln.data.utf8text import utf8_size
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file
from kiln.layout import ScatterPlan

log = logging.getLogger("kiln.pretokenize")
VAL_MARGIN = 1.25  # a validation round encodes this many times the tokens it expects to need
# A source's part jobs encode its train side while the parts before them are expected to hold fewer
# than this many times its train target plus validation quota; the gather encodes any part past
# that which the budget still reaches (the estimate fell short), so the bytes never depend on it.
TRAIN_MARGIN = 1.25
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


def val_bounds(done_below: float, rate: float) -> tuple[int, int]:
    """The split hashes [lo, hi) a validation round encodes: those above the last round's rate."""
    return int(done_below * 2**64), 2**64 if rate >= 1 else int(rate * 2**64)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every pretokenize job works from, a pure function of the raw folder, the tokenizer and the
    settings (so the part jobs and the gather, each making it, agree): the parts, the encoder, the
    token dtype, each source's share, validation quota and train target, and the first validation
    round's rate per source with a quota."""

    manifest: dict
    parts: list[tuple[int, str, Path]]
    tokenizer_sha256: str
    vocab: int
    eos_id: int
    bos_id: int | None  # the id every sample starts with, when the tokenizer has a BOS
    dtype: np.dtype
    encoder_info: dict
    settings: Settings
    shares: dict[str, float]
    quotas: dict[str, int]
    targets: dict[str, int | None]
    first_rates: dict[str, float]
    train_parts: frozenset[int]  # the parts whose train side a pretokenize_part job encodes

    def stamp(self, index: int) -> dict:
        """Everything part `index`'s encoding depends on: the raw part's checksum, the tokenizer's, the
        encoder, dtype and layout settings, and its first validation round's hash bounds (as JSON
        reads them back)."""
        _, source, path = self.parts[index]
        part = next(p for p in self.manifest["sources"][source]["parts"] if p["file"] == path.name)
        rate = self.first_rates.get(source)
        layout = {k: v for k, v in dataclasses.asdict(self.settings).items() if k != "tokenizer_path"}
        layout["fim"] = self.settings.fim.as_dict()  # a config section, which asdict leaves as it is
        if not layout["bos"]:  # named only when set: a part encoded before the BOS layout still matches
            del layout["bos"]
        stamp = {
            "index": index,
            "source": source,
            "raw_sha256": part["sha256"],
            "tokenizer_sha256": self.tokenizer_sha256,
            **layout,
            "val_bounds": None if rate is None else [str(b) for b in val_bounds(0.0, rate)],
            "train_side": index in self.train_parts,
        }
        return json.loads(json.dumps(stamp))


def scatter_plan(raw_dir: Path, tokenizer_path: Path, seed: int, cfg: PretokenizeSection) -> ScatterPlan:
    """The pretokenize_plan job's answer: one stamp per raw part, so one pretokenize_part job each."""
    the_plan = plan(raw_dir, tokenizer_path, seed, cfg)
    return ScatterPlan([the_plan.stamp(i) for i in range(len(the_plan.parts))])


def plan(raw_dir: Path, tokenizer_path: Path, seed: int, cfg: PretokenizeSection, max_chars: int = MAX_CHARS) -> Plan:
    raw_dir = Path(raw_dir)
    manifest = read_json(raw_dir / "manifest.json")
    tokenizer = load_tokenizer(tokenizer_path)
    vocab = id_space(tokenizer)
    bos = bos_id(tokenizer)
    dtype = token_dtype(padded_vocab_size(vocab))
    check = _check_texts(raw_dir, manifest)
    local, encoder_info = choose_encoder(tokenizer, cfg.encoder, [t for texts in check.values() for t in texts])
    expected = {}  # tokens per source, from its size and the bytes per token of its check sample
    for s, texts in check.items():
        sample_tokens = sum(len(ids) for ids in local.encode(texts))
        expected[s] = manifest["sources"][s]["bytes"] * sample_tokens / max(sum(map(utf8_size, texts)), 1)
    shares = _shares(manifest, cfg.mixture)
    quotas = {s: math.ceil(cfg.val_tokens * share) for s, share in shares.items()}
    budget = cfg.train_tokens
    targets = {s: 0 if share == 0 else None if budget is None else round(budget * share) for s, share in shares.items()}
    parts = [(i, s, path) for i, (s, path) in enumerate(part_paths(raw_dir, manifest))]
    return Plan(
        manifest=manifest,
        parts=parts,
        tokenizer_sha256=sha256_file(tokenizer_path),
        vocab=vocab,
        eos_id=role_ids(tokenizer, tokenizer_path)[EOS],
        bos_id=bos,
        dtype=dtype,
        encoder_info=encoder_info,
        settings=Settings(
            str(tokenizer_path), local.backend, dtype.name, seed, cfg.fim, cfg.repo_context, max_chars, bos is not None
        ),
        shares=shares,
        quotas=quotas,
        targets=targets,
        first_rates={s: min(1.0, VAL_MARGIN * q / max(expected[s], 1.0)) for s, q in quotas.items() if q > 0},
        train_parts=_train_parts(manifest, parts, expected, targets, quotas),
    )


def _train_parts(manifest: dict, parts: list, expected: dict, targets: dict, quotas: dict) -> frozenset[int]:
    """The parts whose train side the part jobs encode: every part of a source without a budget; none
    of one the mixture leaves out; of a budgeted source, its parts in order while those before hold
    fewer than TRAIN_MARGIN x (target + quota) tokens by the source's bytes per token (`expected`)."""
    chosen, before = set(), dict.fromkeys(targets, 0.0)
    sizes = {(s, p["file"]): p["bytes"] for s, src in manifest["sources"].items() for p in src["parts"]}
    for i, s, path in parts:
        target = targets[s]
        if target is None or (target and before[s] < TRAIN_MARGIN * (target + quotas[s])):
            chosen.add(i)
        before[s] += sizes[s, path.name] * expected[s] / max(manifest["sources"][s]["bytes"], 1)
    return frozenset(chosen)
