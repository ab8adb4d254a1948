"""The tokenizer stage: the run's tokenizer.json, by one of four routes (`tokenizer.kind`):

- `train`: a byte-level BPE trained with `tokenizers` on a byte budget sampled evenly across the
  downloaded documents of every source (documents over BIG_TEXT_BYTES left out);
- `file`: a pretrained tokenizer.json;
- `tiktoken`: a tiktoken encoding available locally, by name (tiktoken's cache) or as a .tiktoken
  ranks file, converted to tokenizer.json (kiln.data.encoders);
- `hf`: a Hugging Face model folder's tokenizer as it is (its ids, its special tokens), for a run that
  continues that model (train.init_from: {hf: FOLDER}), with a token appended only for a role the run
  uses (kiln.config.settings.derived) that the source lacks; with none appended, tokenizer.json is the
  source's file byte for byte (write_tokenizer).

and its stats.json: each special token role's spelling and the source's BOS (how each route picks
them, and how the later stages read them back: kiln.data.tokenizer), the vocabulary and its padded
size, and bytes per token measured on held-out documents (the smallest hashes of seed and id: never
trained on).
"""

from __future__ import annotations

import heapq
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Iterable, Iterator

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln.config.data_sections import TokenizerSection
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.encoders import GPT2_PATTERN, tokenizer_from_tiktoken
from kiln.data.sources import part_paths, read_documents, read_part_column
from kiln.data.tokenizer import EOS, KILN_ROLES, id_space, load_tokenizer, padded_vocab_size, special_ids
from kiln.data.utf8text import BIG_TEXT_BYTES, Utf8Text
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file, stable_hash

log = logging.getLogger("kiln.tokenizer")

# Qwen2.5-Coder's spellings of the FIM and repository roles; StarCoder2 and SantaCoder use Kiln's.
QWEN_SPELLINGS = {t: "<|" + t.strip("<>") + "|>" for t in SPECIAL_TOKENS[1:]}
EOS_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # where a HF folder names its eos_token
BOS_PROBE = "a"  # a text whose encoding with and without the post-processor's tokens shows a BOS
# The tokenizer stage's peak RSS against train_bytes, fitted by bench/tokenizer_scale.py (last in the tree at 24e9373) on real code
# (site-packages' .py files, vocab 32,768): 615, 677 and 879 MiB at 30, 100 and 300 MB, least squares
# 582 MiB + 986 MiB per GB (docs/benchmarks.md, "The tokenizer at seed scale"). Rounded up here; the
# growth is the BPE trainer's table of distinct pre-tokenized words, which grows slower than the bytes.
TRAIN_RSS_BASE_MB, TRAIN_RSS_MB_PER_GB = 600, 1000
MEMORY_HEADROOM = 1.5  # the fit is three points of one corpus; prose has more distinct words than code


def training_memory_mb(cfg: TokenizerSection) -> int:
    """The host memory (MiB) to ask for the tokenizer stage: the fit at train_bytes, with headroom; a
    pretrained tokenizer's stage only loads it and measures bytes per token."""
    gigabytes = (cfg.train_bytes or 0) / 1e9 if cfg.kind == "train" else 0.0
    return math.ceil(MEMORY_HEADROOM * (TRAIN_RSS_BASE_MB + TRAIN_RSS_MB_PER_GB * gigabytes))


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


def encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of each text (no special tokens added); runs in parallel inside `tokenizers`."""
    return [enc.ids for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]


def bytes_per_token(tokenizer: Tokenizer, texts: list[str]) -> float:
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(ids) for ids in encode_batch(tokenizer, texts))
    return n_bytes / max(n_tokens, 1)


def with_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with every Kiln special token, those it lacks appended as special tokens."""
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        log.info("adding special tokens the vocabulary lacks: %s", ", ".join(missing))
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    tokenizer.encode_special_tokens = True
    return tokenizer


def _heldout_ids(raw_dir: Path, manifest: dict, n: int, seed: int) -> set[str]:
    """The n documents with the smallest hash of (seed, id): read from the id column alone."""
    ids = (i for _, path in part_paths(raw_dir, manifest) for i in read_part_column(path, "id"))
    heldout = set(heapq.nsmallest(n, ids, key=lambda i: stable_hash(seed, "tokenizer-heldout", i)))
    if len(heldout) == manifest["rows"]:
        raise KilnError(
            f"tokenizer: tokenizer.heldout_docs={n} leaves none of the {manifest['rows']} "
            "documents to train on; lower it or add documents"
        )
    return heldout


def _sample(raw_dir: Path, manifest: dict, heldout: set[str], budget: int, seed: int, used: dict) -> Iterator[str]:
    """Training texts: every non-held-out document with probability budget / corpus bytes (a hash of
    seed and id decides), so each source is sampled in proportion to its size, stopping at budget."""
    rate = min(1.0, budget / max(manifest["bytes"], 1))
    for doc in read_documents(raw_dir, manifest, BIG_TEXT_BYTES):
        if doc.id in heldout or stable_hash(seed, "tokenizer-sample", doc.id) >= rate * 2**64:
            continue
        if isinstance(doc.text, Utf8Text):  # one huge document would skew the merges and cost its size 4x
            log.info("not training on %s: %d bytes", doc.id, doc.text.nbytes)
            continue
        size = len(doc.text.encode("utf-8"))
        if used["docs"] and used["bytes"] + size > budget:
            return  # at most budget bytes (the first document always, so training is never empty)
        used["docs"] += 1
        used["bytes"] += size
        used["by_source"][doc.source] = used["by_source"].get(doc.source, 0) + size
        yield doc.text


def source_eos(folder: Path, tokenizer: Tokenizer) -> str:
    """The end-of-text token a HF folder names (eos_token of tokenizer_config.json, else of
    special_tokens_map.json): Kiln ends every document with it, as the source was trained to."""
    for name in EOS_FILES:
        path = folder / name
        token = _named_token(path, "eos_token")
        if not token:
            continue
        if tokenizer.token_to_id(token) is None:
            raise KilnError(
                f"tokenizer.path: {path} names eos_token {token!r}, which {folder / 'tokenizer.json'} lacks"
            )
        return token
    raise KilnError(
        f"tokenizer.path: neither {folder / EOS_FILES[0]} nor {folder / EOS_FILES[1]} names an eos_token; Kiln "
        "ends every document with the source's end-of-text token: add eos_token to tokenizer_config.json"
    )


def _named_token(path: Path, key: str) -> str | None:
    """The token a HF tokenizer file names under key: a string, or an AddedToken's fields."""
    token = read_json(path).get(key) if path.is_file() else None
    return token.get("content") if isinstance(token, dict) else token


def source_bos(folder: Path, tokenizer: Tokenizer) -> str | None:
    """The BOS a HF folder's tokenizer starts every document with, or None: by tokenizer_config.json's
    add_bos_token when it has the key (its bos_token, else special_tokens_map.json's, then must be in
    the vocabulary), else by the tokenizer.json's post-processor (one token put before a single
    sequence: Llama 3's tokenizer.json, whose config has no add_bos_token, says it only there)."""
    config_path = folder / EOS_FILES[0]
    config = read_json(config_path) if config_path.is_file() else {}
    if "add_bos_token" in config:
        if not config["add_bos_token"]:
            return None
        token = next(filter(None, (_named_token(folder / name, "bos_token") for name in EOS_FILES)), None)
        if token is None:
            raise KilnError(
                f"tokenizer.path: {config_path} says add_bos_token: true and names no bos_token (nor does "
                f"{folder / EOS_FILES[1]})"
            )
        if tokenizer.token_to_id(token) is None:
            raise KilnError(
                f"tokenizer.path: {config_path} says add_bos_token: true with bos_token {token!r}, which "
                f"{folder / 'tokenizer.json'} lacks"
            )
        return token
    plain = tokenizer.encode(BOS_PROBE, add_special_tokens=False).ids
    added = tokenizer.encode(BOS_PROBE, add_special_tokens=True).ids
    if len(added) > len(plain) and added[1 : 1 + len(plain)] == plain:
        return tokenizer.id_to_token(added[0])
    return None


def hf_tokenizer(folder: str | Path, uses: Iterable[str] = SPECIAL_TOKENS) -> tuple[Tokenizer, dict[str, str]]:
    """A Hugging Face folder's tokenizer.json as it is and each role's spelling in it; Kiln's spelling
    appended (as a special token, after the source's ids) for a role the run `uses` that the source has
    no token for, and a role neither has left out (a drop-in continuation: the source's tokenizer as it
    is). Its BOS, when it starts every document with one (source_bos), is the tokenizer's `kiln_bos`."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise KilnError(
            f"tokenizer.path: {folder} has no tokenizer.json (kind hf takes a Hugging Face model folder "
            "with a fast tokenizer, as save_pretrained writes it)"
        )
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
        raise KilnError(f"tokenizer.path: cannot load {path} as a tokenizer.json: {exc}") from None
    roles = {EOS: source_eos(folder, tokenizer)}
    bos = source_bos(folder, tokenizer)
    if bos is None:
        log.info("%s adds no beginning-of-sequence token: samples are laid out text %s", folder, roles[EOS])
    else:
        log.info("the source starts every document with %s: so does every sample (%s text %s)", bos, bos, roles[EOS])
    uses = set(uses)
    for role in SPECIAL_TOKENS[1:]:
        own = next((t for t in (role, QWEN_SPELLINGS[role]) if tokenizer.token_to_id(t) is not None), None)
        if own is not None or role in uses:
            roles[role] = own or role
    unused = [role for role in SPECIAL_TOKENS[1:] if role not in roles]
    if unused:
        log.info("%s has no token for %s, which this run does not use: none appended", path, ", ".join(unused))
    missing = [t for t in roles.values() if tokenizer.token_to_id(t) is None]
    if missing:
        log.info(
            "%s has no token for %s: appended after its %d ids (train.init_from starts their rows at the "
            "mean of the source's)",
            path,
            ", ".join(missing),
            id_space(tokenizer),
        )
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    tokenizer.encode_special_tokens = True
    tokenizer.kiln_roles = roles
    tokenizer.kiln_bos = bos
    return tokenizer, roles


def prebuilt_tokenizer(cfg: TokenizerSection) -> Tokenizer:
    """A tokenizer the section names rather than trains (kind file or tiktoken) with every Kiln
    special token: the tokenizer stage's, which `kiln plan` and the rehearsal size the model by."""
    return with_special_tokens(_pretrained(cfg))


def _pretrained(cfg: TokenizerSection) -> Tokenizer:
    if cfg.kind == "file":
        try:
            return load_tokenizer(cfg.path)
        except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
            raise KilnError(f"tokenizer.path: cannot load {cfg.path!r} as a tokenizer.json: {exc}") from None
    if cfg.path is not None:
        try:
            ranks = load_tiktoken_bpe(cfg.path)
        except (OSError, ValueError) as exc:
            raise KilnError(f"tokenizer.path: cannot read {cfg.path!r} as a .tiktoken file: {exc}") from None
        encoding = tiktoken.Encoding(
            Path(cfg.path).stem, pat_str=cfg.pattern or GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}
        )
    else:
        try:
            encoding = tiktoken.get_encoding(cfg.encoding)
        except Exception as exc:  # unknown name, or not cached and no network
            raise KilnError(
                f"tokenizer.encoding: tiktoken cannot load {cfg.encoding!r} here (it must be "
                f"in tiktoken's local cache, TIKTOKEN_CACHE_DIR, when offline): {exc}"
            ) from None
    return tokenizer_from_tiktoken(encoding, SPECIAL_TOKENS)


def build_tokenizer(
    raw_dir: Path, cfg: TokenizerSection, seed: int, uses: Iterable[str] = SPECIAL_TOKENS
) -> tuple[Tokenizer, dict]:
    """The tokenizer section's tokenizer and its stats (bytes/token measured on held-out documents);
    `uses`: the roles the run's samples use (kiln.config.settings.derived), which decide what kind hf
    appends to its source (every other kind holds every role)."""
    raw_dir = Path(raw_dir)
    manifest = read_json(raw_dir / "manifest.json")
    heldout = _heldout_ids(raw_dir, manifest, cfg.heldout_docs, seed)
    used = {"docs": 0, "bytes": 0, "by_source": {}}
    bos = None  # only an hf source may start every document with a BOS
    if cfg.kind == "train":
        started = time.perf_counter()
        log.info("training a %d-token BPE on up to %d bytes", cfg.vocab_size, cfg.train_bytes)
        tokenizer = train_bpe(_sample(raw_dir, manifest, heldout, cfg.train_bytes, seed, used), cfg.vocab_size)
        log.info(
            "trained in %.1f s on %d documents (%d bytes)", time.perf_counter() - started, used["docs"], used["bytes"]
        )
        roles = dict(KILN_ROLES)
    elif cfg.kind == "hf":
        tokenizer, roles = hf_tokenizer(cfg.path, uses)
        bos = tokenizer.kiln_bos
        source_vocab = id_space(load_tokenizer(Path(cfg.path) / "tokenizer.json"))
    else:
        tokenizer, roles = prebuilt_tokenizer(cfg), dict(KILN_ROLES)
    heldout_texts = [
        doc.text
        for doc in read_documents(raw_dir, manifest, BIG_TEXT_BYTES)
        if doc.id in heldout and isinstance(doc.text, str)
    ]
    stats = {
        "kind": cfg.kind,
        "vocab_size": id_space(tokenizer),
        "padded_vocab_size": padded_vocab_size(id_space(tokenizer)),
        "special_tokens": roles,  # each role's spelling (token_roles reads it)
        "special_token_ids": special_ids(tokenizer, roles),
        "bos_token": bos,  # every sample starts with it when set (bos_token reads it)
        "bos_token_id": None if bos is None else tokenizer.token_to_id(bos),
        "train_docs": used["docs"],
        "train_bytes": used["bytes"],
        "train_bytes_by_source": used["by_source"],
        "heldout_docs": len(heldout_texts),
        "heldout_bytes_per_token": bytes_per_token(tokenizer, heldout_texts),
    }
    if cfg.kind == "hf":
        # The source tokenizer this one extends: init_from accepts it as the same (check_same_tokenizer).
        stats["source_tokenizer_sha256"] = sha256_file(Path(cfg.path) / "tokenizer.json")
        stats["added_tokens"] = [t for t in roles.values() if tokenizer.token_to_id(t) >= source_vocab]
        # The rows an export keeps (kiln.data.tokenizer.export_vocab_size): the source model's, which may
        # exceed its tokenizer's ids (config.json's vocab_size), else its tokenizer's.
        stats["source_vocab_size"] = _source_rows(Path(cfg.path)) or source_vocab
    return tokenizer, stats


def _source_rows(folder: Path) -> int | None:
    """The vocab_size of a HF folder's config.json, when it has one (a tokenizer-only folder has not)."""
    config = folder / "config.json"
    return read_json(config).get("vocab_size") if config.is_file() else None


def write_tokenizer(tokenizer: Tokenizer, cfg: TokenizerSection, stats: dict, path: Path) -> None:
    """The stage's tokenizer.json: an hf source's own file, byte for byte, when nothing was appended to it
    (a drop-in continuation keeps the very file its model card, chat template and tools were made for);
    else as `tokenizers` writes it."""
    if cfg.kind == "hf" and not stats["added_tokens"]:
        shutil.copyfile(Path(cfg.path) / "tokenizer.json", path)
    else:
        tokenizer.save(str(path))
