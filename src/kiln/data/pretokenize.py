"""Documents to token ids: a validation split of a fixed token count chosen by document, FIM on the
train side, an optional token budget shared among sources by mixture weights; in parallel worker
processes, at tiktoken speed, in memory that does not grow with the corpus.

Output (one directory): train.bin and val.bin, the concatenated ids of each split as raw uint16
(uint32 when the padded vocabulary exceeds 65,536), with <|endoftext|> after every sample (and the
source's BOS before it, for a tokenizer whose source adds one: kiln.data.packing);
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

Two ways to run, the same bytes out: one job encodes every part in its worker processes
(`pretokenize`), or one pretokenize_part job per raw part encodes that part whole, with its first
round of validation candidates (`pretokenize_part`), and the pretokenize job gathers them
(`pretokenize` with `part_dirs`): it picks the validation samples across parts (running any later
round itself), leaves them out of the parts' train ids and cuts each source at its budget. Both
start from the same kiln.data.token_plan.Plan, a function of the raw folder, the tokenizer and the
settings.
Under a `train_tokens` budget the part jobs encode the train side of the parts the budget is
expected to reach (kiln.data.token_plan.TRAIN_MARGIN over the source's bytes per token), the others
only their validation candidates; the gather encodes any further part the budget does reach.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from kiln.config.data_sections import PretokenizeSection
from kiln.data import faults, token_parts, token_plan
from kiln.data.encoders import MAX_CHARS
from kiln.data.heldout import EXAMPLES, heldout_grams, overlapping_samples, removals, save_index
from kiln.data.token_parts import EncodedPart, sample_offsets
from kiln.data.token_plan import Plan, plan, val_bounds
from kiln.data.tokenize_parts import COUNT_COLUMNS, WorkerPool, train_part, val_candidates
from kiln.data.tokenizer import padded_vocab_size, source_tokenizer_sha256
from kiln.errors import KilnError
from kiln.io import write_json

log = logging.getLogger("kiln.pretokenize")
SPLITS = ("train", "val")


def _select_val(
    pool: WorkerPool, plan: Plan, scratch: Path, first_round: dict[int, list[dict]] | None = None
) -> list[dict]:
    """The validation samples (smallest split hashes per source up to its quota), in stored order;
    their ids wait in scratch files (see val_candidates). first_round: each part's candidates in the
    plan's first round, when parts encoded them (pretokenize_part); later rounds run here."""
    rates = dict(plan.first_rates)
    done_below = dict.fromkeys(rates, 0.0)
    found: dict[str, list[dict]] = {s: [] for s in rates}
    pending = set(rates)
    for round_ in itertools.count():
        if not pending:
            break
        todo = [(i, s, path) for i, s, path in plan.parts if s in pending]
        if round_ == 0 and first_round is not None:
            results = [first_round[i] for i, _, _ in todo]
        else:
            bounds = {s: val_bounds(done_below[s], rates[s]) for s in pending}
            tasks = [(i, str(path), *bounds[s], str(scratch / f"val-{round_}-{i:06d}.bin")) for i, s, path in todo]
            results = pool.imap(val_candidates, tasks)
        for (_, s, _), candidates in zip(todo, results):
            found[s].extend(candidates)
        for s in list(pending):
            got = sum(c["tokens"] for c in found[s])
            if got >= plan.quotas[s] or rates[s] >= 1:
                pending.discard(s)
            else:
                log.info(
                    "source %s: %d of %d validation tokens below rate %.3g; raising it",
                    s,
                    got,
                    plan.quotas[s],
                    rates[s],
                )
                done_below[s] = rates[s]
                rates[s] = min(1.0, rates[s] * (max(2.0, token_plan.VAL_MARGIN * plan.quotas[s] / got) if got else 4.0))
    selected = []
    for s, candidates in found.items():
        total = 0
        for candidate in sorted(candidates, key=lambda c: c["hash"]):
            if total >= plan.quotas[s]:
                break
            selected.append(candidate)
            total += candidate["tokens"]
    return sorted(selected, key=lambda c: (c["part"], c["row"]))


def _heldout_overlap(workers: int, plan: Plan, held: dict[int, set[int]], cfg: PretokenizeSection, scratch: Path):
    """The train samples that share a run of heldout_ngram words with a held-out document
    (kiln.data.heldout), in (part, row) order; none when the setting is 0. `held`: the held-out
    samples' first rows, per part. In `workers` processes of its own: they need no tokenizer, so
    they start in a fraction of the encoding pool's time, which a gather may never start."""
    n = cfg.heldout_ngram
    if not n:
        return []
    paths = {i: path for i, _, path in plan.parts}
    index = scratch / "heldout-ngrams.npz"
    scans = [
        (i, str(path), frozenset(held.get(i, ())), str(index), n, cfg.repo_context)
        for i, s, path in plan.parts
        if plan.targets[s] != 0
    ]
    with ProcessPoolExecutor(min(workers, len(scans))) if workers > 1 and len(scans) > 1 else nullcontext() as pool:
        run = pool.map if pool is not None else map
        tasks = [(str(paths[i]), sorted(rows), n, cfg.repo_context) for i, rows in sorted(held.items())]
        grams = save_index(index, list(run(heldout_grams, tasks)))
        found = [sample for part in run(overlapping_samples, scans) for sample in part]
    removed = removals(found, index, n, cfg.heldout_guard)
    index.unlink()
    log.info(
        "held-out split: %d %d-word n-grams; %d train samples hold one, %d of them one at most %d hold: left out",
        grams,
        n,
        len(found),
        len(removed),
        cfg.heldout_guard,
    )
    return removed


def copy_range(dst, src_path: Path, start: int, n_bytes: int) -> None:
    with open(src_path, "rb") as src:
        src.seek(start)
        while n_bytes > 0:
            block = src.read(min(n_bytes, 8 << 20))
            if not block:
                raise KilnError(f"pretokenize: {src_path} ended {n_bytes} bytes early")
            dst.write(block)
            n_bytes -= len(block)


@dataclasses.dataclass(frozen=True)
class _Encoded:
    """A part's train-side samples to take, in order: their counts (COUNT_COLUMNS) and where each
    one's ids start in `file`; `scratch`: the file is this job's, deleted once copied."""

    file: Path
    counts: np.ndarray
    offsets: np.ndarray
    scratch: bool


def _encoded_here(pool: WorkerPool, parts: list, skip: dict[int, set[int]], plan: Plan, done: set[str], scratch: Path):
    """(index, source, _Encoded) of every part whose source still wants tokens, encoded by the pool
    without its held-out samples: one job does all the work."""
    order: deque = deque()

    def tasks():
        for i, s, path in parts:
            if s not in done and plan.targets[s] != 0:
                order.append((i, s))
                yield i, str(path), frozenset(skip.get(i, ())), str(scratch / f"{i:06d}.bin")

    for _, counts in pool.imap(train_part, tasks()):
        i, s = order.popleft()
        yield i, s, _Encoded(scratch / f"{i:06d}.bin", counts, sample_offsets(counts), scratch=True)


def _encoded_by_parts(
    encoded: dict[int, EncodedPart], skip: dict[int, set[int]], plan: Plan, done: set[str], pool: WorkerPool, scratch
):
    """(index, source, _Encoded) of every part whose source still wants tokens, as pretokenize_part
    jobs encoded them whole, the held-out samples left out; a part the plan expected the budget not to
    reach, which its job left unencoded, is encoded here."""
    for i, s, path in plan.parts:
        if s in done or plan.targets[s] == 0:
            continue
        if i not in plan.train_parts:
            log.info("part %d (%s): past the plan's estimate of the budget's reach, encoded here", i, s)
            yield from _encoded_here(pool, [(i, s, path)], skip, plan, done, scratch)
            continue
        part = encoded[i]
        keep = ~np.isin(part.rows, np.fromiter(skip.get(i, ()), dtype=np.int64))
        yield i, s, _Encoded(part.train_file, part.counts[keep], part.offsets[keep], scratch=False)


def _copy_samples(dst, part: _Encoded, n: int, itemsize: int) -> None:
    """The ids of the part's first n samples, one copy per run of samples adjacent in its file."""
    starts, lengths = part.offsets[:n], part.counts[:n, 0]
    breaks = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1]) + 1
    for first, last in zip([0, *breaks], [*(breaks - 1), n - 1]):
        length = int(starts[last] + lengths[last] - starts[first])
        copy_range(dst, part.file, int(starts[first]) * itemsize, length * itemsize)


def _write_train(encoded, plan: Plan, done: set[str], out_dir: Path) -> dict[str, Counter]:
    """train.bin from the encoded parts, in order, each source cut at its target (adding to `done`
    the sources that reached it); per-source counts."""
    counts = {s: Counter() for s in plan.targets}
    itemsize = plan.dtype.itemsize
    with open(out_dir / "train.bin", "wb") as train:
        for i, s, part in encoded:
            if s in done:  # encoded while the source's budget was being reached
                if part.scratch:
                    part.file.unlink()
                continue
            samples = part.counts
            if plan.targets[s] is not None:
                reached = np.cumsum(samples[:, 0]) >= plan.targets[s] - counts[s]["tokens"]
                if reached.any():
                    samples = samples[: int(np.argmax(reached)) + 1]
                    done.add(s)
            if len(samples):
                _copy_samples(train, part, len(samples), itemsize)
            if part.scratch:
                part.file.unlink()
            if faults.planned():  # KILN_DATA_FAULT: killed with train.bin part written, on disk
                train.flush()
                faults.kill_point("pretokenize")
            counts[s].update(dict(zip(COUNT_COLUMNS, samples.sum(axis=0).tolist())))
            log.info(
                "part %d/%d (%s) encoded: %d train tokens so far",
                i + 1,
                len(plan.parts),
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
                copy_range(f, Path(sample["file"]), sample["offset"] * itemsize, sample["tokens"] * itemsize)
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
    part_dirs: list[Path] | None = None,
) -> dict:
    """Write train.bin, val.bin, val_ids.txt and last meta.json to out_dir; return the meta. Texts longer than
    max_chars characters are encoded a slice at a time (see kiln.data.encoders). With `part_dirs`
    (one pretokenize_part output per raw part, in order) the parts' encodings are gathered, not
    redone: the same bytes as encoding here."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    the_plan = plan(raw_dir, tokenizer_path, seed, cfg, max_chars)
    encoded = None
    if part_dirs is not None:
        if len(part_dirs) != len(the_plan.parts):
            raise KilnError(f"pretokenize: {len(part_dirs)} encoded parts given for {len(the_plan.parts)} raw parts")
        encoded = {i: token_parts.read(folder, the_plan.stamp(i)) for i, folder in enumerate(part_dirs)}
    log.info(
        "encoding with %s (%s)",
        the_plan.settings.backend,
        f"gathering {len(part_dirs)} encoded parts" if encoded else f"{workers} worker processes",
    )
    scratch = out_dir / ".scratch"
    scratch.mkdir()
    done: set[str] = set()
    with WorkerPool(workers, the_plan.settings) as pool:
        first_round = {i: part.candidates for i, part in encoded.items()} if encoded else None
        val = _select_val(pool, the_plan, scratch, first_round)
        val_sources = _write_val(
            val, the_plan.parts, list(the_plan.manifest["sources"]), out_dir, the_plan.dtype.itemsize
        )
        for leftover in scratch.iterdir():
            leftover.unlink()
        skip: dict[int, set[int]] = {}
        for sample in val:
            skip.setdefault(sample["part"], set()).add(sample["row"])
        removed = _heldout_overlap(workers, the_plan, skip, cfg, scratch)
        for sample in removed:
            skip.setdefault(sample["part"], set()).add(sample["row"])
        parts = (
            _encoded_by_parts(encoded, skip, the_plan, done, pool, scratch)
            if encoded
            else _encoded_here(pool, the_plan.parts, skip, the_plan, done, scratch)
        )
        train = _write_train(parts, the_plan, done, out_dir)
    scratch.rmdir()
    return _write_meta(the_plan, val, train, val_sources, removed, tokenizer_path, cfg, out_dir)


def pretokenize_part(
    raw_dir: Path, tokenizer_path: Path, index: int, out_dir: Path, seed: int, cfg: PretokenizeSection
) -> EncodedPart:
    """Encode raw part `index` whole into out_dir (kiln.data.token_parts): every sample laid out for
    training, and its candidates for the first validation round, for the gather (pretokenize with
    part_dirs) to take from. One pretokenize_part job per raw part is the stage's scatter."""
    the_plan = plan(raw_dir, tokenizer_path, seed, cfg)
    if not 0 <= index < len(the_plan.parts):
        raise KilnError(f"pretokenize_part: part {index} asked for; {raw_dir} has parts 0 to {len(the_plan.parts) - 1}")
    _, source, path = the_plan.parts[index]
    out_dir = Path(out_dir)
    with WorkerPool(1, the_plan.settings):
        if index not in the_plan.train_parts:  # left out by the mixture, or past the budget's reach
            (out_dir / token_parts.TRAIN).touch()
            rows, counts = np.zeros(0, np.int64), np.zeros((0, len(COUNT_COLUMNS)), np.int64)
        else:
            rows, counts = train_part((index, str(path), frozenset(), str(out_dir / token_parts.TRAIN)))
        if faults.planned():  # KILN_DATA_FAULT: killed with train.bin written, part.json not
            faults.kill_point("pretokenize_part")
        rate = the_plan.first_rates.get(source)
        candidates = (
            []
            if rate is None
            else val_candidates((index, str(path), *val_bounds(0.0, rate), str(out_dir / token_parts.VAL)))
        )
    token_parts.write(out_dir, rows, counts, candidates, the_plan.stamp(index))
    log.info(
        "part %d (%s, %s): %d samples, %d train tokens, %d validation candidates",
        index,
        source,
        path.name,
        len(rows),
        int(counts[:, 0].sum()),
        len(candidates),
    )
    return token_parts.read(out_dir, the_plan.stamp(index))


def _write_meta(
    the_plan: Plan,
    val: list[dict],
    train: dict[str, Counter],
    val_sources: dict,
    removed: list[dict],
    tokenizer_path: Path,
    cfg: PretokenizeSection,
    out_dir: Path,
) -> dict:
    """meta.json, what the shard stage, eval and the report read, written last."""
    manifest = the_plan.manifest
    sources = _per_source(manifest, the_plan.parts, val, train, the_plan.shares, the_plan.quotas, the_plan.targets)
    source_of = {i: s for i, s, _ in the_plan.parts}
    for s, entry in sources.items():  # left out of train for sharing heldout_ngram words with the held-out split
        entry["heldout_overlap_docs"] = sum(len(r["doc_ids"]) for r in removed if source_of[r["part"]] == s)
        entry["unused_docs"] -= entry["heldout_overlap_docs"]
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
        "dtype": the_plan.dtype.name,
        "vocab_size": the_plan.vocab,
        "padded_vocab_size": padded_vocab_size(the_plan.vocab),
        "tokenizer_sha256": the_plan.tokenizer_sha256,  # checkpoints compare it (kiln.train.fingerprint)
        "eos_id": the_plan.eos_id,
        "bos_id": the_plan.bos_id,  # first in every sample; None when the tokenizer has no BOS
        "encoder": {"name": the_plan.settings.backend, **the_plan.encoder_info},
        "splits": splits,
        "sources": sources,
        "val_sources": val_sources,
        "fim_modes": {m: sum(train[s][m] for s in train) for m in COUNT_COLUMNS[3:]},
        "repo_context": cfg.repo_context,
        # train samples left out for sharing heldout_ngram words with the held-out split (kiln.data.heldout)
        "heldout_overlap": {
            "ngram": cfg.heldout_ngram,
            "guard": cfg.heldout_guard,
            "samples": len(removed),
            "docs": sum(len(r["doc_ids"]) for r in removed),
            "examples": [{"doc_ids": r["doc_ids"], "why": r["why"]} for r in removed[:EXAMPLES]],
        },
    }
    if source_tokenizer_sha256(tokenizer_path):  # an hf tokenizer's source: init_from takes it as the same one
        meta["source_tokenizer_sha256"] = source_tokenizer_sha256(tokenizer_path)
    write_json(out_dir / "meta.json", meta)
    return meta
