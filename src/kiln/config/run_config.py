"""The typed run config: the data, model, eval, plan and wandb sections (kiln.config.sections has the
machinery and the train and smoke sections), and RunConfig, which holds every section of a run.

As there, the schema owns every default and description, `of` builds a section from a validated dict
and `as_dict` gives that dict back; a key only some variants of a section have (tokenizer.kind's
keys, a source kind's keys) is an unset-able field, None where the variant lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from kiln.config.sections import Section, SmokeSection, TrainSection, unset


@dataclass(frozen=True)
class Source(Section):
    """One of download.sources: the union of every kind's keys (stdlib, local, hf), those of the other
    kinds None."""

    KEY: ClassVar[str] = "download.sources"
    name: str
    kind: str
    include: tuple[str, ...] | None = unset()  # stdlib's
    paths: tuple[str, ...] | None = unset()  # local's
    dataset: str | None = unset()  # hf's, down to data_files
    config: str | None = unset()
    split: str | None = unset()
    revision: str | None = unset()
    data_files: tuple[str, ...] | None = unset()
    text_column: str | None = unset()  # local's and hf's, down to repo_column
    path_column: str | None = unset()
    repo_column: str | None = unset()
    max_rows: int | None = unset()  # every kind's budgets
    max_bytes: int | None = unset()
    quality: str  # which quality filters (kiln.data.quality): code, prose or none


@dataclass(frozen=True)
class NearDupSection(Section):
    """download.near_dup: MinHash LSH over word shingles (kiln.data.near_dup)."""

    KEY: ClassVar[str] = "download.near_dup"
    enabled: bool
    shingle: int
    bands: int
    rows: int
    seed: int


@dataclass(frozen=True)
class FiltersSection(Section):
    """download.filters: each quality filter of kiln.data.quality, on or off."""

    KEY: ClassVar[str] = "download.filters"
    auto_generated: bool
    long_lines: bool
    alphanumeric: bool
    encoded_data: bool
    gopher_words: bool
    gopher_word_length: bool
    gopher_symbols: bool
    gopher_bullets: bool
    gopher_ellipsis: bool
    gopher_alpha_words: bool
    gopher_stop_words: bool


@dataclass(frozen=True)
class DecontaminateSection(Section):
    """download.decontaminate: documents sharing a word n-gram with an eval set are dropped (kiln.data.decontaminate)."""

    KEY: ClassVar[str] = "download.decontaminate"
    humaneval: bool
    ngram: int


@dataclass(frozen=True)
class DownloadSection(Section):
    KEY: ClassVar[str] = "download"
    sources: tuple[Source, ...]
    rows_per_part: int
    scatter_mb: float
    dedup: bool
    near_dup: NearDupSection
    decontaminate: DecontaminateSection
    filters: FiltersSection
    min_doc_bytes: int
    max_doc_bytes: int | None = unset()
    invalid_utf8: str
    retries: int
    retry_backoff_s: float


@dataclass(frozen=True)
class TokenizerSection(Section):
    """The `tokenizer` section: kind's keys, the others' None (kind train: vocab_size, train_bytes;
    file: path; tiktoken: encoding, or path and pattern; hf: path, a Hugging Face model folder)."""

    KEY: ClassVar[str] = "tokenizer"
    kind: str
    heldout_docs: int
    vocab_size: int | None = unset()
    train_bytes: int | None = unset()
    path: str | None = unset()
    encoding: str | None = unset()
    pattern: str | None = unset()


@dataclass(frozen=True)
class Fim(Section):
    KEY: ClassVar[str] = "pretokenize.fim"
    rate: float
    psm: float
    spm: float
    middle_only: float
    min_chars: int


@dataclass(frozen=True)
class PretokenizeSection(Section):
    KEY: ClassVar[str] = "pretokenize"
    val_tokens: int
    heldout_ngram: int
    heldout_guard: int
    train_tokens: int | None = unset()
    mixture: Mapping[str, float]  # source name -> weight, read-only
    repo_context: bool
    encoder: str
    fim: Fim


@dataclass(frozen=True)
class ShardSection(Section):
    KEY: ClassVar[str] = "shard"
    seq_len: int
    rows_per_shard: int


@dataclass(frozen=True)
class RopeScalingSection(Section):
    """model.rope_scaling: kiln.config.models.RopeScaling's fields, as the schema has them."""

    KEY: ClassVar[str] = "model.rope_scaling"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelSection(Section):
    """The `model` section as written: a flavour and/or shape keys, every one optional (the flavour or
    kiln.config.models.ModelConfig fills the rest: model_config(section.as_dict(), ...))."""

    KEY: ClassVar[str] = "model"
    flavour: str | None = unset()
    family: str | None = unset()
    n_layer: int | None = unset()
    n_head: int | None = unset()
    d_model: int | None = unset()
    n_kv_head: int | None = unset()
    d_ff: int | None = unset()
    max_positions: int | None = unset()
    rope_theta: float | None = unset()
    norm_eps: float | None = unset()
    dropout: float | None = unset()
    bias: bool | None = unset()
    tie_embeddings: bool | None = unset()
    qkv_bias: bool | None = unset()
    rope_scaling: RopeScalingSection | None = unset()
    sliding_window: int | None = unset()


@dataclass(frozen=True)
class PlanSection(Section):
    KEY: ClassVar[str] = "plan"
    gpu: str
    mfu: float


@dataclass(frozen=True)
class Reference(Section):
    """eval.reference: source and exactly one of val_loss and bits_per_byte (the schema says so)."""

    KEY: ClassVar[str] = "eval.reference"
    val_loss: float | None = unset()
    bits_per_byte: float | None = unset()
    source: str


@dataclass(frozen=True)
class LmEval(Section):
    KEY: ClassVar[str] = "eval.lm_eval"
    tasks: tuple[str, ...]
    limit: int
    max_docs: int


@dataclass(frozen=True)
class HumanEvalSection(Section):
    KEY: ClassVar[str] = "eval.humaneval"
    problems: int | None  # None: all 164
    samples: int
    max_new_tokens: int


@dataclass(frozen=True)
class HumanEvalInfillSection(Section):
    KEY: ClassVar[str] = "eval.humaneval_infill"
    problems: int
    kinds: tuple[str, ...]
    modes: tuple[str, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class EvalSection(Section):
    KEY: ClassVar[str] = "eval"
    reference: Reference | None
    max_batches: int
    prompts: tuple[str, ...]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    infill_docs: int
    lm_eval: LmEval
    humaneval: HumanEvalSection
    humaneval_infill: HumanEvalInfillSection


@dataclass(frozen=True)
class WandbSection(Section):
    KEY: ClassVar[str] = "wandb"
    mode: str
    project: str


@dataclass(frozen=True)
class RunConfig(Section):
    """A run's validated config, every section typed. Built from the whole config (kiln.config.resolve)
    or from what one stage reads (kiln.stage.stage_config: the sections kiln.config.settings names for
    it), so a section, run_name or seed the stage does not read is None; as_dict gives back exactly the
    dict it was built from."""

    KEY: ClassVar[str] = ""
    run_name: str | None = unset()
    seed: int | None = unset()
    download: DownloadSection | None = unset()
    tokenizer: TokenizerSection | None = unset()
    pretokenize: PretokenizeSection | None = unset()
    shard: ShardSection | None = unset()
    model: ModelSection | None = unset()
    smoke: SmokeSection | None = unset()
    plan: PlanSection | None = unset()
    train: TrainSection | None = unset()
    eval: EvalSection | None = unset()
    wandb: WandbSection | None = unset()


# Every section by its key in the config (tests/test_sections.py holds each to the schema).
SECTIONS: dict[str, type[Section]] = {
    "download": DownloadSection,
    "tokenizer": TokenizerSection,
    "pretokenize": PretokenizeSection,
    "shard": ShardSection,
    "model": ModelSection,
    "smoke": SmokeSection,
    "plan": PlanSection,
    "train": TrainSection,
    "eval": EvalSection,
    "wandb": WandbSection,
}
