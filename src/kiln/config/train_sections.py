"""The train section, each setting declared once (kiln.config.declare)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from kiln.config.declare import (
    BUDGETED,
    EAGER,
    FSDP,
    MUON,
    MUON_STEP,
    OUTPUT,
    PER_RANK_BATCH,
    PLACEMENT,
    RANKS,
    RUN,
    SCHEDULE,
    STEP,
    TRAIN_RUN,
    Number,
    Prompts,
    Section,
    group,
    optional,
    reads,
    setting,
)


class Budget(Section):
    """What the train stage may spend: exactly one unit."""

    KEY: ClassVar[str] = "train.budget"
    minutes: Number | None = optional("Its wall time in minutes.", gt=0)
    hours: Number | None = optional("Its wall time in hours.", gt=0)
    dollars: Number | None = optional("Device-hours at smoke.price_per_gpu_hour.", gt=0)

    @model_validator(mode="before")
    @classmethod
    def _one_unit(cls, data):
        if isinstance(data, dict) and len(data) != 1:
            raise PydanticCustomError("kiln", "set exactly one of minutes, hours and dollars")
        return data


class InitFrom(Section):
    """Another model's weights to start from: exactly one source (kiln.config.rules checks it)."""

    KEY: ClassVar[str] = "train.init_from"
    run: str | None = optional("The final weights of results/<run>/train.", min_length=1)
    checkpoint: str | None = optional(
        "A checkpoint folder, results/<run>/train/checkpoints/step-NNNNNNN.", min_length=1
    )
    hf: str | None = optional("A Hugging Face model folder.", min_length=1)
    optimizer: bool = setting(False, "Also take the AdamW state (a run's newest checkpoint, or the checkpoint given).")
    warmup_from: Annotated[Number, Field(ge=0)] | Literal["source"] | None = optional(
        """The LR warmup starts from instead of 0: the source's last LR, so a continuation neither stalls
        at near-zero LR nor jumps; warmup_steps ramp from it to lr. A number (a stock checkpoint's final
        LR, from its paper or card), or `source` with init_from {run: NAME} or {checkpoint: FOLDER}: the
        LR the source's last step trained at (a run's train/metrics.jsonl; the checkpoint's state, which
        a checkpoint of an older Kiln lacks: give the number then), read when training starts; an hf
        source records none. The smoke stage, which times a random init, ramps from 0."""
    )

    @model_validator(mode="before")
    @classmethod
    def _not_empty(cls, data):
        if isinstance(data, dict) and not data:
            raise PydanticCustomError("kiln", "name a source: one of run, checkpoint and hf")
        return data


class Samples(Section):
    """Completions logged at every validation (console, train/samples.jsonl, wandb), each row labelled
    with how it was decoded. Sampled from a generator seeded with the run's seed at every validation
    (the same run gives the same samples; training's random stream is not touched); temperature 0
    decodes greedily."""

    KEY: ClassVar[str] = "train.samples"
    prompts: Prompts = setting(
        ("import os\n", "def main():\n"),
        "Prompts to complete; [] turns sampling off.",
        reads("eval completes them with the final model", train=RUN, eval=OUTPUT),
    )
    max_new_tokens: int = setting(32, "Tokens per completion.", reads(train=RUN, eval=OUTPUT), ge=1)
    temperature: Number = setting(
        0.8,
        "Sampling temperature; 0 is greedy (a small model's greedy text tends to repeat one line).",
        reads(train=RUN, eval=OUTPUT),
        ge=0,
    )
    top_p: Number = setting(
        0.95,
        "Nucleus sampling, the fewest most likely tokens holding this share of the probability; 1 keeps all.",
        reads(train=RUN, eval=OUTPUT),
        gt=0,
        le=1,
    )


class NonFinite(Section):
    """A step whose loss or gradient norm is not finite (NaN, inf) on any rank is never applied and never
    saved: every rank skips its optimizer update on the device. stop ends the run at the next log or
    checkpoint step with exit code 76 (kiln.errors.ExitCode), naming the last good checkpoint; skip drops
    the batch and goes on, up to max_skips skipped batches in the run."""

    KEY: ClassVar[str] = "train.nonfinite"
    action: Literal["stop", "skip"] = setting(
        "stop",
        "stop ends the run at the next log or checkpoint step; skip drops the batch and goes on.",
        reads("a step that is not finite is never applied", train=RUN),
    )
    max_skips: int = setting(
        10, "skip only, the skipped batches a run may have; one more stops it as stop does.", TRAIN_RUN, ge=0
    )


class TrainSection(Section):
    """The `train` section."""

    KEY: ClassVar[str] = "train"
    nproc_per_node: int = setting(1, "Ranks (devices) per node.", RANKS, ge=1)
    nnodes: int = setting(1, "Nodes; above 1 needs rdzv_endpoint.", RANKS, ge=1)
    node_rank: int = setting(0, "This node's rank among nnodes.", PLACEMENT, ge=0)
    rdzv_endpoint: str = setting(
        "",
        "host:port of node 0 for a multi-node run (torchrun static rendezvous); empty runs --standalone.",
        PLACEMENT,
        pattern="^$|^[^:\\s]+:[0-9]+$",
    )
    device: Literal["auto", "cuda", "cpu"] = setting(
        "auto",
        (
            "Where train, smoke and eval run: auto takes the GPUs when CUDA sees any, else the CPU (but "
            "several ranks of a CUDA build of torch that sees no GPU stop with the reason: a broken driver, "
            "not a CPU run). On a cluster, GPU stages request nproc_per_node GPUs per node unless this is cpu."
        ),
        reads(smoke=RUN, train=RUN, eval=RUN),
    )
    parallel: Literal["ddp", "fsdp"] = setting(
        "ddp",
        "ddp replicates the model on every rank; fsdp (FSDP2) shards it, for models that do not fit.",
        reads("DDP or FSDP, the same step", smoke=RUN, train=RUN, rehearse=OUTPUT),
    )
    fsdp_one_rank: bool = setting(
        False,
        (
            "With train.parallel fsdp on a single rank (one GPU): fully_shard the model over a mesh of that "
            "one rank anyway, in a process group of one (NCCL on a GPU, gloo on the CPU), so one device runs "
            "what FSDP2 runs on several: its mixed precision, its hooks around compiled blocks, DCP's "
            "sharded checkpoints written and read collectively. Nothing is split, so it saves no memory and "
            "costs a little time; it is for checking the FSDP path on one GPU (bench/gpu_check). Off, one "
            "rank trains the plain module. No effect on several ranks."
        ),
        reads("the FSDP step on one rank is the plain one's", smoke=RUN, train=RUN, rehearse=FSDP),
    )
    collective_timeout_s: Number = setting(
        600,
        (
            "How long a collective (all-reduce, gather, barrier) waits for every rank, once the first "
            "optimizer step is done, before it fails and the job ends: a stuck or dead rank stops the run "
            "within this time. torch's defaults are 30 min (gloo) and 10 min (NCCL); 600 s is NCCL's, and "
            "must exceed the longest legitimate wait for the slowest rank in a running job: rank 0 saving a "
            "checkpoint, a validation. Until the first step is done, first_step_timeout_s applies."
        ),
        PLACEMENT,
        gt=0,
    )
    first_step_timeout_s: Number = setting(
        1800,
        (
            "The same bound from the process group's start until the first optimizer step is done (as "
            "torchtitan's init and train timeouts): that span holds the waits no later step has, the slowest "
            "rank's torch.compile (minutes for a 1B model), the first shard checks and a resume's checkpoint "
            "hash. A rank that never reaches its first step ends the job within it."
        ),
        PLACEMENT,
        gt=0,
    )
    micro_batch: Annotated[int, Field(ge=1)] | Literal["auto"] = setting(
        16,
        (
            "Rows per forward pass per rank. auto: the smoke stage picks it on the GPU it runs on, with "
            "train.activation_checkpointing when that is auto too: the micro-batch dividing a rank's rows per"
            " step (train.batch_tokens kept) whose step is predicted fastest among those that fit "
            "(kiln.plan.autofit); the plan records the pick and train runs it."
        ),
        reads(
            "at an equal global batch (train.batch_tokens), the same rows per step",
            smoke=PER_RANK_BATCH,
            train=PER_RANK_BATCH,
            report=PER_RANK_BATCH,
            rehearse=OUTPUT,
        ),
    )
    seed: int | None = setting(
        None,
        (
            "The model seed: initial weights, the order of the training rows, the smoke probe and the "
            "samples. null: the top-level seed. A seed study sets this and leaves `seed` alone, so its runs "
            "share the tokenizer, the tokens and the shards."
        ),
        reads(
            "the model seed: initial weights, data order, samples (null: seed)",
            smoke=OUTPUT,
            train=OUTPUT,
            eval=OUTPUT,
            report=OUTPUT,
        ),
        ge=0,
    )
    batch_tokens: int | None = setting(
        None,
        (
            "Global batch in tokens per optimizer step; gradient accumulation is batch_tokens / (ranks x "
            "micro_batch x shard.seq_len), which must be whole. null: one micro-batch per rank."
        ),
        reads(smoke=OUTPUT, train=OUTPUT, report=OUTPUT, rehearse=OUTPUT),
        ge=1,
    )
    max_steps: int | None = setting(
        None,
        (
            "Optimizer steps of the full run. With a budget it is a cap on the steps the budget buys; one of "
            "the two must be set."
        ),
        reads(plan=OUTPUT, train=OUTPUT, report=OUTPUT),
        ge=1,
    )
    budget: Budget | None = setting(
        None,
        (
            "What the train stage may spend, one of minutes, hours (its wall time, validation, checkpoints "
            "and the export included) or dollars (device-hours at smoke.price_per_gpu_hour). The smoke stage "
            "turns it into steps from the speeds it measured and records them in smoke/plan.json; train then "
            "re-plans them at every log step from its own measured speed, to end at ~99% of the budget "
            "(kiln.train.budget), the LR schedule following without a jump. Its decisions are recorded in "
            "train/budget.jsonl and in checkpoints, and a resumed run replays them."
        ),
        reads(plan=OUTPUT, train=OUTPUT, report=OUTPUT),
    )
    init_from: InitFrom | None = setting(
        None,
        (
            "Start from another model's weights instead of a random init (continued training, mid-training on"
            " other data, a longer run than a finished one): exactly one of `run` (the final weights of "
            "results/<run>/train, a run of this working directory), `checkpoint` (a checkpoint folder, "
            "results/<run>/train/checkpoints/step-NNNNNNN) or `hf` (a Hugging Face folder: an export, e.g. "
            "results/<run>/train/hf, or a stock GPT-2, Llama or Qwen2 checkpoint, whose shape becomes the "
            "model section). `optimizer: true` also takes the AdamW state (a run's newest checkpoint, or the "
            "checkpoint given; full format). The schedule, steps and data are this run's own; the model shape"
            " and the tokenizer must be the source's (an error names what differs). The run validates once "
            "before its first step, so its curve starts where the source's ended; the report names the "
            "source."
        ),
        # not the smoke stage's: its probe starts from a random init, as the init-loss check needs
        reads("also whether eval tests infilling", train=OUTPUT, eval_data=OUTPUT),
    )
    lr: Number = setting(
        0.0006,
        (
            "Peak learning rate (AdamW's; under muon, the rate of the parameters AdamW keeps). The default is"
            " GPT-3's for its 125M model (Brown et al. 2020, Table 2.1), which nanoGPT and llm.c train GPT-2 "
            "124M at; larger models want less (GPT-3: 3e-4 at 350M, 2.5e-4 at 760M, 2e-4 at 1.3B). A run sets"
            " its own: config/config.yaml's 0.008 is tuned for a small model on a CPU budget "
            '(docs/benchmarks.md, "The default\'s recipe").'
        ),
        STEP,
        gt=0,
    )
    min_lr: Number = setting(6e-05, "The floor the schedule decays to (10% of the default lr).", SCHEDULE, ge=0)
    warmup_steps: int = setting(
        50,
        "Steps of linear warmup from 0 (or init_from.warmup_from) to lr.",
        reads("the probe warms up for at most a third of its steps", smoke=OUTPUT, train=OUTPUT),
        ge=0,
    )
    schedule: Literal["cosine", "wsd", "constant"] = setting(
        "cosine", "After warmup, cosine to min_lr; warmup-stable-decay; or constant lr.", SCHEDULE
    )
    decay_fraction: Number = setting(
        0.2, "wsd only, the share of max_steps spent cooling down to min_lr.", SCHEDULE, gt=0, le=1
    )
    cooldown: Literal["linear", "1-sqrt"] = setting("linear", "wsd only, the cooldown's shape.", SCHEDULE)
    weight_decay: Number = setting(0.1, "On matrices only (kiln.train.optim).", STEP, ge=0)
    beta1: Number = setting(0.9, "AdamW's first-moment decay.", STEP, ge=0, lt=1)
    beta2: Number = setting(0.95, "AdamW's second-moment decay.", STEP, ge=0, lt=1)
    eps: Number = setting(1e-08, "AdamW's epsilon.", STEP, gt=0)
    optimizer: Literal["adamw", "muon"] = setting(
        "adamw",
        (
            "adamw: AdamW for every parameter (lr, beta1, beta2, eps, weight_decay). muon: Muon "
            "(torch.optim.Muon: orthogonalised Nesterov momentum, 5 Newton-Schulz steps) for the 2-D weights "
            "inside the blocks, attention's and the MLP's, at muon_lr; AdamW as above for the rest "
            "(embeddings and head, positions, norm gains, biases) at lr. The schedule scales both from their "
            "own base LR (kiln.train.optim). Muon keeps one momentum per weight where AdamW keeps two, so its"
            " matrices' optimizer state is half AdamW's."
        ),
        reads(smoke=OUTPUT, train=OUTPUT, report=OUTPUT, rehearse=OUTPUT),
    )
    muon_lr: Number = setting(
        0.02,
        (
            "optimizer muon only: the hidden matrices' peak LR, scaled by sqrt(max(1, rows/columns)) per "
            "matrix under muon_adjust_lr original. 0.02 is modded-nanogpt's Muon LR (records 2024-11-03 to "
            "2024-11-09, Muon(matrix_params, lr=0.02, momentum=0.95))."
        ),
        MUON_STEP,
        gt=0,
    )
    muon_momentum: Number = setting(
        0.95,
        "optimizer muon only, Muon's (Nesterov) momentum; 0.95 is modded-nanogpt's and torch's default.",
        MUON_STEP,
        ge=0,
        lt=1,
    )
    muon_weight_decay: Number = setting(
        0.0,
        (
            "optimizer muon only, decoupled weight decay on the hidden matrices (each step scales them by 1 -"
            " LR x this). modded-nanogpt's Muon records use none; torch's default is 0.1."
        ),
        MUON_STEP,
        ge=0,
    )
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = setting(
        "original",
        (
            "optimizer muon only, how Muon's LR adapts to a matrix's shape (torch.optim.Muon's adjust_lr_fn)."
            " original: x sqrt(max(1, rows/columns)), Keller Jordan's, for muon_lr near 0.02. "
            "match_rms_adamw: x 0.2 sqrt(max(rows, columns)), Moonshot's (arXiv:2502.16982), which matches "
            "AdamW's update size, so muon_lr near AdamW's lr."
        ),
        MUON_STEP,
    )
    normuon: bool | None = optional(
        (
            "optimizer muon only: NorMuon's normalisation (arXiv:2510.05491, modded-nanogpt's): each orthogonalised"
            " update is divided row-wise (column-wise for a wide matrix) by the root of an exponential average"
            " (decay 0.95) of its mean square, then rescaled to the update's own norm. One rank, or DDP; not FSDP2."
            " Default false."
        ),
        reads("its normaliser's state", smoke=MUON, train=MUON, rehearse=MUON),
    )
    grad_clip: Number = setting(1.0, "Max global gradient norm; 0 turns clipping off.", STEP, ge=0)
    precision: Literal["auto", "bf16", "fp32"] = setting(
        "bf16",
        (
            "The step's precision, which its autocast, Muon's Newton-Schulz, FSDP2's parameters and the "
            "in-loop decode all follow: bf16 autocast over fp32 master weights, where the device supports it; "
            "fp32; or auto: bf16 on a GPU; fp32 on a CPU without bf16 instructions (x86 without AVX-512 BF16 "
            "or AMX, where bf16 matmuls are emulated, ~30x slower); elsewhere whichever of the two the smoke "
            "stage timed faster. smoke/plan.json records the pick and why."
        ),
        reads(smoke=OUTPUT, train=OUTPUT, eval=OUTPUT, report=OUTPUT, rehearse=OUTPUT),
    )
    compile: Literal["auto"] | bool = setting(
        "auto",
        "torch.compile; auto compiles on CUDA only.",
        reads("the same step, fused", smoke=RUN, train=RUN, rehearse=EAGER),
    )
    activation_checkpointing: Literal["none", "full", "selective", "auto"] = setting(
        "none",
        (
            "Which blocks' activations backward recomputes instead of keeping them from the forward pass "
            "(applied by kiln.train.parallel). none keeps every block's activations (fastest; at micro_batch "
            "x seq_len they are most of a step's memory). full keeps only each block's input, the residual "
            "stream (micro_batch x seq_len x d_model, fp32), and reruns the block in backward: the least "
            "memory, ~1/3 more compute. selective does so for every other block (the 2nd, 4th, ...; "
            "torchtitan's layer-level selective checkpointing) and keeps the rest whole: about half the "
            "activation memory for ~1/6 more compute. `kiln plan` estimates each mode's memory per GPU. auto:"
            " picked with the micro-batch (train.micro_batch)."
        ),
        reads("the same step, recomputed", smoke=RUN, train=RUN, rehearse=OUTPUT),
    )
    log_every: int = setting(
        10, "Steps between log lines (console, metrics.jsonl, wandb) and budget re-plans.", TRAIN_RUN, ge=1
    )
    eval_every: int = setting(
        100,
        "Steps between validation-loss measurements.",
        reads("what a budget spends on validation", plan=OUTPUT, train=BUDGETED),
        ge=1,
    )
    eval_batches: int = setting(
        20,
        "Validation batches per measurement during training.",
        reads(
            "the validation loss train logs, not its step; smoke times a validation, which a budget spends",
            smoke=BUDGETED,
            train=RUN,
        ),
        ge=1,
    )
    samples: Samples = group(Samples)
    checkpoint_every: int = setting(
        200, "Steps between checkpoints.", reads("what a budget spends on saving", plan=OUTPUT, train=BUDGETED), ge=1
    )
    keep_checkpoints: int = setting(
        2,
        "The newest checkpoints kept on the node (older ones are deleted as new ones complete).",
        reads("the plan's disk figure", plan=OUTPUT, train=RUN),
        ge=1,
    )
    keep_checkpoint_every: int = setting(
        0,
        (
            "Milestones: besides the newest keep_checkpoints, keep every checkpoint whose step is a multiple "
            "of this (a multiple of checkpoint_every), to roll back to past a divergence the newest ones "
            "already hold (seed 002 keeps the last 3 and one every 10k steps). 0: none. `kiln plan` counts "
            "them in its disk figure."
        ),
        reads("the plan's disk figure", plan=OUTPUT, train=RUN),
        ge=0,
    )
    checkpoint_format: Literal["auto", "full", "sharded"] = setting(
        "auto",
        (
            "How a checkpoint holds model and optimizer (kiln.train.checkpoint). full: one file, gathered "
            "onto rank 0, which writes it alone (its CPU holds the whole state at a save). sharded: "
            "torch.distributed.checkpoint's files, each rank writing its own part with nothing gathered; the "
            "checkpoint folder must then be on storage every node writes to. auto: sharded under "
            "train.parallel fsdp, full under ddp. A run resumes from either format, on any number of ranks (a"
            " sharded load reshards), and the eval stage reads either."
        ),
        TRAIN_RUN,
    )
    async_checkpoint: bool = setting(
        False,
        (
            "Sharded checkpoints only: each rank copies its shards to host memory at the save step and a "
            "background thread writes them while training goes on (torch.distributed.checkpoint's "
            "async_save); the checkpoint counts (complete.json, LATEST) once every rank's files are in, at "
            "the latest by the next save or the run's end. Costs a host copy of each rank's state."
        ),
        TRAIN_RUN,
    )
    checkpoint_mirror: str | None = setting(
        None,
        (
            "Copy every complete checkpoint off the node as it is written, in the background on rank 0 "
            "(kiln.train.mirror); null: no copies. A folder (local or a mount): each checkpoint lands in "
            "<folder>/<run>/step-NNNNNNN, under a temporary name until whole, then LATEST there moves to it. "
            "A command, recognised by {src} in it, run by the shell once per checkpoint with {src} (the "
            'checkpoint folder), {name} (step-NNNNNNN) and {run} filled in, e.g. "rclone copy {src} '
            'remote:kiln/{run}/{name}". A failed copy is logged, counted in metrics.jsonl (mirror_failures) '
            "and recorded in train/mirror.jsonl; training goes on. The mirror keeps every checkpoint it got "
            "(train.keep_checkpoints prunes the node's copies only)."
        ),
        TRAIN_RUN,
        min_length=1,
    )
    max_resubmits: int = setting(
        3,
        (
            "Under a cluster executor (snakemake --profile profiles/slurm), how many times a train job that "
            "ends preempted (exit 75: Slurm's time-limit warning, a preemption) is resubmitted by the same "
            "snakemake command, each resuming from the newest checkpoint; a job that failed any other way is "
            "not (its resubmission exits at once with the same code). Each resubmission is another job of the"
            " profile's train runtime. Local runs are never resubmitted."
        ),
        TRAIN_RUN,
        ge=0,
    )
    nonfinite: NonFinite = group(NonFinite)
    spike_factor: Number = setting(
        2.0,
        (
            "A step whose loss exceeds this multiple of the running average (an EMA, kept in checkpoints) is "
            "logged as a loss spike, in metrics.jsonl (spike_steps) and on the console."
        ),
        reads("a spike is logged, not acted on", train=RUN),
        gt=1,
    )

    @property
    def ranks(self) -> int:
        """Ranks of the whole run: nproc_per_node on each of nnodes."""
        return self.nproc_per_node * self.nnodes
