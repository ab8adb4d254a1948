"""kiln.config.settings against the schema and against Snakemake: every leaf of the schema has a tag, and
changing one on a finished tiny run schedules exactly the stages its tag names and what reads their
outputs, in a real dry run (the changes: tests/setting_changes.py). That each tag is what its stage
does with the setting is proven by running the stages (tests/dag/test_tags.py)."""

import copy
import json
import subprocess
import sys

import pydantic
import pytest
import yaml
from setting_changes import apply, change_files, changes, user_args
from tiny import ROOT, TINY

from kiln import config as kiln_config
from kiln.config import schema, settings
from kiln.config.declare import Declared
from kiln.config.schema import Leaf
from kiln.config.settings import OUTPUT, RUN, SETTINGS, STAGES
from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.errors import KilnError

# The cases the issue names, by hand, beside what the table derives: a presentation setting reruns
# nothing, a price only the plan, eval settings eval, the model seed the run but not its data.
RUN_STAGES = {"smoke", "plan", "train", "eval", "report"}
BY_HAND = {
    "train.log_every": set(),
    "train.keep_checkpoints": {"plan", "report"},  # the plan's disk figure; no training
    "train.checkpoint_mirror": set(),
    "train.collective_timeout_s": set(),
    "train.max_resubmits": set(),
    "train.micro_batch": {"rehearse"},  # at an equal global batch: only the rehearsal's memory
    "train.nproc_per_node": {"rehearse"},
    "wandb.mode": set(),
    "smoke.price_per_gpu_hour": {"plan", "report"},
    "train.samples.prompts": {"eval", "report"},
    "eval.max_batches": {"eval_data", "eval", "report"},  # the unigram baseline reads the same batches
    "eval.infill_docs": {"eval_data", "eval", "report"},  # the problems are made beside training
    "eval.reference": {"report"},
    "train.lr": RUN_STAGES,
    "train.seed": RUN_STAGES,
    "seed": {"tokenizer", "pretokenize", "shard", "eval_data"} | RUN_STAGES,
    "tokenizer.vocab_size": {"tokenizer", "pretokenize", "shard", "eval_data", "rehearse"} | RUN_STAGES,
    "plan.gpu": {"rehearse"},  # the card it must fit; `kiln plan` prices it before anything runs
}


@pytest.fixture(scope="module")
def walk(finished_run, tmp_path_factory):
    """{leaf: (its change, the stages the table expects, the dry run's answer)} for every leaf, and
    {stage: the stages a forced rerun of it schedules} (what reads its outputs, transitively)."""
    workdir, run, _ = finished_run
    folder = tmp_path_factory.mktemp("changes")
    files = change_files(workdir, run, folder)
    base = kiln_config.resolve([TINY])
    base_args = ["-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "2"]
    plans = {}
    for path in settings.schema_leaves():
        change = changes(path, base, files)
        plans[path] = (change, user_args(change, folder, TINY))
    argv = [[*base_args, "--configfile", str(TINY), "--forcerun", stage] for stage in STAGES]
    argv += [[*base_args, *args] for _, args in plans.values()]
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "snakemake_batch.py")],
        input="".join(json.dumps([*a, "--dry-run"]) + "\n" for a in argv),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    downstream = {stage: set(answer["rules"]) for stage, answer in zip(STAGES, answers)}
    out = {}
    for (path, (change, args)), answer in zip(plans.items(), answers[len(STAGES) :]):
        after = apply(change, TINY)
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
    assert downstream["download"] == set(STAGES) - {"rehearse"}  # the rehearsal reads the config alone
    assert downstream["rehearse"] == {"rehearse"}  # smoke waits for it, but a rehearsal redone reruns no smoke
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


def rerun(before: dict, leaf_change: dict) -> set[str]:
    """The stages whose params (kiln.config.settings.tracked) change when `leaf_change` ({dotted path:
    value}) is made to the run file `before`."""
    after = copy.deepcopy(before)
    for path, value in leaf_change.items():
        settings._put(after, path, value)
    a, b = kiln_config.validate(before), kiln_config.validate(after)
    return {stage for stage in STAGES if settings.tracked(a, stage) != settings.tracked(b, stage)}


def test_a_condition_makes_a_setting_rerun_its_stage():
    """The When tags, on the params the rules get: a Muon setting reruns train only under Muon, a
    cadence only under a budget, a price only under a budget in dollars, the micro-batch only when
    it is the global batch (the rehearsal's memory always), the compile decision only where the
    rehearsal's GPU would not compile."""
    base = yaml.safe_load(TINY.read_text())
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
    assert rerun(per_rank, {"train.micro_batch": 8}) == {"smoke", "train", "report", "rehearse"}
    # auto and true compile alike on the GPU the rehearsal takes; false is another step
    assert rerun(base, {"train.compile": True}) == set()
    assert rerun(base, {"train.compile": False}) == {"rehearse"}


def test_where_and_when_a_reference_was_measured_rerun_the_report_alone():
    """eval.reference is one leaf, report=OUTPUT: its measured_on and date, like its figure, are in
    the report rule's params and no other stage's (the walk above dry-runs the leaf set to null)."""
    base = yaml.safe_load(TINY.read_text())
    assert rerun(base, {"eval.reference.measured_on": "another machine"}) == {"report"}
    assert rerun(base, {"eval.reference.date": "2027-01-01"}) == {"report"}
    assert rerun(base, {"eval.reference.val_loss": 4.5}) == {"report"}


def test_a_stage_gets_its_sections_whole_from_the_two_params():
    cfg = kiln_config.resolve([TINY])
    for stage in STAGES:
        tracked = json.loads(settings.tracked(cfg, stage))
        tracked.pop(settings.DERIVED, None)  # not a section (the rehearsal's eval batches): kiln.stage.config_of
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


def test_an_hf_tokenizer_derives_the_roles_its_run_uses_and_a_trained_one_nothing():
    """Which roles an hf source's tokenizer holds follows pretokenize (kiln.config.settings.derived): FIM on
    and off give its tokenizer stage other params and other data keys, so Snakemake reruns it and the
    runs share no tokenizer; a trained BPE, which holds every role, keeps its params and keys."""
    from kiln.layout import data_key

    trained = kiln_config.resolve([TINY])
    trained_off = kiln_config.resolve([TINY], {"pretokenize": {"fim": {"rate": 0}}})
    assert settings.tracked(trained, "tokenizer") == settings.tracked(trained_off, "tokenizer")
    assert data_key(trained, "tokenizer") == data_key(trained_off, "tokenizer")
    assert settings.DERIVED not in json.loads(settings.tracked(trained, "tokenizer"))
    on = copy.deepcopy(trained)
    on["tokenizer"] = {"kind": "hf", "path": "sources/model", "heldout_docs": 5}
    off = copy.deepcopy(on)
    off["pretokenize"]["fim"]["rate"] = 0
    repo = copy.deepcopy(off)
    repo["pretokenize"]["repo_context"] = True
    assert settings.derived(on, "tokenizer") == {"roles": list(SPECIAL_TOKENS[:5])}
    assert settings.derived(off, "tokenizer") == {"roles": [SPECIAL_TOKENS[0]]}
    assert settings.derived(repo, "tokenizer") == {"roles": [SPECIAL_TOKENS[0], *SPECIAL_TOKENS[5:]]}
    assert json.loads(settings.tracked(off, "tokenizer"))[settings.DERIVED] == settings.derived(off, "tokenizer")
    assert len({settings.tracked(c, "tokenizer") for c in (on, off, repo)}) == 3
    assert len({data_key(c, stage) for c in (on, off, repo) for stage in ("tokenizer", "shard")}) == 6
    assert data_key(on, "download") == data_key(off, "download")
    # the rehearsal sizes the embedding by the same roles (and rehearses the eval batches on, whatever
    # the tokenizer: test_the_rehearsal_derives_the_eval_batches_on); no other stage derives anything
    assert settings.derived(on, "rehearse")["roles"] == settings.derived(on, "tokenizer")["roles"]
    assert "roles" not in settings.derived(trained, "rehearse")
    assert all(settings.derived(on, stage) == {} for stage in STAGES if stage not in ("tokenizer", "rehearse"))


def test_the_rehearsal_derives_the_eval_batches_on_and_reruns_when_one_is_switched():
    """The eval stage's batches the whole config turns on (kiln.config.eval_switches), in the rehearse
    stage's params for every config: a batch turned on or off reruns the rehearsal (and what the setting
    tags), a batch resized does not. Infilling follows pretokenize.fim.rate and train.init_from, which the
    rehearse stage does not read (tests/dag/test_rehearse_rule.py runs the rule)."""
    base = yaml.safe_load(TINY.read_text())
    tiny = kiln_config.validate(base)
    every = ["held_out", "infilling", "lm_eval", "humaneval", "humaneval_infill"]
    assert settings.derived(tiny, "rehearse") == {"eval_batches_on": every}
    assert json.loads(settings.tracked(tiny, "rehearse"))[settings.DERIVED] == {"eval_batches_on": every}
    assert rerun(base, {"eval.lm_eval.tasks": []}) == {"eval_data", "eval", "rehearse"}
    assert rerun(base, {"eval.humaneval.problems": 0}) == {"eval", "rehearse"}
    assert rerun(base, {"eval.humaneval.problems": 2}) == {"eval"}
    assert rerun(base, {"eval.infill_docs": 0}) == {"eval_data", "rehearse"}  # eval reads what eval_data made
    assert rerun(base, {"eval.infill_docs": 5}) == {"eval_data"}
    assert "rehearse" in rerun(base, {"pretokenize.fim.rate": 0})
    assert "rehearse" not in rerun(base, {"pretokenize.fim.rate": 0.4})
    prose = copy.deepcopy(base)
    prose["pretokenize"]["fim"] = {"rate": 0}
    assert settings.derived(kiln_config.validate(prose), "rehearse") == {
        "eval_batches_on": ["held_out", "lm_eval", "humaneval"]
    }
    # from a checkpoint, which may have seen FIM: the eval stage measures infilling (kiln.eval.infill.not_run_reason)
    assert "rehearse" in rerun(
        prose, {"train.init_from": {"checkpoint": "results/prose/train/checkpoints/step-0000100"}}
    )
