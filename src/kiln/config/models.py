"""Named model flavours, each with the URL of the config it copies, and the one ModelConfig that every
family (kiln.model.registry: gpt2, llama, starcoder2, each a folder kiln/model/<family>/) builds from.

The config's `model` section names a flavour and may override any of its fields, or gives the fields
itself (then `family` says which architecture, default gpt2). The vocabulary never comes from here:
it is the tokenizer's, padded (the shard manifest's padded_vocab_size). The training context comes
from the shards' seq_len. Torch-free, so validating a config stays cheap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from kiln.errors import KilnError
from kiln.model import registry

# The training loss (kiln.model.loss) runs the head and cross-entropy this many logits at a time: a
# chunk's fp32 logits are 1 GiB (8,192 rows at V 32,768; 5,336 at GPT-2's 50,304). Each chunk costs
# host time (a checkpointed, compiled call forward and again in backward) and a pass over the head's
# weight (its bf16 cast, its fp32 gradient), so fewer chunks are faster, and larger ones cost memory.
# Measured on an H200 (docs/benchmarks.md, "Loss chunks on the H200"): GPT-2 124M at batch 16 x 1024
# ran 149k tok/s with 2**25-element chunks, 352k with 2**28, 418k unchunked; llama3.2-1b at 6 x 8192
# 60.2k, 62.8k and (2**30) 63.2k tok/s, its peak 73.9, 74.3 and 75.8 GiB; the flagship's loss peaked
# at 0.20x the plain loss's with 2**28.
LOSS_CHUNK_ELEMENTS = 2**28


def loss_chunk_rows(vocab_size: int) -> int:
    """Rows (positions) per chunk of the chunked loss for a vocabulary of vocab_size."""
    return max(1, LOSS_CHUNK_ELEMENTS // vocab_size)


# A CPU's compiled step computes plain causal attention itself, written out in blocks of QUERY_BLOCK
# queries for inductor to fuse (kiln.model.sdpa.blockwise_causal): 1.15x the default's step against
# SDPA's CPU flash kernel (docs/benchmarks.md, "Attention in a CPU's compiled step"). Rows of 512 make
# two blocks, 3/4 of the square; one block of 512 gained 2%, blocks of 128 as much as 256. Longer rows
# keep SDPA's kernel, whose memory is linear in the row: the blocks keep their probabilities for
# backward, 6 bytes an entry: 4.5 x B x H x T^2 bytes a layer at rows of 512 (kiln.plan.memory.blockwise_bytes).
QUERY_BLOCK = 256
BLOCKWISE_MAX_LEN = 1024


# The attention paths kiln.model.sdpa.kernel_name reports that are not one of SDPA's backends (those it
# names as torch's SDPBackend does, FLASH_ATTENTION and so on), with what report.md calls them.
BLOCKWISE_CAUSAL, FLEX_ATTENTION = "blockwise_causal", "flex_attention"
OWN_ATTENTION = {
    BLOCKWISE_CAUSAL: "blockwise_causal, causal attention written out for inductor",
    FLEX_ATTENTION: "flex_attention, within each document",
}


def attention_description(kernel: str) -> str:
    """What report.md calls the attention kernel the smoke stage measured: Kiln's own paths by name,
    any other as SDPA's backend."""
    return OWN_ATTENTION.get(kernel, f"SDPA's {kernel} kernel")


def blockwise_attention(cfg: ModelConfig, *, cuda: bool, compiled: bool) -> bool:
    """Whether a training row of `cfg` takes kiln.model.sdpa.blockwise_causal: a CPU's step compiled by
    inductor, plain causal attention (no document mask, no dropout) over rows of at most BLOCKWISE_MAX_LEN."""
    return compiled and not cuda and not cfg.document_mask and cfg.dropout == 0 and cfg.seq_len <= BLOCKWISE_MAX_LEN


def query_blocks(seq_len: int) -> list[tuple[int, int]]:
    """blockwise_causal's blocks: (start, end) of each block's queries, which attend to keys 0..end-1."""
    return [(start, min(start + QUERY_BLOCK, seq_len)) for start in range(0, seq_len, QUERY_BLOCK)]


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Hugging Face's rope_type "llama3"), read from a checkpoint
    that was trained with it (kiln.config.hf_source): wavelengths longer than original_max_position_embeddings
    / low_freq_factor are stretched by `factor`, those shorter than it / high_freq_factor kept, those
    between interpolated (kiln.model.layers.rope_frequencies). The names are Hugging Face's."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def problems(self) -> list[str]:
        out = []
        if self.factor < 1:
            out.append(f"model.rope_scaling.factor: must be at least 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            out.append(
                "model.rope_scaling: needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings < 1:
            out.append(
                "model.rope_scaling.original_max_position_embeddings: must be at least 1, got "
                f"{self.original_max_position_embeddings}"
            )
        return out


class ModelConfigError(KilnError):
    """A model shape that cannot be built; one problem per line, each naming its model.<key>."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid model:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class ModelConfig:
    """One decoder's shape. Fields left None are derived in __post_init__, the only place that
    derives anything, so a saved config (to_dict) always holds concrete values."""

    # "gpt2": LayerNorm, GELU MLP, learned positions; "llama": RMSNorm, SwiGLU, RoPE, GQA;
    # "starcoder2": LayerNorm, GELU MLP, RoPE, GQA (StarCoder2's block: Llama's attention, GPT-2's MLP)
    family: str
    vocab_size: int  # embedding rows: the tokenizer's vocabulary padded (kiln.data.tokenizer)
    seq_len: int  # training context (the shards' seq_len)
    n_layer: int
    n_head: int
    d_model: int
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: n_head
    d_ff: int | None = None  # MLP width; None: 4*d_model (gpt2, starcoder2) or Llama's 8/3*d_model rounded up
    max_positions: int | None = None  # gpt2's learned position rows (GPT-2: 1024); None: seq_len
    rope_theta: float = 10000.0  # llama and starcoder2
    rope_scaling: RopeScaling | None = None  # llama only: Llama 3.1's frequency scaling; None: plain RoPE
    norm_eps: float = 1e-5
    # gpt2: biases in every Linear and LayerNorm (GPT-2 has them); starcoder2: in every Linear but the
    # head (StarCoder2's use_bias; its LayerNorms always have one); llama: none
    bias: bool = False
    qkv_bias: bool = False  # llama only: biases on the query, key and value projections (Qwen2's)
    # A source's sliding-window span (StarCoder2: 4096). Kiln computes full causal attention, which is
    # the same only while a row fits in the window: seq_len may not exceed it. None: no window.
    sliding_window: int | None = None
    dropout: float = 0.0
    tie_embeddings: bool = True  # output head shares the token embedding's weight
    # Block-causal attention in a packed row: each token attends only within its own document, which
    # ends at eos_id (kiln.model.documents). eos_id is the shards' end-of-text token
    # (kiln.data.shards.Documents), set by model_config only while document_mask is on.
    document_mask: bool = False
    eos_id: int | None = None
    # The GPT-2 speedrun's (modded-nanogpt) and OLMo 2's recipe options, each off by default; a family
    # builds those its spec lists in OPTIONS (llama: all). qk_norm: RMSNorm over each head's query and
    # key before RoPE (OLMo 2, Qwen3). mlp_activation: the gated MLP's activation, silu (SwiGLU) or relu2
    # (squared ReLU, modded-nanogpt's, gated here as transformers' hidden_act relu2 computes it).
    # zero_init_projections: attention's and the MLP's output projections start at zero (modded-nanogpt),
    # so each block starts as the identity.
    qk_norm: bool = False
    mlp_activation: str = "silu"
    zero_init_projections: bool = False

    def __post_init__(self) -> None:
        derived = {"n_kv_head": self.n_head if self.n_kv_head is None else self.n_kv_head}
        if self.family in registry.FAMILIES:  # an unknown one is a problem (_problems), not a shape
            spec = registry.get(self.family).spec
            derived["d_ff"] = self.d_ff or spec.default_d_ff(self)
            derived["max_positions"] = self.max_positions or spec.default_max_positions(self)
        if isinstance(self.rope_scaling, Mapping):  # a config section, or a saved config (to_dict) read back
            derived["rope_scaling"] = RopeScaling(**self.rope_scaling)
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        problems = _problems(self)
        if problems:
            raise ModelConfigError(problems)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict:
        """The fields, less the options (OPTIONS) left at their defaults: model_config.json and the train
        fingerprint of a run without them stay what they were before they existed."""
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in asdict(self).items() if k not in OPTIONS or v != defaults[k]}

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters from the shape alone, tied weights once (torch-free: a run is priced before any
        model is built); equal to the built model's num_params (tests/unit/config/test_registry.py).
        non_embedding leaves out the tables only looked up, never multiplied (positions, and the
        token table unless it is the head): the N of the 6N FLOPs-per-token estimate."""
        V, d = self.vocab_size, self.d_model
        parts = registry.get(self.family).spec.params(self)
        head = 0 if self.tie_embeddings else V * d
        total = self.n_layer * parts.block + parts.final_norm + V * d + parts.positions + head
        if not non_embedding:
            return total
        return total - parts.positions - head

    def flops_per_token(self) -> float:
        """Training FLOPs per token, Kiln's MFU convention: 6N for the matmuls forward and backward,
        plus 12 L H Q T for attention's scores and weighted sum over the whole T x T square (the
        causal mask's zero half included)."""
        return 6 * self.num_params(non_embedding=True) + 12 * self.n_layer * self.n_head * self.head_dim * self.seq_len

    def flops_per_token_torchtitan(self) -> float:
        """torchtitan's transformers-backend convention (get_dense_model_nparams_and_flops with
        head_dims = Q, what seed 000's log printed): 6 x the parameters without any embedding table
        (a tied one too, though it is also the head) + 6 L H Q T, the attention term halved for the
        causal mask. torchtitan's native llama3 passes head_dims = 2Q: 12 L H Q T, as Kiln counts."""
        n = self.num_params(non_embedding=True) - (self.vocab_size * self.d_model if self.tie_embeddings else 0)
        return 6 * n + 6 * self.n_layer * self.n_head * self.head_dim * self.seq_len


# Fields added after saved configs existed, left out of to_dict at their defaults: the document mask
# (eos_id is set only with it) and the recipe options, which a family builds only if its spec's OPTIONS
# lists them.
RECIPE_OPTIONS = ("qk_norm", "mlp_activation", "zero_init_projections")
OPTIONS = ("document_mask", "eos_id", *RECIPE_OPTIONS)
MLP_ACTIVATIONS = ("silu", "relu2")


def _option_problems(cfg: ModelConfig) -> list[str]:
    """The recipe options' rules: each set one is built by the family (its spec's OPTIONS), and in range."""
    defaults = {f.name: f.default for f in fields(cfg)}
    built = getattr(registry.get(cfg.family).spec, "OPTIONS", ())
    out = [
        f"model.{name}: the {cfg.family} family does not build it (leave it at {defaults[name]!r})"
        for name in RECIPE_OPTIONS
        if getattr(cfg, name) != defaults[name] and name not in built
    ]
    if cfg.mlp_activation not in MLP_ACTIVATIONS:
        out.append(f"model.mlp_activation: {cfg.mlp_activation!r} is not one of {', '.join(MLP_ACTIVATIONS)}")
    return out


def _problems(cfg: ModelConfig) -> list[str]:
    """Every rule a shape must satisfy, each naming the config key (model.<field>) it concerns: those of
    every family here, then the family's own (its spec's problems)."""
    out = []
    if cfg.family not in registry.FAMILIES:
        return [f"model.family: {cfg.family!r} is not one of {', '.join(registry.names())}"]
    for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "n_kv_head", "d_ff"):
        if getattr(cfg, name) < 1:
            out.append(f"model.{name}: must be at least 1, got {getattr(cfg, name)}")
    if out:
        return out
    if cfg.sliding_window is not None and cfg.seq_len > cfg.sliding_window:
        out.append(
            f"model.sliding_window: the source attends over the last {cfg.sliding_window} positions and Kiln "
            f"computes full causal attention, the same only up to that length: shard.seq_len={cfg.seq_len} "
            "is longer"
        )
    if cfg.eos_id is not None and not 0 <= cfg.eos_id < cfg.vocab_size:
        out.append(f"model.document_mask: the end-of-text id {cfg.eos_id} is outside the vocabulary ({cfg.vocab_size})")
    if cfg.d_model % cfg.n_head:
        out.append(f"model.d_model: {cfg.d_model} is not divisible by model.n_head={cfg.n_head}")
    if cfg.n_head % cfg.n_kv_head:
        out.append(f"model.n_kv_head: model.n_head={cfg.n_head} is not a multiple of {cfg.n_kv_head}")
    return out + _option_problems(cfg) + registry.get(cfg.family).spec.problems(cfg)


@dataclass(frozen=True)
class Flavour:
    family: str
    source: str  # the config these numbers are read from
    dims: dict[str, Any]


GPT2_SOURCE = "https://huggingface.co/openai-community/{}/blob/main/config.json"
GPT2 = dict(max_positions=1024, bias=True)  # every GPT-2 size: 1024 learned positions, biases

FLAVOURS: dict[str, Flavour] = {
    # torchtitan's llama3 debugmodel: a few million parameters besides the embedding.
    "debug": Flavour(
        "llama",
        "https://github.com/pytorch/torchtitan/blob/main/torchtitan/models/llama3/__init__.py",
        dict(n_layer=6, n_head=16, d_model=256, rope_theta=500000.0),
    ),
    "gpt2-124m": Flavour("gpt2", GPT2_SOURCE.format("gpt2"), dict(n_layer=12, n_head=12, d_model=768, **GPT2)),
    "gpt2-350m": Flavour("gpt2", GPT2_SOURCE.format("gpt2-medium"), dict(n_layer=24, n_head=16, d_model=1024, **GPT2)),
    "gpt2-774m": Flavour("gpt2", GPT2_SOURCE.format("gpt2-large"), dict(n_layer=36, n_head=20, d_model=1280, **GPT2)),
    "gpt2-1.5b": Flavour("gpt2", GPT2_SOURCE.format("gpt2-xl"), dict(n_layer=48, n_head=25, d_model=1600, **GPT2)),
    # Plain RoPE: the checkpoint's rope_scaling (llama3, factor 32) stretches a model already trained
    # at 8k to 128k; a model pretrained from scratch at <= 8k tokens has nothing to stretch.
    "llama3.2-1b": Flavour(
        "llama",
        "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
        dict(
            n_layer=16,
            n_head=32,
            n_kv_head=8,
            d_model=2048,
            d_ff=8192,
            rope_theta=500000.0,
            norm_eps=1e-5,
            tie_embeddings=True,
        ),
    ),
}


def _section_fields(section: dict) -> dict[str, Any]:
    """The model section resolved to ModelConfig fields (except vocab_size and seq_len): the
    flavour's, then the section's own keys over them."""
    section = dict(section)
    name = section.pop("flavour", None)
    if name is None:
        return {"family": "gpt2", **section}
    if name not in FLAVOURS:
        raise ModelConfigError([f"model.flavour: {name!r} is not a known flavour (known: {', '.join(FLAVOURS)})"])
    flavour = FLAVOURS[name]
    if section.get("family", flavour.family) != flavour.family:
        raise ModelConfigError([f"model.family: flavour {name!r} is {flavour.family}, not {section['family']}"])
    return {"family": flavour.family, **flavour.dims, **section}


def model_config(section: dict, vocab_size: int, seq_len: int, eos_id: int | None = None) -> ModelConfig:
    """The ModelConfig a config's model section means for a given (padded) vocab and seq_len. With
    model.document_mask, eos_id is the token that ends each document (the shards' own:
    kiln.data.shards.row_model); without one (a run priced before its data exists) the shape and its
    counts are the same, and only building the model is an error (kiln.model.documents)."""
    fields = _section_fields(section)
    if fields.get("document_mask"):
        fields["eos_id"] = eos_id
    return ModelConfig(vocab_size=vocab_size, seq_len=seq_len, **fields)


def check_section(section: dict, seq_len: int) -> list[str]:
    """Problems with a model section, for config validation (the vocab is not known yet: any
    valid size stands in for it)."""
    try:
        model_config(section, vocab_size=64, seq_len=seq_len)
    except ModelConfigError as exc:
        return exc.problems
    return []
