"""The model, plan and wandb sections, each setting declared once (kiln.config.declare), and RunConfig,
which holds every section of a run: the one model a config is validated against (kiln.config.schema)
and the typed object a stage reads."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ValidationInfo, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kiln.config.data_sections import DownloadSection, PretokenizeSection, ShardSection, TokenizerSection
from kiln.config.declare import MODEL, MODEL_VALUES, OUTPUT, RUN, TRAIN_RUN, Number, Section, optional, reads, setting
from kiln.config.eval_sections import EvalSection
from kiln.config.smoke_section import SmokeSection
from kiln.config.train_sections import TrainSection
from kiln.model import registry


class RopeScalingSection(Section):
    """Llama 3.1's RoPE frequency scaling (Hugging Face's rope_type llama3): kiln.config.models.RopeScaling's
    fields, as a checkpoint trained with it states them."""

    KEY: ClassVar[str] = "model.rope_scaling"
    factor: Number = setting(
        description="Wavelengths longer than the original context / low_freq_factor are stretched by this.", ge=1
    )
    low_freq_factor: Number = setting(description="Hugging Face's low_freq_factor.", gt=0)
    high_freq_factor: Number = setting(description="Hugging Face's high_freq_factor.", gt=0)
    original_max_position_embeddings: int = setting(description="The context the model was first trained at.", ge=1)


class ModelSection(Section):
    """A named flavour (kiln.config.models.FLAVOURS: debug, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
    llama3.2-1b, ...) whose fields the other keys here override, or the shape itself (n_layer, n_head,
    d_model required; family gpt2 unless given). The vocabulary is always the tokenizer's padded to a
    multiple of 64, the context always shard.seq_len. No defaults here: what a key leaves out comes from
    the flavour, or from kiln.config.models.ModelConfig (model_config(section.as_dict(), ...)). With
    train.init_from.hf the section may be left out: it becomes the checkpoint's shape, read from its
    config.json (kiln.config.hf_source), and a key given here must agree with it."""

    KEY: ClassVar[str] = "model"
    flavour: str | None = optional("A name in kiln.config.models.FLAVOURS.", MODEL)
    # The families registered at import, for the schema and docs/settings.md; validation asks the registry
    # (_registered_family), so one registered later (a test's, a plugin's) is accepted too.
    family: Literal[registry.names()] | None = optional(
        "; ".join(f"{f.name}: {f.about}" for f in registry.FAMILIES.values()) + ".", MODEL
    )
    n_layer: int | None = optional("Transformer blocks.", MODEL, ge=1)
    n_head: int | None = optional("Attention (query) heads.", MODEL, ge=1)
    d_model: int | None = optional("The residual stream's width.", MODEL, ge=1)
    n_kv_head: int | None = optional("Key/value heads (llama, starcoder2; default n_head).", MODEL, ge=1)
    d_ff: int | None = optional("MLP width (default 4*d_model; llama 8/3*d_model rounded up to 256).", MODEL, ge=1)
    max_positions: int | None = optional("gpt2 learned position rows (default shard.seq_len).", MODEL, ge=1)
    rope_theta: Number | None = optional("llama and starcoder2 RoPE base (default 10000).", MODEL_VALUES, gt=0)
    norm_eps: Number | None = optional("The norms' epsilon (default 1e-5).", MODEL_VALUES, gt=0)
    dropout: Number | None = optional("Dropout on attention and residual outputs (default 0).", MODEL, ge=0, le=1)
    bias: bool | None = optional(
        """gpt2: biases in Linear and LayerNorm; starcoder2: in every Linear but the head (its LayerNorms
        always have one); llama: none (default false).""",
        MODEL,
    )
    tie_embeddings: bool | None = optional("Output head shares the token embedding (default true).", MODEL)
    qkv_bias: bool | None = optional(
        "llama only: biases on the query, key and value projections (Qwen2's; default false).", MODEL
    )
    rope_scaling: RopeScalingSection | None = optional(
        """llama only: Llama 3.1's RoPE frequency scaling (Hugging Face's rope_type llama3), as a
        train.init_from.hf checkpoint trained with it has it; unset or null: plain RoPE.""",
        MODEL_VALUES,
        nullable=True,
    )
    sliding_window: int | None = optional(
        """A source's sliding-window attention span (StarCoder2's checkpoints: 4096), as a train.init_from.hf
        checkpoint states it. Kiln computes full causal attention, the same only while shard.seq_len is at
        most this: a longer context is an error. Unset or null: no window.""",
        reads(
            "Kiln's attention is causal over the whole row, the same within the span: only the export carries it",
            smoke=RUN,
            train=OUTPUT,
            report=OUTPUT,
            rehearse=RUN,
        ),
        nullable=True,
        ge=1,
    )
    # A model setting, not a train one: it changes the function the network computes on a row, so the
    # smoke probe, train, validation and eval's scoring of packed rows must all compute it alike, and a
    # saved model carries it (model_config.json) to whatever loads it. torchtitan keeps it in its model
    # args (attn_mask_type) for the same reason.
    document_mask: bool | None = optional(
        """Document-aware attention in packed rows: each token attends only to the earlier tokens of its own
        document (block-causal; the end-of-text token belongs to the document it ends), never across
        <|endoftext|> into the previous one. gpt2's learned positions restart at each document; RoPE's are
        left as they are (relative, so the same scores). The end-of-text id is the shards' (manifest.json's
        documents). A dense (B, 1, T, T) mask on the CPU, flex attention's block mask on a GPU
        (kiln.model.documents). Default false: plain causal attention over the whole row.""",
        MODEL,
    )

    # The GPT-2 speedrun's (modded-nanogpt) and OLMo 2's recipe options (kiln.config.models.RECIPE_OPTIONS),
    # off while unset; llama builds each, the other families refuse them.
    qk_norm: bool | None = optional(
        """llama only: an RMSNorm over each head's query and key before RoPE, one gain per head dim (OLMo 2's,
        Qwen3's); exports as Qwen3ForCausalLM. Default false.""",
        MODEL,
    )
    mlp_activation: Literal["silu", "relu2"] | None = optional(
        """llama only: the gated MLP's activation, down(act(gate(x)) * up(x)): silu (SwiGLU, the default) or
        relu2 (squared ReLU, modded-nanogpt's; transformers' hidden_act relu2).""",
        MODEL_VALUES,
    )
    zero_init_projections: bool | None = optional(
        """llama only: attention's and the MLP's output projections (attn.o, mlp.down) start at zero, so each
        block starts as the identity (modded-nanogpt); default false: GPT-2's 0.02/sqrt(2 n_layer).""",
        MODEL_VALUES,
    )

    @field_validator("family", mode="wrap")
    @classmethod
    def _registered_family(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, str):
            if value not in registry.FAMILIES:
                raise PydanticCustomError(
                    "kiln", "not a model family (registered: {names})", {"names": ", ".join(registry.names())}
                )
            return value
        return handler(value)  # not a string: the Literal's own error

    @model_validator(mode="before")
    @classmethod
    def _flavour_or_shape(cls, data):
        if isinstance(data, dict) and "flavour" not in data:
            missing = [k for k in ("n_layer", "n_head", "d_model") if k not in data]
            if missing:
                raise PydanticCustomError(
                    "kiln", "no flavour, so the shape itself: {missing} missing", {"missing": ", ".join(missing)}
                )
        return data


class PlanSection(Section):
    """What `kiln plan` assumes to price a run before anything runs: throughput = mfu x the GPU's dense
    bf16 peak x the ranks. The smoke stage replaces it with a measurement on the real hardware."""

    KEY: ClassVar[str] = "plan"
    gpu: str = setting(
        "H100",
        """A GPU named in kiln.plan.peaks.GPUS (H100, H200, H200 NVL, A100, RTX 4090, RTX 3080 Ti, ...); its
        peak prices the run, its memory is what the step must fit in.""",
        reads("`kiln plan`'s assumed device, before any stage runs; the card `kiln rehearse` fits", rehearse=OUTPUT),
    )
    mfu: Number = setting(
        0.4,
        "Expected model FLOPs utilisation under Kiln's count (kiln.train.metrics).",
        reads("`kiln plan`'s assumed MFU, before any stage runs"),
        gt=0,
        le=1,
    )


class WandbSection(Section):
    """Where train's metrics are also sent (Weights & Biases)."""

    KEY: ClassVar[str] = "wandb"
    mode: Literal["online", "offline", "disabled"] = setting(
        "offline",
        """offline writes under results/<run>/train/wandb (upload later with `wandb sync`); online needs a
        network.""",
        reads("where the metrics are also sent", train=RUN),
    )
    project: str = setting("kiln", "The wandb project.", TRAIN_RUN)


# Read by every stage that lands under results/<run_name>/.
RUN_NAME = reads(
    "names results/<run_name>/: another name is another run",
    eval_data=OUTPUT,
    smoke=OUTPUT,
    plan=OUTPUT,
    train=OUTPUT,
    eval=OUTPUT,
    report=OUTPUT,
    rehearse=OUTPUT,
)
DATA_SEED = reads(
    "the data seed (split, FIM, tokenizer sample, eval's infilling problems and task examples); also "
    "train.seed's default",
    tokenizer=OUTPUT,
    pretokenize=OUTPUT,
    eval_data=OUTPUT,
    report=OUTPUT,
)
# A whole config needs these; a stage's config (kiln.stage.stage_config) holds only the sections it reads.
REQUIRED = ("run_name", "download", "model", "train")


class RunConfig(Section):
    """A run's config, every section typed. Validated whole (kiln.config.schema, with context
    {"whole": True}: the required keys checked and every absent section given its defaults) or built
    from what one stage reads (kiln.stage.stage_config), where a section the stage does not read is
    None; as_dict gives back exactly the dict it was built from."""

    KEY: ClassVar[str] = ""
    run_name: str | None = optional(
        """This run's smoke, train, eval and report land in results/<run_name>/; its data stages in
        results/data/<stage>-<key>/, shared with every run of the same data settings (kiln.layout). `data`
        is reserved for that folder. A sweep's arms are <run_name>-<arm>.""",
        RUN_NAME,
        pattern="^[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    seed: int | None = optional(
        """The data seed: the tokenizer's sample, the train/val split, FIM. Also the model seed (train.seed)
        unless that is set, so one number seeds a whole run (default 1337).""",
        DATA_SEED,
        ge=0,
    )
    download: DownloadSection | None = optional("Where the documents come from and how they are cleaned.")
    tokenizer: TokenizerSection | None = optional(TokenizerSection.__doc__)
    pretokenize: PretokenizeSection | None = optional("The documents as tokens: the split, mixture and FIM.")
    shard: ShardSection | None = optional("The tokens cut into training rows.")
    model: ModelSection | None = optional(ModelSection.__doc__)
    smoke: SmokeSection | None = optional(SmokeSection.__doc__)
    plan: PlanSection | None = optional(PlanSection.__doc__)
    train: TrainSection | None = optional("The full run: its ranks, batch, optimizer, schedule and checkpoints.")
    eval: EvalSection | None = optional("What the eval stage measures on the final model.")
    wandb: WandbSection | None = optional(WandbSection.__doc__)

    @model_validator(mode="before")
    @classmethod
    def _whole(cls, data: Any, info: ValidationInfo):
        """A whole config: the seed's default, and every section it leaves out filled in with its defaults
        (kiln.config.schema.check names a missing required key before this runs)."""
        if not (info.context or {}).get("whole") or not isinstance(data, dict):
            return data
        return {"seed": DEFAULT_SEED} | {name: {} for name in SECTIONS} | data


DEFAULT_SEED = 1337
# Every section by its key in the config, in the order a config reads.
SECTIONS: dict[str, type[Section]] = {
    name: section
    for name, section in (
        ("download", DownloadSection),
        ("tokenizer", TokenizerSection),
        ("pretokenize", PretokenizeSection),
        ("shard", ShardSection),
        ("model", ModelSection),
        ("smoke", SmokeSection),
        ("plan", PlanSection),
        ("train", TrainSection),
        ("eval", EvalSection),
        ("wandb", WandbSection),
    )
}
