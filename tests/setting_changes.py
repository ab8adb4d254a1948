"""One valid change of each setting, made as a user makes it: from the setting's declaration (another of
its values, a number moved within its bounds) or, where a value has constraints beside it or siblings
that must move with it, by hand (SPECIAL); and the arguments a user types for it on a run's config.
tests/dag/test_settings.py dry-runs each change; tests/dag/test_tags.py runs each through its stages."""

import base64
import typing
from pathlib import Path

import yaml

from kiln import config as kiln_config
from kiln.config import settings
from kiln.config.schema import Leaf

REMOVE = object()  # in a change: the key is deleted from the run file (a kind that does not take it)

# The changes a generic rule (another enum member, the boolean flipped, a number moved) cannot make:
# a value with a constraint beside it, or siblings that must change with it. Each is one dotted
# path -> {dotted path: value} applied together.
SPECIAL: dict[str, dict] = {
    "run_name": {"run_name": "tiny-renamed"},
    "download.sources": {
        "download.sources": [{"name": "stdlib", "kind": "stdlib", "include": ["json/*.py", "email/*.py"]}]
    },
    "download.max_doc_bytes": {"download.max_doc_bytes": 200_000},
    "tokenizer.kind": {"tokenizer.kind": "tiktoken", "tokenizer.encoding": "gpt2", "tokenizer.vocab_size": REMOVE},
    "tokenizer.encoding": {"tokenizer.kind": "tiktoken", "tokenizer.encoding": "gpt2", "tokenizer.vocab_size": REMOVE},
    "tokenizer.path": {"tokenizer.kind": "file", "tokenizer.path": "{tokenizer}", "tokenizer.vocab_size": REMOVE},
    "tokenizer.pattern": {
        "tokenizer.kind": "tiktoken",
        "tokenizer.path": "{ranks}",
        "tokenizer.pattern": r"\s+|\w+|[^\s\w]+",
        "tokenizer.vocab_size": REMOVE,
    },
    "pretokenize.train_tokens": {"pretokenize.train_tokens": 200_000},
    "pretokenize.mixture": {"pretokenize.mixture": {"stdlib": 1.0}, "pretokenize.train_tokens": 200_000},
    "pretokenize.fim.rate": {"pretokenize.fim.rate": 0.4},
    # psm + spm + middle_only sum to 1 (0.5 + 0.25 + 0.25 by default): each moves with a sibling
    "pretokenize.fim.psm": {"pretokenize.fim.psm": 0.4, "pretokenize.fim.spm": 0.35},
    "pretokenize.fim.spm": {"pretokenize.fim.spm": 0.2, "pretokenize.fim.middle_only": 0.3},
    "pretokenize.fim.middle_only": {"pretokenize.fim.middle_only": 0.2, "pretokenize.fim.psm": 0.55},
    "shard.seq_len": {"shard.seq_len": 128, "train.batch_tokens": 2048},
    "model.flavour": {"model.flavour": "gpt2-124m"},
    "model.family": {"model.family": "llama"},
    "model.n_head": {"model.n_head": 4},
    "model.d_model": {"model.d_model": 128},
    "model.n_kv_head": {"model.family": "llama", "model.n_kv_head": 1},
    "model.rope_theta": {"model.family": "llama", "model.rope_theta": 500_000.0},
    "model.max_positions": {"model.max_positions": 128},
    "model.dropout": {"model.dropout": 0.1},
    "model.bias": {"model.bias": False},
    "model.tie_embeddings": {"model.tie_embeddings": False},
    "model.norm_eps": {"model.norm_eps": 1e-6},
    "model.d_ff": {"model.d_ff": 128},
    "model.qkv_bias": {"model.family": "llama", "model.qkv_bias": True},
    "model.sliding_window": {"model.family": "starcoder2", "model.sliding_window": 4096},
    "model.document_mask": {"model.document_mask": True},
    # issue 44's recipe options: the llama family builds them (the others refuse them by name)
    "model.qk_norm": {"model.family": "llama", "model.qk_norm": True},
    "model.mlp_activation": {"model.family": "llama", "model.mlp_activation": "relu2"},
    "model.zero_init_projections": {"model.family": "llama", "model.zero_init_projections": True},
    "train.normuon": {"train.optimizer": "muon", "train.normuon": True},
    "model.rope_scaling": {
        "model.family": "llama",
        "model.rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "train.async_checkpoint": {"train.async_checkpoint": True, "train.checkpoint_format": "sharded"},
    "train.fsdp_one_rank": {"train.fsdp_one_rank": True, "train.parallel": "fsdp"},
    "smoke.price_per_gpu_hour": {"smoke.price_per_gpu_hour": 3.09},
    "smoke.profile_step": {"smoke.profile_step": 3},
    "plan.gpu": {"plan.gpu": "A100"},
    "train.nproc_per_node": {"train.nproc_per_node": 2, "train.micro_batch": 8},
    "train.nnodes": {"train.nnodes": 2, "train.micro_batch": 8, "train.rdzv_endpoint": "node0:29500"},
    "train.node_rank": {"train.nnodes": 2, "train.node_rank": 1, "train.micro_batch": 8, "train.rdzv_endpoint": "n:1"},
    "train.rdzv_endpoint": {"train.rdzv_endpoint": "localhost:29400"},
    "train.micro_batch": {"train.micro_batch": 8},
    "train.batch_tokens": {"train.batch_tokens": 2048},
    "train.budget": {"train.budget": {"minutes": 5}},
    "train.init_from": {"train.init_from": {"hf": "{hf}"}},
    "train.seed": {"train.seed": 8},
    "train.checkpoint_every": {"train.checkpoint_every": 50},
    "train.keep_checkpoint_every": {"train.keep_checkpoint_every": 200},
    "train.checkpoint_mirror": {"train.checkpoint_mirror": "{mirror}"},
    "train.samples.prompts": {"train.samples.prompts": ["def main():\n"]},
    "eval.prompts": {"eval.prompts": ["def main():\n"]},
    "eval.reference": {"eval.reference": None},
    "eval.lm_eval.tasks": {"eval.lm_eval.tasks": ["kiln_heldout_perplexity"]},
    "eval.humaneval.samples": {"eval.humaneval.samples": 2},  # auto is 0 on a CPU
    "eval.in_loop.every": {"eval.in_loop.every": 50},  # a multiple of tiny.yaml's train.eval_every
    "eval.humaneval_infill.kinds": {"eval.humaneval_infill.kinds": ["single_line", "random_span"]},
    "eval.humaneval_infill.modes": {"eval.humaneval_infill.modes": ["psm", "spm"]},
    "wandb.mode": {"wandb.mode": "offline"},
    "wandb.project": {"wandb.project": "kiln-test"},
}


def _moved(path: str, value, leaf: Leaf):
    """Another valid value for this leaf, from its declaration (its values, its upper bound)."""
    args = (leaf.field.annotation, *typing.get_args(leaf.field.annotation))
    values = [a for arg in args for a in _literal(arg)]
    if values and bool in args:  # "auto", true or false (train.compile)
        values += [True, False]
    if values:
        return next(v for v in values if v != value)
    bounds = [getattr(m, name) for m in leaf.field.metadata for name in ("le", "lt") if hasattr(m, name)]
    top = min(bounds, default=float("inf"))
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value - 1 if value >= top else value + 1
    if isinstance(value, float):
        return value * 1.5 if value * 1.5 < top else value / 2
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value[:-1] if len(value) > 1 else [*value, "x"]
    raise AssertionError(f"{path}: no generic change for {value!r}; add one to SPECIAL")


def _literal(annotation) -> tuple:
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()


def filled(value, files: dict[str, str]):
    """value with {tokenizer}, {hf}, ... in its strings replaced by the fixture's files."""
    if isinstance(value, str):
        return value.format(**files)
    if isinstance(value, dict):
        return {k: filled(v, files) for k, v in value.items()}
    return value


def changes(path: str, cfg: dict, files: dict[str, str]) -> dict[str, object]:
    if path in SPECIAL:
        return {p: filled(v, files) for p, v in SPECIAL[path].items()}
    return {path: _moved(path, settings._get(cfg, path), settings.schema_leaves()[path])}


def _edited(change: dict[str, object], base: Path) -> dict:
    """The run file `base` as written, with the change made (REMOVE deletes a key)."""
    raw = yaml.safe_load(base.read_text())
    for path, value in change.items():
        if value is REMOVE:
            *parents, last = path.split(".")
            settings._get(raw, ".".join(parents)).pop(last, None)
        else:
            settings._put(raw, path, value)
    return raw


def user_args(change: dict[str, object], folder: Path, base: Path) -> list[str]:
    """What the user types: the run file `base` and --config arguments, one per top-level key (e.g.
    `train={lr: 0.004}`); a change that deletes a key (which --config cannot) edits a copy of the file."""
    if any(value is REMOVE for value in change.values()):
        edited = folder / f"{len(list(folder.iterdir()))}.yaml"
        edited.write_text(yaml.safe_dump(_edited(change, base)))
        return ["--configfile", str(edited)]
    tree: dict = {}
    for path, value in change.items():
        settings._put(tree, path, value)
    flow = [
        f"{key}={yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix('...').strip()}"
        for key, value in tree.items()
    ]
    return ["--configfile", str(base), "--config", *flow]


def apply(change: dict[str, object], base: Path) -> dict:
    """The validated config of `base` with the change made."""
    return kiln_config.validate(_edited(change, base))


def change_files(workdir: Path, run: Path, folder: Path) -> dict[str, str]:
    """The files the changes name ({tokenizer}, {ranks}, {hf}, {checkpoint}, {mirror}), from a finished run."""
    ranks = folder / "bytes.tiktoken"  # a .tiktoken ranks file: the 256 single bytes
    ranks.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    mirror = folder / "mirror"
    mirror.mkdir(exist_ok=True)
    return {
        "tokenizer": str(next((workdir / "results" / "data").glob("tokenizer-*")) / "tokenizer.json"),
        "ranks": str(ranks),
        "hf": str(run / "train" / "hf"),
        "checkpoint": str(max((run / "train" / "checkpoints").glob("step-*"))),
        "mirror": str(mirror),
    }
