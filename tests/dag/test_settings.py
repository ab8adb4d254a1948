"""kiln.config.settings against the schema and against Snakemake: every leaf of the schema has a tag, and
changing one on a finished tiny run schedules exactly the stages its tag names and what reads their
outputs, in a real dry run. The tags themselves are checked where they matter most by real reruns
(tests/dag/test_pipeline.py: a log setting trains nothing and leaves the weights bitwise equal; a new lr
trains what a fresh run at that lr trains)."""

import base64
import copy
import json
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest
import yaml
from tiny import ROOT, TINY

from kiln import config as kiln_config
from kiln.config import schema, settings
from kiln.config.declare import Declared
from kiln.config.schema import Leaf
from kiln.config.settings import OUTPUT, RUN, SETTINGS, STAGES
from kiln.errors import KilnError

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
    "eval.humaneval_infill.kinds": {"eval.humaneval_infill.kinds": ["single_line", "random_span"]},
    "eval.humaneval_infill.modes": {"eval.humaneval_infill.modes": ["psm", "spm"]},
    "wandb.mode": {"wandb.mode": "offline"},
    "wandb.project": {"wandb.project": "kiln-test"},
}

# The cases the issue names, by hand, beside what the table derives: a presentation setting reruns
# nothing, a price only the plan, eval settings eval, the model seed the run but not its data.
RUN_STAGES = {"smoke", "plan", "train", "eval", "report"}
BY_HAND = {
    "train.log_every": set(),
    "train.keep_checkpoints": {"plan", "report"},  # the plan's disk figure; no training
    "train.checkpoint_mirror": set(),
    "train.collective_timeout_s": set(),
    "train.max_resubmits": set(),
    "train.micro_batch": set(),  # at an equal global batch
    "train.nproc_per_node": set(),
    "wandb.mode": set(),
    "smoke.price_per_gpu_hour": {"plan", "report"},
    "train.samples.prompts": {"eval", "report"},
    "eval.max_batches": {"eval_data", "eval", "report"},  # the unigram baseline reads the same batches
    "eval.infill_docs": {"eval_data", "eval", "report"},  # the problems are made beside training
    "eval.reference": {"report"},
    "train.lr": RUN_STAGES,
    "train.seed": RUN_STAGES,
    "seed": {"tokenizer", "pretokenize", "shard", "eval_data"} | RUN_STAGES,
    "tokenizer.vocab_size": {"tokenizer", "pretokenize", "shard", "eval_data"} | RUN_STAGES,
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


def _filled(value, files: dict[str, str]):
    """value with {tokenizer}, {hf}, ... in its strings replaced by the fixture's files."""
    if isinstance(value, str):
        return value.format(**files)
    if isinstance(value, dict):
        return {k: _filled(v, files) for k, v in value.items()}
    return value


def changes(path: str, cfg: dict, files: dict[str, str]) -> dict[str, object]:
    if path in SPECIAL:
        return {p: _filled(v, files) for p, v in SPECIAL[path].items()}
    return {path: _moved(path, settings._get(cfg, path), settings.schema_leaves()[path])}


def _edited(change: dict[str, object]) -> dict:
    """tests/configs/tiny.yaml as written, with the change made (REMOVE deletes a key)."""
    raw = yaml.safe_load(TINY.read_text())
    for path, value in change.items():
        if value is REMOVE:
            *parents, last = path.split(".")
            settings._get(raw, ".".join(parents)).pop(last, None)
        else:
            settings._put(raw, path, value)
    return raw


def user_args(change: dict[str, object], folder: Path) -> list[str]:
    """What the user types: tiny.yaml and --config arguments, one per top-level key (e.g.
    `train={lr: 0.004}`); a change that deletes a key (which --config cannot) edits a copy of the file."""
    if any(value is REMOVE for value in change.values()):
        edited = folder / f"{len(list(folder.iterdir()))}.yaml"
        edited.write_text(yaml.safe_dump(_edited(change)))
        return ["--configfile", str(edited)]
    tree: dict = {}
    for path, value in change.items():
        settings._put(tree, path, value)
    flow = [
        f"{key}={yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix('...').strip()}"
        for key, value in tree.items()
    ]
    return ["--configfile", str(TINY), "--config", *flow]


def apply(change: dict[str, object]) -> dict:
    return kiln_config.validate(_edited(change))


@pytest.fixture(scope="module")
def walk(finished_run, tmp_path_factory):
    """{leaf: (its change, the stages the table expects, the dry run's answer)} for every leaf, and
    {stage: the stages a forced rerun of it schedules} (what reads its outputs, transitively)."""
    workdir, run, _ = finished_run
    folder = tmp_path_factory.mktemp("changes")
    ranks = folder / "bytes.tiktoken"  # a .tiktoken ranks file: the 256 single bytes
    ranks.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    files = {
        "tokenizer": str(next((workdir / "results" / "data").glob("tokenizer-*")) / "tokenizer.json"),
        "ranks": str(ranks),
        "hf": str(run / "train" / "hf"),
        "mirror": str(tmp_path_factory.mktemp("mirror")),
    }
    base = kiln_config.resolve([TINY])
    base_args = ["-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "2"]
    plans = {}
    for path in settings.schema_leaves():
        change = changes(path, base, files)
        plans[path] = (change, user_args(change, folder))
    argv = [[*base_args, "--configfile", str(TINY), "--forcerun", stage] for stage in STAGES]
    argv += [[*base_args, *args] for _, args in plans.values()]
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "dry_runs.py")],
        input=json.dumps(argv),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    downstream = {stage: set(answer["rules"]) for stage, answer in zip(STAGES, answers)}
    out = {}
    for (path, (change, args)), answer in zip(plans.items(), answers[len(STAGES) :]):
        after = apply(change)
        # the stages whose OUTPUT leaves changed (a When tag can make an unchanged leaf one: a budget
        # makes smoke time a validation), and what reads their outputs
        rerun = set()
        for stage in STAGES:
            if settings.tracked(base, stage) != settings.tracked(after, stage):
                rerun |= downstream[stage]
        out[path] = (args, rerun, answer)
    return out, downstream


def test_every_setting_is_declared_with_its_stages_and_one_without_fails():
    settings.check_table()
    untagged = Leaf("train.new_knob", pydantic.Field(1), Declared(None))
    with pytest.raises(KilnError, match=r"train.new_knob: a setting declared without the stages it concerns"):
        settings.check_table(settings.schema_leaves() | {"train.new_knob": untagged})


def test_the_generated_files_are_current():
    assert (ROOT / "docs" / "settings.md").read_text(encoding="utf-8") == settings.markdown_table(), (
        "docs/settings.md is stale: python -m kiln.config settings > docs/settings.md"
    )
    assert schema.JSON_SCHEMA_PATH.read_text(encoding="utf-8") == schema.json_schema_text(), (
        "workflow/schemas/config.schema.json is stale: python -m kiln.config schema > workflow/schemas/config.schema.json"
    )


def test_a_forced_stage_reruns_what_reads_it(walk):
    _, downstream = walk
    assert downstream["download"] == set(STAGES)
    assert downstream["plan"] == {"plan", "report"}  # train does not read the prices
    assert downstream["train"] == {"train", "eval", "report"}
    assert downstream["eval"] == {"eval", "report"}
    assert downstream["eval_data"] == {"eval_data", "eval", "report"}  # no model, so nothing before it


@pytest.mark.parametrize("path", list(settings.schema_leaves()))
def test_changing_a_setting_schedules_exactly_the_stages_its_tag_names(walk, path):
    """A user changes one setting (`--config section={key: value}`) on a finished run and dry-runs."""
    out, _ = walk
    args, expected, answer = out[path]
    assert answer["ok"], f"snakemake -n {' '.join(args)} failed:\n{answer['tail']}"
    assert set(answer["rules"]) == expected, " ".join(args)
    if path in BY_HAND:
        assert expected == BY_HAND[path]


def test_a_condition_makes_a_setting_rerun_its_stage():
    """The When tags, on the params the rules get: a Muon setting reruns train only under Muon, a
    cadence only under a budget, a price only under a budget in dollars, the micro-batch only when
    it is the global batch."""
    base = yaml.safe_load(TINY.read_text())

    def rerun(before: dict, leaf_change: dict) -> set[str]:
        after = copy.deepcopy(before)
        for path, value in leaf_change.items():
            settings._put(after, path, value)
        a, b = kiln_config.validate(before), kiln_config.validate(after)
        return {stage for stage in STAGES if settings.tracked(a, stage) != settings.tracked(b, stage)}

    muon = copy.deepcopy(base)
    muon["train"]["optimizer"] = "muon"
    assert rerun(base, {"train.muon_lr": 0.03}) == set()
    assert rerun(muon, {"train.muon_lr": 0.03}) == {"smoke", "train"}
    budget = copy.deepcopy(base)
    budget["train"]["budget"] = {"minutes": 5}
    assert rerun(base, {"train.eval_every": 40}) == {"plan"}
    assert rerun(budget, {"train.eval_every": 40}) == {"plan", "train"}
    dollars = copy.deepcopy(base)
    dollars["train"]["budget"], dollars["smoke"]["price_per_gpu_hour"] = {"dollars": 1}, 3.0
    assert rerun(dollars, {"smoke.price_per_gpu_hour": 2.0}) == {"plan", "train"}
    per_rank = copy.deepcopy(base)
    per_rank["train"]["batch_tokens"] = None
    assert rerun(per_rank, {"train.micro_batch": 8}) == {"smoke", "train", "report"}


def test_a_stage_gets_its_sections_whole_from_the_two_params():
    cfg = kiln_config.resolve([TINY])
    for stage in STAGES:
        tracked = json.loads(settings.tracked(cfg, stage))
        rest = json.loads(str(settings.untracked(cfg, stage)))
        assert settings.join(tracked, rest) == {name: cfg[name] for name in settings.sections(stage)}
    assert "log_every" not in json.loads(settings.tracked(cfg, "train"))["train"]
    assert json.loads(str(settings.untracked(cfg, "train")))["train"]["log_every"] == 10


def test_the_model_seed_leaves_the_data_keys_and_the_shipped_keys_stay():
    """A seed study shares its data: train.seed moves no data key. And the keys of configs written
    before the tags are what they were (each RUN leaf is held at its default in the key)."""
    from kiln.layout import DATA_STAGES, data_key

    base = kiln_config.resolve([TINY])
    reseeded = kiln_config.resolve([TINY], {"train": {"seed": 99}})
    retried = kiln_config.resolve([TINY], {"download": {"retries": 9}})
    assert {s: data_key(base, s) for s in DATA_STAGES} == {s: data_key(reseeded, s) for s in DATA_STAGES}
    assert {s: data_key(base, s) for s in DATA_STAGES} == {s: data_key(retried, s) for s in DATA_STAGES}
    assert data_key(kiln_config.resolve([TINY], {"seed": 8}), "tokenizer") != data_key(base, "tokenizer")


def test_run_tags_are_only_for_stages_that_read_the_setting():
    """A RUN tag must name a stage that reads the key, not stand for 'nothing' (which is no entry)."""
    for path, setting in SETTINGS.items():
        for stage, tag in setting.stages.items():
            assert tag in (OUTPUT, RUN) or isinstance(tag, settings.When), (path, stage, tag)
