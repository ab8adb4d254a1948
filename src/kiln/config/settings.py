"""Every setting of a run: which stages read it, and whether it changes what they make.

One table (SETTINGS) names each leaf of the schema (workflow/schemas/config.schema.yaml) by its
dotted path, with the stages that read it and, for each, one of

  OUTPUT  it changes what the stage makes: weights and trajectory, shards, eval numbers, the plan's
          figures. It is in the rule's params, so Snakemake reruns the stage when it changes.
  RUN     it changes only how the stage runs and shows its work: logging, cadence, placement,
          retries, timeouts, the micro-batch at an equal global batch, ranks. The stage reads it,
          but its rule does not rerun for it: a logging change never costs a retrain.
  When    OUTPUT in the runs that meet a condition (say, a budget in dollars), RUN in the rest.

Everything that says which setting concerns which stage is derived from this table, and nothing
else lists keys by stage:

  tracked / untracked   a rule's params: the OUTPUT leaves as JSON Snakemake compares, and the rest
                        of the stage's sections as a value it cannot represent and so ignores
                        (snakemake.persistence skips such params), passed to the script all the same;
  trajectory            the train leaves a checkpoint's fingerprint holds (kiln.train.fingerprint);
  data_key              the content key of a shared data folder (kiln.layout);
  markdown_table        docs/settings.md (`python -m kiln.config`; a test keeps it current).

tests/test_settings.py holds the table to the schema (a new key without a tag fails the suite) and
changes every leaf on a finished tiny run: the jobs a dry run schedules must be exactly the stages
this table names, and what depends on them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kiln.config.schema import leaves as schema_leaves
from kiln.errors import KilnError

OUTPUT, RUN = "output", "run"
# The stages in DAG order (kiln.layout owns where each writes); `plan` prices the smoke stage's
# measurements (smoke/plan.json, plan.md), apart from what train reads, so a price reruns no training.
DATA_STAGES = ("download", "tokenizer", "pretokenize", "shard")
# eval_data is eval's CPU work on the data alone (the unigram baseline, the held-out documents'
# infilling problems and lm-eval task data, the contamination scan), run beside training.
STAGES = (*DATA_STAGES, "smoke", "plan", "train", "eval_data", "eval", "report")


@dataclass(frozen=True)
class When:
    """OUTPUT for a stage in the runs whose config meets `test`, RUN in the others."""

    what: str  # the condition in words, for docs/settings.md
    test: Callable[[Mapping], bool]  # on the validated config (at least the sections it names)

    def __repr__(self) -> str:
        return f"output when {self.what}"


BUDGETED = When("train.budget is set", lambda cfg: cfg["train"]["budget"] is not None)
DOLLARS = When("train.budget is in dollars", lambda cfg: "dollars" in (cfg["train"]["budget"] or {}))
MUON = When("train.optimizer is muon", lambda cfg: cfg["train"]["optimizer"] == "muon")
# With train.batch_tokens null the global batch is one micro-batch per rank: the ranks and the
# micro-batch then make the step, not only how it is spread.
PER_RANK_BATCH = When("train.batch_tokens is null", lambda cfg: cfg["train"]["batch_tokens"] is None)


@dataclass(frozen=True)
class Setting:
    reads: Mapping[str, str | When] = field(default_factory=dict)  # stage -> OUTPUT | RUN | When
    note: str = ""  # why, where the tag is not obvious (docs/settings.md)


def _s(note: str = "", **reads) -> Setting:
    return Setting(reads, note)


# Groups that recur. The smoke probe runs train's step (its optimizer, batch, precision) at a
# constant LR, so the schedule's shape and length shape train alone.
DOWNLOAD = _s(download=OUTPUT)
TOKENIZER = _s(tokenizer=OUTPUT)
PRETOKENIZE = _s(pretokenize=OUTPUT)
MODEL = _s(smoke=OUTPUT, train=OUTPUT, report=OUTPUT)
GATE = _s(smoke=OUTPUT)
STEP = _s(smoke=OUTPUT, train=OUTPUT, report=OUTPUT)  # the optimizer step the probe also runs
SCHEDULE = _s(train=OUTPUT, report=OUTPUT)
MUON_STEP = _s(smoke=MUON, train=MUON)
PLACEMENT = _s("where the ranks run: the data order is a function of the global row", smoke=RUN, train=RUN)
RANKS = _s(
    "the data order is a function of the global row; with no train.batch_tokens, the batch is per rank",
    smoke=PER_RANK_BATCH,
    train=PER_RANK_BATCH,
    eval=RUN,
    report=PER_RANK_BATCH,
)
TRAIN_RUN = _s(train=RUN)
EVAL = _s(eval=OUTPUT)
EVAL_DATA = _s("eval reads what eval_data made of it", eval_data=OUTPUT)

SETTINGS: dict[str, Setting] = {
    "run_name": _s(
        "names results/<run_name>/: another name is another run",
        eval_data=OUTPUT,
        smoke=OUTPUT,
        plan=OUTPUT,
        train=OUTPUT,
        eval=OUTPUT,
        report=OUTPUT,
    ),
    "seed": _s(
        "the data seed (split, FIM, tokenizer sample, eval's infilling problems and task examples); also "
        "train.seed's default",
        tokenizer=OUTPUT,
        pretokenize=OUTPUT,
        eval_data=OUTPUT,
        report=OUTPUT,
    ),
    "download.sources": _s("the report names them", download=OUTPUT, report=OUTPUT),
    "download.rows_per_part": DOWNLOAD,
    "download.scatter_mb": _s("how many download_part jobs check the input; the bytes equal one job's", download=RUN),
    "download.dedup": DOWNLOAD,
    "download.decontaminate.humaneval": DOWNLOAD,
    "download.decontaminate.ngram": DOWNLOAD,
    "download.near_dup.enabled": DOWNLOAD,
    "download.near_dup.shingle": DOWNLOAD,
    "download.near_dup.bands": DOWNLOAD,
    "download.near_dup.rows": DOWNLOAD,
    "download.near_dup.seed": DOWNLOAD,
    "download.filters.auto_generated": DOWNLOAD,
    "download.filters.long_lines": DOWNLOAD,
    "download.filters.alphanumeric": DOWNLOAD,
    "download.filters.encoded_data": DOWNLOAD,
    "download.filters.gopher_words": DOWNLOAD,
    "download.filters.gopher_word_length": DOWNLOAD,
    "download.filters.gopher_symbols": DOWNLOAD,
    "download.filters.gopher_bullets": DOWNLOAD,
    "download.filters.gopher_ellipsis": DOWNLOAD,
    "download.filters.gopher_alpha_words": DOWNLOAD,
    "download.filters.gopher_stop_words": DOWNLOAD,
    "download.min_doc_bytes": DOWNLOAD,
    "download.max_doc_bytes": DOWNLOAD,
    "download.invalid_utf8": DOWNLOAD,
    "download.retries": _s("a retry resumes from the last complete part", download=RUN),
    "download.retry_backoff_s": _s(download=RUN),
    "tokenizer.kind": TOKENIZER,
    "tokenizer.heldout_docs": TOKENIZER,
    "tokenizer.vocab_size": TOKENIZER,
    "tokenizer.train_bytes": TOKENIZER,
    "tokenizer.path": TOKENIZER,
    "tokenizer.encoding": TOKENIZER,
    "tokenizer.pattern": TOKENIZER,
    "pretokenize.val_tokens": PRETOKENIZE,
    "pretokenize.heldout_ngram": PRETOKENIZE,
    "pretokenize.heldout_guard": PRETOKENIZE,
    "pretokenize.train_tokens": PRETOKENIZE,
    "pretokenize.mixture": PRETOKENIZE,
    "pretokenize.repo_context": PRETOKENIZE,
    "pretokenize.encoder": _s("meta.json records the encoder used", pretokenize=OUTPUT),
    "pretokenize.fim.rate": PRETOKENIZE,
    "pretokenize.fim.psm": PRETOKENIZE,
    "pretokenize.fim.spm": PRETOKENIZE,
    "pretokenize.fim.middle_only": PRETOKENIZE,
    "pretokenize.fim.min_chars": PRETOKENIZE,
    "shard.seq_len": _s("also the model's context", shard=OUTPUT, report=OUTPUT),
    "shard.rows_per_shard": _s(shard=OUTPUT),
    "model.flavour": MODEL,
    "model.family": MODEL,
    "model.n_layer": MODEL,
    "model.n_head": MODEL,
    "model.d_model": MODEL,
    "model.n_kv_head": MODEL,
    "model.d_ff": MODEL,
    "model.max_positions": MODEL,
    "model.rope_theta": MODEL,
    "model.norm_eps": MODEL,
    "model.dropout": MODEL,
    "model.bias": MODEL,
    "model.tie_embeddings": MODEL,
    "model.qkv_bias": MODEL,
    "model.rope_scaling": MODEL,
    "model.sliding_window": MODEL,
    "smoke.steps": GATE,
    "smoke.warmup_steps": GATE,
    "smoke.min_loss_drop": GATE,
    "smoke.val_batches": GATE,
    "smoke.min_val_drop": GATE,
    "smoke.init_loss_tolerance": GATE,
    "smoke.causal_tolerance": GATE,
    "smoke.max_data_wait": GATE,
    "smoke.min_token_entropy": GATE,
    "smoke.gate": GATE,
    "smoke.overfit.rows": GATE,
    "smoke.overfit.max_steps": GATE,
    "smoke.overfit.max_loss": GATE,
    "smoke.precision_steps": _s("the steps that pick train.precision auto's precision", smoke=OUTPUT),
    "smoke.price_per_gpu_hour": _s("the plan's cost; a budget in dollars buys steps at it", plan=OUTPUT, train=DOLLARS),
    "smoke.profile_step": _s("a trace beside the report, not part of it", smoke=RUN),
    "plan.gpu": _s("`kiln plan`'s assumed device, before any stage runs"),
    "plan.mfu": _s("`kiln plan`'s assumed MFU, before any stage runs"),
    "train.nproc_per_node": RANKS,
    "train.nnodes": RANKS,
    "train.node_rank": PLACEMENT,
    "train.rdzv_endpoint": PLACEMENT,
    "train.device": _s(smoke=RUN, train=RUN, eval=RUN),
    "train.parallel": _s("DDP or FSDP, the same step", smoke=RUN, train=RUN),
    "train.collective_timeout_s": PLACEMENT,
    "train.first_step_timeout_s": PLACEMENT,
    "train.micro_batch": _s(
        "at an equal global batch (train.batch_tokens), the same rows per step",
        smoke=PER_RANK_BATCH,
        train=PER_RANK_BATCH,
        report=PER_RANK_BATCH,
    ),
    "train.batch_tokens": STEP,
    "train.max_steps": _s(plan=OUTPUT, train=OUTPUT, report=OUTPUT),
    "train.budget": _s(plan=OUTPUT, train=OUTPUT, report=OUTPUT),
    "train.init_from": _s("also whether eval tests infilling", smoke=OUTPUT, train=OUTPUT, eval_data=OUTPUT),
    "train.seed": _s(
        "the model seed: initial weights, data order, samples (null: seed)",
        smoke=OUTPUT,
        train=OUTPUT,
        eval=OUTPUT,
        report=OUTPUT,
    ),
    "train.lr": STEP,
    "train.min_lr": SCHEDULE,
    "train.warmup_steps": _s("the probe warms up for at most a third of its steps", smoke=OUTPUT, train=OUTPUT),
    "train.schedule": SCHEDULE,
    "train.decay_fraction": SCHEDULE,
    "train.cooldown": SCHEDULE,
    "train.weight_decay": STEP,
    "train.beta1": STEP,
    "train.beta2": STEP,
    "train.eps": STEP,
    "train.optimizer": STEP,
    "train.muon_lr": MUON_STEP,
    "train.muon_momentum": MUON_STEP,
    "train.muon_weight_decay": MUON_STEP,
    "train.muon_adjust_lr": MUON_STEP,
    "train.grad_clip": STEP,
    "train.precision": _s(smoke=OUTPUT, train=OUTPUT, eval=OUTPUT, report=OUTPUT),
    "train.compile": _s("the same step, fused", smoke=RUN, train=RUN),
    "train.activation_checkpointing": _s("the same step, recomputed", smoke=RUN, train=RUN),
    "train.log_every": TRAIN_RUN,
    "train.eval_every": _s("what a budget spends on validation", plan=OUTPUT, train=BUDGETED),
    "train.eval_batches": _s(
        "the validation loss train logs, not its step; smoke times a validation, which a budget spends",
        smoke=BUDGETED,
        train=RUN,
    ),
    "train.samples.prompts": _s("eval completes them with the final model", train=RUN, eval=OUTPUT),
    "train.samples.max_new_tokens": _s(train=RUN, eval=OUTPUT),
    "train.samples.temperature": _s(train=RUN, eval=OUTPUT),
    "train.samples.top_p": _s(train=RUN, eval=OUTPUT),
    "train.checkpoint_every": _s("what a budget spends on saving", plan=OUTPUT, train=BUDGETED),
    "train.keep_checkpoints": _s("the plan's disk figure", plan=OUTPUT, train=RUN),
    "train.keep_checkpoint_every": _s("the plan's disk figure", plan=OUTPUT, train=RUN),
    "train.checkpoint_format": TRAIN_RUN,
    "train.async_checkpoint": TRAIN_RUN,
    "train.checkpoint_mirror": TRAIN_RUN,
    "train.max_resubmits": TRAIN_RUN,
    "train.nonfinite.action": _s("a step that is not finite is never applied", train=RUN),
    "train.nonfinite.max_skips": TRAIN_RUN,
    "train.spike_factor": _s("a spike is logged, not acted on", train=RUN),
    "eval.reference": _s("a figure beside the run's", report=OUTPUT),
    "eval.max_batches": _s("the unigram baseline reads the same batches", eval_data=OUTPUT, eval=OUTPUT),
    "eval.prompts": EVAL,
    "eval.max_new_tokens": EVAL,
    "eval.temperature": EVAL,
    "eval.top_k": EVAL,
    "eval.top_p": EVAL,
    "eval.infill_docs": EVAL_DATA,
    "eval.lm_eval.tasks": _s("eval_data scans the local ones for contamination", eval_data=OUTPUT, eval=OUTPUT),
    "eval.lm_eval.limit": EVAL,
    "eval.lm_eval.max_docs": EVAL_DATA,
    "eval.humaneval.problems": EVAL,
    "eval.humaneval.samples": EVAL,
    "eval.humaneval.max_new_tokens": EVAL,
    "eval.humaneval_infill.problems": EVAL,
    "eval.humaneval_infill.kinds": EVAL,
    "eval.humaneval_infill.modes": EVAL,
    "eval.humaneval_infill.max_new_tokens": EVAL,
    "wandb.mode": _s("where the metrics are also sent", train=RUN),
    "wandb.project": TRAIN_RUN,
}


class Untracked:
    """A rule param Snakemake does not compare between runs: snakemake.persistence records only
    params of builtin types, so this value's changes rerun nothing. The shell gets str(value)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def check_table(leaves: Mapping[str, dict] | None = None) -> None:
    """A KilnError naming every schema leaf (of `leaves`, by default the schema's) without a tag, and
    every tag without a leaf."""
    leaves, tagged = set(schema_leaves() if leaves is None else leaves), set(SETTINGS)
    problems = [f"{p}: a schema key with no entry in kiln.config.settings.SETTINGS" for p in sorted(leaves - tagged)]
    problems += [f"{p}: tagged in kiln.config.settings.SETTINGS but not in the schema" for p in sorted(tagged - leaves)]
    bad = [f"{p}: unknown stage {s}" for p, v in SETTINGS.items() for s in v.reads if s not in STAGES]
    if problems + bad:
        raise KilnError("; ".join(problems + bad))


# ------------------------------------------------------------------------------------------------
# What each stage reads, and what reruns it


def effect(path: str, stage: str, cfg: Mapping) -> str | None:
    """OUTPUT, RUN, or None (the stage does not read it) for `path` in this config."""
    tag = SETTINGS[path].reads.get(stage)
    if isinstance(tag, When):
        return OUTPUT if tag.test(cfg) else RUN
    return tag


def _get(cfg: Mapping, path: str):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _put(tree: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = copy.deepcopy(value)


def sections(stage: str) -> tuple[str, ...]:
    """The top-level sections a stage reads (whole: a script reads a section as one typed object)."""
    return tuple(dict.fromkeys(path.split(".")[0] for path, s in SETTINGS.items() if stage in s.reads))


def _split(cfg: Mapping, stage: str) -> tuple[dict, dict]:
    """(the OUTPUT leaves, everything else of the stage's sections), each a nested dict."""
    tracked: dict = {}
    for path in SETTINGS:
        if effect(path, stage, cfg) == OUTPUT:
            try:
                _put(tracked, path, _get(cfg, path))
            except KeyError:  # a key the config leaves unset (no default): nothing to track
                pass
    rest = {name: copy.deepcopy(cfg[name]) for name in sections(stage) if name in cfg}
    _prune(rest, tracked)
    return tracked, rest


def _prune(tree: dict, remove: Mapping) -> None:
    for key, value in remove.items():
        if isinstance(value, Mapping) and isinstance(tree.get(key), dict) and value:
            _prune(tree[key], value)
            if not tree[key]:
                del tree[key]
        else:
            tree.pop(key, None)


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def tracked(cfg: Mapping, stage: str) -> str:
    """The rule's tracked params: the stage's OUTPUT leaves as canonical JSON, so Snakemake reruns the
    stage exactly when one of them changes."""
    return _canonical(_split(cfg, stage)[0])


def untracked(cfg: Mapping, stage: str) -> Untracked:
    """The rest of what the stage reads (its RUN leaves and the other keys of its sections), as a
    param Snakemake does not compare."""
    return Untracked(_canonical(_split(cfg, stage)[1]))


def stage_config(cfg: Mapping, stage: str) -> dict:
    """The sections a stage reads, whole: what a script gets by hand (--config) and, joined from
    the two params, under Snakemake."""
    return join(*_split(cfg, stage))


def join(tracked_part: Mapping, rest: Mapping) -> dict:
    """The two params of a rule joined back into the stage's sections."""
    out = copy.deepcopy(dict(rest))
    for key, value in tracked_part.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = join(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def trajectory(train: Mapping) -> dict:
    """The train section's leaves that shape the trajectory (OUTPUT for the train stage), nested as
    the section is; train.seed is left to the fingerprint's own seed part."""
    cfg = {"train": train}
    kept: dict = {}
    for path in SETTINGS:
        if path.startswith("train.") and path != "train.seed" and effect(path, "train", cfg) == OUTPUT:
            try:
                _put(kept, path, _get(cfg, path))
            except KeyError:
                pass
    return kept.get("train", {})


def data_key(cfg: Mapping, stage: str, chars: int) -> str:
    """The content key of a shared data stage's folder: a hash of the sections that shape it and
    every data stage before it, with each RUN leaf held at its schema default (so a retry setting
    moves no data, and the keys of configs written before the tags stay what they were)."""
    upto = DATA_STAGES[: DATA_STAGES.index(stage) + 1]
    names = sorted({name for s in upto for name in sections(s)})
    shaped = {name: copy.deepcopy(cfg[name]) for name in names}
    leaves = schema_leaves()
    for path in SETTINGS:
        if any(effect(path, s, cfg) == RUN for s in upto) and not any(effect(path, s, cfg) == OUTPUT for s in upto):
            if "default" in leaves[path]:
                _put(shaped, path, leaves[path]["default"])
    return hashlib.sha256(_canonical(shaped).encode()).hexdigest()[:chars]


# ------------------------------------------------------------------------------------------------
# docs/settings.md


def markdown_table() -> str:
    """docs/settings.md: every setting with the stages it reruns and those that read it only to run."""
    lines = [
        "# Settings: what each one reruns",
        "",
        "Made by `python -m kiln.config > docs/settings.md` from `kiln.config.settings.SETTINGS` (tests/test_settings.py",
        "checks it is current). **reruns**: the stages whose outputs the setting changes; Snakemake reruns them,",
        "and what reads their outputs, when it changes. **read to run**: stages that read it only for how they",
        "run or show their work (logging, cadence, placement, retries): a change there reruns nothing.",
        "",
        "| setting | reruns | read to run | why |",
        "|---|---|---|---|",
    ]
    for path, setting in SETTINGS.items():
        reruns = [s if tag == OUTPUT else f"{s} ({tag!r})" for s, tag in setting.reads.items() if tag != RUN]
        runs = [s for s, tag in setting.reads.items() if tag == RUN]
        row = f"| `{path}` | {', '.join(reruns) or '-'} | {', '.join(runs) or '-'} | {setting.note} |"
        lines.append(row)
    return "\n".join(lines) + "\n"
