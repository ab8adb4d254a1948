"""The rules between keys that a schema cannot say, each reported by its dotted key path: FIM shares
summing to one, warmup below max_steps, a model shape the registry can build (heads dividing
d_model), a global batch that is a whole number of micro-batches on every rank, a vocabulary holding
the special tokens. Run on a config whose defaults the schema has filled in (kiln.config.schema)."""

from __future__ import annotations

import math

from kiln.config.batch import split_batch
from kiln.config.models import check_section as check_model
from kiln.config.special_tokens import BYTE_ALPHABET, SMALLEST_VOCAB, SPECIAL_TOKENS
from kiln.errors import KilnError


def check(cfg: dict) -> list[str]:
    """Every rule `cfg` breaks, one line each; the derived rules only once the keys' own hold."""
    return _between_keys(cfg) or _derived(cfg)


def _between_keys(cfg: dict) -> list[str]:
    """Rules between keys of the config's own sections."""
    problems = []
    fim = cfg["pretokenize"]["fim"]
    shares = fim["psm"] + fim["spm"] + fim["middle_only"]
    if not math.isclose(shares, 1.0, abs_tol=1e-6):
        problems.append(f"pretokenize.fim: psm + spm + middle_only must sum to 1, got {shares:g}")
    train = cfg["train"]
    if train["min_lr"] > train["lr"]:
        problems.append(f"train.min_lr: {train['min_lr']} is above train.lr={train['lr']}")
    if train["max_steps"] is None and train["budget"] is None:
        problems.append("train: set max_steps (optimizer steps) or budget ({minutes|hours|dollars: N})")
    if train["max_steps"] is not None and train["warmup_steps"] >= train["max_steps"]:
        problems.append(
            f"train.warmup_steps: {train['warmup_steps']} must be below train.max_steps={train['max_steps']}"
        )
    if "dollars" in (train["budget"] or {}) and not cfg["smoke"]["price_per_gpu_hour"]:
        problems.append("train.budget: dollars needs smoke.price_per_gpu_hour, the price of one device-hour, above 0")
    in_loop = cfg["eval"]["in_loop"]["every"]
    if in_loop % train["eval_every"]:
        problems.append(
            f"eval.in_loop.every: {in_loop} must be a multiple of train.eval_every={train['eval_every']} "
            "(the in-loop eval runs at validations)"
        )
    init = train["init_from"]
    if init is not None and len({"run", "checkpoint", "hf"} & set(init)) != 1:
        problems.append("train.init_from: give exactly one of run, checkpoint or hf")
    elif init is not None and init.get("optimizer") and "hf" in init:
        problems.append(
            "train.init_from.optimizer: a Hugging Face export holds no optimizer state; use run or checkpoint"
        )
    if init is not None and init.get("warmup_from") is not None and train["warmup_steps"] == 0:
        problems.append("train.init_from.warmup_from: needs train.warmup_steps above 0 (the steps that ramp from it)")
    if init is not None and init.get("warmup_from") == "source" and "hf" in init:
        problems.append(
            "train.init_from.warmup_from: source reads the last LR of a Kiln run or checkpoint (init_from: "
            "{run: NAME} or {checkpoint: FOLDER}); a Hugging Face folder records none: give the LR as a number"
        )
    if train["node_rank"] >= train["nnodes"]:
        problems.append(f"train.node_rank: {train['node_rank']} must be below train.nnodes={train['nnodes']}")
    if train["async_checkpoint"] and checkpoint_format(train["checkpoint_format"], train["parallel"]) != "sharded":
        problems.append(
            f"train.async_checkpoint: needs sharded checkpoints, but train.checkpoint_format is "
            f"{train['checkpoint_format']} under train.parallel {train['parallel']} (full); set it to sharded"
        )
    if train["fsdp_one_rank"] and train["parallel"] != "fsdp":
        problems.append(f"train.fsdp_one_rank: needs train.parallel fsdp, got {train['parallel']}")
    smoke = cfg["smoke"]
    if smoke["warmup_steps"] >= smoke["steps"]:
        problems.append(f"smoke.warmup_steps: {smoke['warmup_steps']} must be below smoke.steps={smoke['steps']}")
    if smoke["profile_step"] is not None and smoke["profile_step"] > smoke["steps"]:
        problems.append(f"smoke.profile_step: {smoke['profile_step']} is past smoke.steps={smoke['steps']}")
    names = [s["name"] for s in cfg["download"]["sources"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"download.sources: names must be unique, repeated: {', '.join(dupes)}")
    mixture = cfg["pretokenize"]["mixture"]
    unknown = sorted(set(mixture) - set(names))
    if unknown:
        problems.append(f"pretokenize.mixture: {', '.join(unknown)} not among download.sources ({', '.join(names)})")
    if mixture and cfg["pretokenize"].get("train_tokens") is None:
        problems.append("pretokenize.mixture: weights need pretokenize.train_tokens, the train tokens to share")
    return problems


def checkpoint_format(setting: str, parallel: str) -> str:
    """train.checkpoint_format's meaning under train.parallel: auto is sharded under FSDP (no rank
    gathers the whole state) and full under DDP (one file, as before sharded checkpoints existed)."""
    if setting != "auto":
        return setting
    return "sharded" if parallel == "fsdp" else "full"


def _derived(cfg: dict) -> list[str]:
    """Rules on what the config derives: the model's shape, the vocabulary, the batch split."""
    problems = check_model(cfg["model"], cfg["shard"]["seq_len"])
    vocab = cfg["tokenizer"].get("vocab_size", SMALLEST_VOCAB)  # only a trained tokenizer has one
    if vocab < SMALLEST_VOCAB:
        problems.append(
            f"tokenizer.vocab_size: {vocab} is smaller than the {SMALLEST_VOCAB} tokens every vocabulary holds "
            f"({BYTE_ALPHABET} byte symbols + {len(SPECIAL_TOKENS)} special tokens)"
        )
    train = cfg["train"]
    world = train["nproc_per_node"] * train["nnodes"]
    if train["micro_batch"] == "auto":  # picked by the smoke stage (kiln.plan.autofit): a divisor of a rank's rows
        problems += check_auto_micro_batch(train["batch_tokens"], cfg["shard"]["seq_len"], world)
    else:
        try:
            split_batch(train["batch_tokens"], train["micro_batch"], cfg["shard"]["seq_len"], world)
        except KilnError as exc:
            problems.append(str(exc))
    every, period = train["keep_checkpoint_every"], train["checkpoint_every"]
    if every % period:
        problems.append(
            f"train.keep_checkpoint_every: {every} is not a multiple of train.checkpoint_every={period}, "
            f"so no checkpoint would fall on it (e.g. {max(1, every // period) * period})"
        )
    return problems


def check_auto_micro_batch(batch_tokens: int | None, seq_len: int, world: int) -> list[str]:
    """train.micro_batch: auto divides each rank's rows per step, so the global batch must be given in
    whole rows per rank."""
    if batch_tokens is None:
        return ["train.micro_batch: auto needs train.batch_tokens: the global batch the micro-batch divides"]
    if batch_tokens % (world * seq_len):
        return [
            f"train.batch_tokens: {batch_tokens} is not a multiple of {world} ranks x shard.seq_len {seq_len}, "
            "so train.micro_batch: auto has no whole number of rows per rank to divide"
        ]
    return []
