"""The data stages' sections, each setting declared once (kiln.config.declare): download (and its
sources), tokenizer, pretokenize and shard."""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, Mapping

from pydantic import AfterValidator, Field, create_model, model_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import (
    DOWNLOAD,
    OUTPUT,
    PRETOKENIZE,
    RUN,
    TOKENIZER,
    VOCABULARY,
    Number,
    Section,
    group,
    optional,
    reads,
    setting,
)
from kiln.data.source_kinds import registry as source_kinds


def _variant(data: Any, kind: str, keys: tuple[str, ...], required: tuple[str, ...], defaults: Mapping) -> Any:
    """A variant section's raw dict with its kind's defaults filled in, once its keys are the kind's
    (`keys`, the shared ones included) and the kind's `required` ones are there."""
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise PydanticCustomError(
            "kiln", f"kind {kind} has no key {', '.join(unknown)} (its keys: {', '.join(sorted(keys))})"
        )
    missing = [key for key in required if key not in data]
    if missing:
        raise PydanticCustomError("kiln", f"kind {kind} needs key {', '.join(missing)}")
    return {**defaults, **data}


# download.sources' name and kind; Source adds the other keys. Its keys carry no Reads: download.sources
# is one setting, read whole.
class _Source(Section):
    KEY: ClassVar[str] = "download.sources"
    name: str = setting(
        description=(
            "The source's folder of parts and its documents' id prefix; unique among the sources, and the "
            "name pretokenize.mixture weights it by."
        ),
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    # The kinds registered at import, for the schema and docs; a source's keys are its kind's (_fill_kind).
    kind: Literal[source_kinds.names()] = setting(
        description="; ".join(f"{k.name}: {k.about}" for k in source_kinds.KINDS.values()) + "."
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_kind(cls, data: Any) -> Any:
        kind = data.get("kind") if isinstance(data, dict) else None
        if not isinstance(kind, str) or kind not in source_kinds.KINDS:
            return data  # not a mapping, or no known kind: the fields' own checks name the problem
        if "sample_seed" in data and "sample" not in data:
            raise PydanticCustomError("kiln", "sample_seed seeds a sample: set sample too")
        declared = source_kinds.get(kind)
        keys = ("name", "kind", *declared.keys.model_fields, *_EVERY_SOURCE)
        return _variant(data, kind, keys, declared.required(), declared.defaults())


_EVERY_SOURCE = {
    "max_rows": (int | None, optional("Keep at most this many documents.", ge=1)),
    "max_bytes": (int | None, optional("Keep documents up to this many UTF-8 bytes.", ge=1)),
    "sample": (
        Number | None,
        optional(
            """Keep this fraction of the source's documents, the same ones on every run: a document is kept
            when a hash of sample_seed and its id falls below it, so the sample is spread over the whole
            source, not a prefix. max_rows and max_bytes then count the sampled documents.""",
            gt=0,
            le=1,
        ),
    ),
    "sample_seed": (int | None, optional("The seed of the sample's hash (0 when unset).", ge=0)),
    # Required here, but every kind fills its own default in (_fill_kind), so a config may leave it out.
    "quality": (
        Literal["code", "prose", "none"],
        setting(
            description="Which quality filters its documents pass (download.filters): by default its kind's ("
            + ", ".join(f"{k.name} {k.keys.QUALITY}" for k in source_kinds.KINDS.values())
            + ")."
        ),
    ),
}

# One of download.sources: its name and kind, every kind's keys (kiln.data.source_kinds: those of the
# other kinds unset), and the keys every source has.
Source = create_model("Source", __base__=_Source, **source_kinds.key_fields(), **_EVERY_SOURCE)


class NearDupSection(Section):
    """Drop near duplicates of an earlier document of any source (kiln.data.near_dup): MinHash of word
    shingles, banded into LSH; a document sharing a band with a kept one is dropped. Defaults: BigCode's
    for The Stack and StarCoder (5-word shingles, Jaccard 0.7 over 256 permutations: 25 bands of 10 rows).
    FineWeb's, for prose: bands 14, rows 8 (~0.75)."""

    KEY: ClassVar[str] = "download.near_dup"
    enabled: bool = setting(True, "false keeps near duplicates (no MinHash is computed).", DOWNLOAD)
    shingle: int = setting(5, "Words per shingle.", DOWNLOAD, ge=1)
    bands: int = setting(25, "LSH bands; permutations = bands x rows.", DOWNLOAD, ge=1)
    rows: int = setting(10, "MinHash values per band.", DOWNLOAD, ge=1)
    seed: int = setting(42, "The MinHash permutations' seed.", DOWNLOAD, ge=0)


class FiltersSection(Section):
    """Quality filters, each on unless set false here; a source's `quality` picks the family (code:
    StarCoder's four; prose: Gopher's seven, at FineWeb's thresholds). Every drop is counted per source in
    the manifest, with examples (kiln.data.quality has each rule and its source)."""

    KEY: ClassVar[str] = "download.filters"
    auto_generated: bool = setting(
        True,
        'code: drops a file saying it is generated ("auto-generated", "do not edit", ...) in its first 5 lines.',
        DOWNLOAD,
    )
    long_lines: bool = setting(
        True, "code: drops a file whose mean line is over 100 characters or with a line over 1000.", DOWNLOAD
    )
    alphanumeric: bool = setting(True, "code: drops a file under 25% alphanumeric characters.", DOWNLOAD)
    encoded_data: bool = setting(
        True, "code: drops a file that is largely base64, hex bytes or \\u escapes: data disguised as code.", DOWNLOAD
    )
    gopher_words: bool = setting(True, "prose: keeps documents of 50 to 100,000 words.", DOWNLOAD)
    gopher_word_length: bool = setting(True, "prose: keeps a mean word length of 3 to 10 characters.", DOWNLOAD)
    gopher_symbols: bool = setting(True, 'prose: keeps "#" and "..." under 0.1 per word.', DOWNLOAD)
    gopher_bullets: bool = setting(True, "prose: keeps at most 90% of lines starting with a bullet.", DOWNLOAD)
    gopher_ellipsis: bool = setting(True, "prose: keeps at most 30% of lines ending with an ellipsis.", DOWNLOAD)
    gopher_alpha_words: bool = setting(True, "prose: keeps at least 80% of words holding a letter.", DOWNLOAD)
    gopher_stop_words: bool = setting(
        True, "prose: keeps documents with at least 2 of the, be, to, of, and, that, have, with.", DOWNLOAD
    )


class DecontaminateSection(Section):
    """Drop documents sharing a word n-gram with an evaluation set before the tokenizer sees them
    (kiln.data.decontaminate); each counted, with examples, in the manifest. The eval stage's
    contamination check still measures what is left."""

    KEY: ClassVar[str] = "download.decontaminate"
    humaneval: bool = setting(True, "HumanEval's 164 prompts and canonical solutions.", DOWNLOAD)
    ngram: int = setting(13, "Words per n-gram (GPT-3's 13).", DOWNLOAD, ge=1)


class DownloadSection(Section):
    KEY: ClassVar[str] = "download"
    sources: Annotated[tuple[Source, ...], Field(strict=False)] = setting(
        description=(
            f"The corpora to download, each with its kind's keys ({', '.join(source_kinds.names())}); a "
            "document repeating an earlier one, of any source, is dropped (dedup, near_dup)."
        ),
        tag=reads("the report names them", download=OUTPUT, report=OUTPUT),
        min_length=1,
    )
    rows_per_part: int = setting(
        1000, "Documents per parquet part (a part is also cut at 64 MiB of text).", DOWNLOAD, ge=1
    )
    scatter_mb: Number = setting(
        8,
        """Input megabytes per download_part job: each checks a share of the files of a source (stdlib and
        local files, an hf dataset's parquet data files) for filters, decontamination, hashes and MinHash,
        and the download job gathers them into the bytes one job writes. A budgeted source's shares past
        the budget's expected reach, and hf streams that cannot be cut by file (one data file, a json
        builder), are read by the download job.""",
        reads("how many download_part jobs check the input; the bytes equal one job's", download=RUN),
        gt=0,
    )
    dedup: bool = setting(
        True, "Drop exact duplicates (same text, by sha256) of an earlier document of any source.", DOWNLOAD
    )
    near_dup: NearDupSection = group(NearDupSection)
    decontaminate: DecontaminateSection = group(DecontaminateSection)
    filters: FiltersSection = group(FiltersSection)
    min_doc_bytes: int = setting(
        1, "Documents shorter than this (UTF-8 bytes) are dropped and counted.", DOWNLOAD, ge=1
    )
    max_doc_bytes: int | None = optional(
        "Documents longer than this (UTF-8 bytes) are dropped and counted; no limit when unset.", DOWNLOAD, ge=1
    )
    invalid_utf8: Literal["skip", "fail"] = setting(
        "skip",
        "A file or row that is not valid UTF-8 is skipped and counted, or fails the stage naming it.",
        DOWNLOAD,
    )
    retries: int = setting(
        5,
        """Attempts after a network failure of a hub source, each from its last complete part (a
        download_part job's, or the plan's listing of the data files: from its start).""",
        reads("a retry resumes from the last complete part", download=RUN),
        ge=0,
    )
    retry_backoff_s: Number = setting(
        5, "Wait before the first retry; doubled for each further one.", reads(download=RUN), ge=0
    )


# A tokenizer kind's own keys (beyond kind and heldout_docs), those it needs, and the defaults it fills
# in. tiktoken needs exactly one of encoding and path, which _fill_kind checks apart.
TOKENIZER_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("vocab_size", "train_bytes"),
    "file": ("path",),
    "tiktoken": ("encoding", "path", "pattern"),
    "hf": ("path",),
}
TOKENIZER_REQUIRED: dict[str, tuple[str, ...]] = {"train": (), "file": ("path",), "tiktoken": (), "hf": ("path",)}
TOKENIZER_DEFAULTS: dict[str, dict[str, Any]] = {"train": {"vocab_size": 8192, "train_bytes": 100_000_000}}


class TokenizerSection(Section):
    """kind train: a byte-level BPE trained on the downloaded documents (vocab_size, train_bytes); file: a
    pretrained tokenizer.json (path); tiktoken: a local tiktoken encoding, by name from tiktoken's cache
    (encoding) or a .tiktoken ranks file (path, pattern); hf: a Hugging Face model folder's tokenizer as it
    is (path), to continue that model (train.init_from: {hf: FOLDER}). Missing special tokens are appended
    to a pretrained vocabulary (hf: its own end-of-text and FIM tokens are used where it has them, and only
    the roles the run uses are appended: none with pretokenize.fim.rate 0 and no repo_context)."""

    KEY: ClassVar[str] = "tokenizer"
    kind: Literal["train", "file", "tiktoken", "hf"] = setting(
        "train",
        "train: a BPE trained here; file: a tokenizer.json; tiktoken: a tiktoken encoding; hf: a model folder's.",
        VOCABULARY,
    )
    heldout_docs: int = setting(200, "Documents held out of BPE training to measure bytes per token.", TOKENIZER, ge=1)
    vocab_size: int | None = optional(
        "(train) BPE vocabulary including the special tokens; the model pads it to a multiple of 64.",
        VOCABULARY,
        ge=1,
    )
    train_bytes: int | None = optional(
        "(train) Bytes of documents to train on, sampled evenly across every source.", TOKENIZER, ge=1
    )
    path: str | None = optional(
        """(file) A tokenizer.json. (tiktoken) A .tiktoken ranks file. (hf) A Hugging Face model folder: its
        tokenizer.json, and the eos_token its tokenizer_config.json (or special_tokens_map.json) names.""",
        VOCABULARY,
    )
    encoding: str | None = optional(
        "(tiktoken) A tiktoken encoding name (gpt2, cl100k_base, ...) in its local cache.", VOCABULARY
    )
    pattern: str | None = optional("(tiktoken) The split regex for path (default: GPT-2's).", TOKENIZER)

    @model_validator(mode="before")
    @classmethod
    def _fill_kind(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kind = data.get("kind", cls.model_fields["kind"].default)
        if not isinstance(kind, str) or kind not in TOKENIZER_KEYS:
            return data  # the kind field's own check names it
        keys = ("kind", "heldout_docs", *TOKENIZER_KEYS[kind])
        data = _variant(data, kind, keys, TOKENIZER_REQUIRED[kind], TOKENIZER_DEFAULTS.get(kind, {}))
        if kind == "tiktoken" and ("encoding" in data) == ("path" in data):
            raise PydanticCustomError("kiln", "kind tiktoken needs exactly one of encoding and path")
        return data


class Fim(Section):
    """StarCoder2: rate 0.5, psm 0.5, spm 0.5, middle_only 0. Seed 000: psm 0.5, spm 0.25, middle_only 0.25."""

    KEY: ClassVar[str] = "pretokenize.fim"
    rate: Number = setting(0.5, "Share of train documents transformed.", PRETOKENIZE, ge=0, le=1)
    psm: Number = setting(
        0.5, "Share of the transformed documents laid out prefix, suffix, middle.", PRETOKENIZE, ge=0, le=1
    )
    spm: Number = setting(
        0.25, "Share of the transformed documents laid out suffix, prefix, middle.", PRETOKENIZE, ge=0, le=1
    )
    middle_only: Number = setting(
        0.25, "Share of the transformed documents reduced to the middle alone.", PRETOKENIZE, ge=0, le=1
    )
    min_chars: int = setting(100, "Documents shorter than this are never FIM-transformed.", PRETOKENIZE, ge=0)


# A mixture weight: any positive number (normalised over the mixture).
Weight = Annotated[Number, Field(gt=0)]


class PretokenizeSection(Section):
    KEY: ClassVar[str] = "pretokenize"
    val_tokens: int = setting(
        1_000_000,
        """Tokens held out for validation, by whole document (the smallest hashes of document ids), each
        source giving its share (mixture weight, else share of the corpus bytes).""",
        PRETOKENIZE,
        ge=1,
    )
    heldout_ngram: int = setting(
        50,
        """Leave out of the train side every sample sharing a run of this many words with a held-out document
        (0: off). 50 finds copied text; 13 (GPT-3's, for benchmarks) would remove licence headers and code
        idioms (docs/benchmarks.md).""",
        PRETOKENIZE,
        ge=0,
    )
    heldout_guard: int = setting(
        10,
        """A held-out n-gram counts (heldout_ngram) only where at most this many train samples hold it: text
        that more samples share is boilerplate, such as a licence header, not a copy.""",
        PRETOKENIZE,
        ge=1,
    )
    train_tokens: int | None = optional(
        "Train tokens in all, shared among sources by mixture weight; every document when unset.", PRETOKENIZE, ge=1
    )
    mixture: Annotated[Mapping[str, Weight], Field(strict=False), AfterValidator(MappingProxyType)] = setting(
        lambda: MappingProxyType({}),  # read-only, as the section is
        """Source name -> weight (by tokens; normalised to sum to 1). Sources not listed are not used. Needs
        train_tokens. Empty: every source whole.""",
        PRETOKENIZE,
    )
    repo_context: bool = setting(
        False,
        """Group consecutive files of one repository (sources with a repo_column) StarCoder2-style:
        <repo_name>name<file_sep>path\\ncode...<|endoftext|>, FIM per file, never on the metadata.""",
        PRETOKENIZE,
    )
    encoder: Literal["auto", "tiktoken", "tokenizers"] = setting(
        "auto",
        "auto uses tiktoken when it gives the same ids as tokenizers on a check sample.",
        reads("meta.json records the encoder used", pretokenize=OUTPUT),
    )
    fim: Fim = group(Fim)


class ShardSection(Section):
    KEY: ClassVar[str] = "shard"
    seq_len: int = setting(
        256,
        "Tokens a training sequence predicts; each stored row holds seq_len + 1 tokens.",
        reads("also the model's context", shard=OUTPUT, report=OUTPUT, rehearse=OUTPUT),
        ge=1,
    )
    rows_per_shard: int = setting(16384, "Rows per shard file.", reads(shard=OUTPUT), ge=1)
