"""Each setting's tag, proven by running its stages (issue 43, item 2).

A tag (kiln.config.declare) says what a setting means to each stage that reads it: OUTPUT, it changes
what the stage writes, so Snakemake reruns the stage for it; RUN, it changes only how the stage runs,
so a change reruns nothing. tests/dag/test_settings.py checks Snakemake schedules what the tags say;
this checks the tags say what the stages do. For every setting, on a finished run of
tests/configs/tags.yaml (the leanest whole run), the user's change (tests/setting_changes.py, or LEAN
where that cannot show on so small a run) is run as the user runs it, `snakemake --config ...`, to
the stages that read it, and what each writes (its declared outputs, kiln.layout) is compared with
the finished run's:

- OUTPUT: different. The stage is not forced: Snakemake reruns it from the rule's params, or the tag
  is not doing its work. A stage below another that the setting reruns gets new inputs anyway, so its
  own tag adds nothing and it is not run; except train, which resumes a finished run whose
  fingerprint (its OUTPUT settings) matches, so its own tag decides what a change trains.
- RUN: equal, byte for byte, tensor for tensor, with the stage forced (train: from step 0). Where
  only floating-point rounding may differ (TOLERANT), within a tolerance; where the stage's account
  of its work records the setting (RECORDED), less those places, each with why.
- What differs between two runs of one config (wall times, throughput, peak memory) is left out of
  every comparison: `noise`, measured by running every stage twice.

A setting that acts only beside another (CONTEXT) runs on the finished run with that other made. One
whose change cannot show in a stage on a run this small is in AT_SCALE with why, and what the stage
writes must come out equal (so the entry goes when it shows). One a single machine cannot change (the
nodes, a GPU) is in ELSEWHERE with the test that covers it. Jobs start warm (tests/warm_python.py) and
Snakemake runs in one process (tests/snakemake_batch.py): ~150 runs of the stages would otherwise
spend most of their time importing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import warm_python
from setting_changes import REMOVE, apply, change_files, changes, filled, user_args
from stage_outputs import differences, noise, written
from tiny import ROOT, VENV_BIN

from kiln import config as kiln_config
from kiln.config.models import RECIPE_OPTIONS
from kiln.config.settings import OUTPUT, RUN, SETTINGS, STAGES, effect
from kiln.io import read_json
from kiln.layout import BY_NAME, SCATTER_JOBS, Layout

pytestmark = [pytest.mark.slow, pytest.mark.tags]  # its own lane in make test, beside the rest of the dag lane

CONFIG = ROOT / "tests" / "configs" / "tags.yaml"

# Where tests/setting_changes.py's change cannot show on this run (its few documents, 12 steps of
# 8 rows of 32 tokens), one that can: a document-size limit some files cross, FIM rates far enough
# apart that some of the ~25 documents draw differently, a checkpoint milestone that falls on a step.
LEAN = {
    "download.sources": {"download.sources": [{"name": "stdlib", "kind": "stdlib", "include": ["json/*.py"]}]},
    "download.min_doc_bytes": {"download.min_doc_bytes": 5_000},
    "download.max_doc_bytes": {"download.max_doc_bytes": 20_000},
    "tokenizer.kind": {"tokenizer.kind": "tiktoken", "tokenizer.path": "{ranks}", "tokenizer.vocab_size": REMOVE},
    "tokenizer.train_bytes": {"tokenizer.train_bytes": 20_000},
    "pretokenize.fim.rate": {"pretokenize.fim.rate": 0.1},
    "pretokenize.fim.psm": {"pretokenize.fim.psm": 0.1, "pretokenize.fim.spm": 0.65},
    "pretokenize.fim.spm": {"pretokenize.fim.spm": 0.7, "pretokenize.fim.psm": 0.05},
    "pretokenize.fim.middle_only": {"pretokenize.fim.middle_only": 0.7, "pretokenize.fim.psm": 0.05},
    "pretokenize.fim.min_chars": {"pretokenize.fim.min_chars": 5_000},
    "model.d_ff": {"model.d_ff": 64},
    "model.bias": {"model.bias": True},
    "smoke.min_loss_drop": {"smoke.min_loss_drop": 0.01},
    "smoke.max_data_wait": {"smoke.max_data_wait": 0.99},
    "train.micro_batch": {"train.micro_batch": 4},
    "tokenizer.vocab_size": {"tokenizer.vocab_size": 384},  # 301 pads to 300's 320 embedding rows
    "train.nproc_per_node": {"train.nproc_per_node": 2, "train.micro_batch": 4},
    "train.muon_weight_decay": {"train.muon_weight_decay": 0.1},
    "train.keep_checkpoints": {"train.keep_checkpoints": 1},
    "train.keep_checkpoint_every": {"train.keep_checkpoint_every": 6},
    "pretokenize.encoder": {"pretokenize.encoder": "tokenizers"},  # auto is tiktoken's here
    "train.precision": {"train.precision": "bf16"},  # auto times both, and may pick fp32 here
    "eval.lm_eval.limit": {"eval.lm_eval.limit": 1},
    "eval.lm_eval.max_docs": {"eval.lm_eval.max_docs": 1},
    "eval.reference": {
        "eval.reference": {"val_loss": 4.0, "source": "a round figure", "measured_on": "nowhere", "date": "2026-12"}
    },
    "eval.infill_docs": {"eval.infill_docs": 1},
    "eval.in_loop.every": {"eval.in_loop.every": 6},  # tags.yaml's eval_every
    # the finished run's own checkpoint: an export's tokenizer file is not the shards' (hf needs its own)
    "train.init_from": {"train.init_from": {"checkpoint": "{checkpoint}"}},
}

# Settings that act only beside another: each is run on the finished run with that other setting
# made (the reference), then with itself changed too.
LM_EVAL = {"eval.lm_eval.tasks": ["kiln_heldout_next_line"]}  # one task: lm-eval takes seconds a task
CONTEXT = {
    "eval.lm_eval.limit": LM_EVAL,
    "eval.lm_eval.max_docs": LM_EVAL,
    "train.decay_fraction": {"train.schedule": "wsd"},
    "train.cooldown": {"train.schedule": "wsd"},
    # infilling is measured for a model trained without FIM if it started from another's weights
    "train.init_from": {"pretokenize.fim.rate": 0.0},
    "train.warmup_steps": {"smoke.steps": 9},  # the probe warms up for at most a third of its steps
    "train.keep_checkpoint_every": {"train.keep_checkpoints": 1},  # a milestone beyond the newest kept
    "eval.in_loop.problems": {"eval.in_loop.every": 6},  # the in-loop eval's slice, with the eval on
    "eval.in_loop.max_new_tokens": {"eval.in_loop.every": 6},
    "train.fsdp_one_rank": {"train.parallel": "fsdp"},  # the plain rank under fsdp: sharded checkpoints too
    **{f"model.{option}": {"model.family": "llama"} for option in RECIPE_OPTIONS},  # llama builds them
    # read to run by the rehearsal, and their changes make the family that takes them (SPECIAL)
    "model.rope_theta": {"model.family": "llama"},
    "model.rope_scaling": {"model.family": "llama"},
    "model.sliding_window": {"model.family": "starcoder2"},
    "train.normuon": {"train.optimizer": "muon"},
}

# Read to run, but the arithmetic's order moves with it: weights, losses and the numbers in a report
# agree to TOLERANCE (relative and absolute).
TOLERANT = {
    "train.micro_batch": "gradient accumulation sums the same rows in another order",
    "train.nproc_per_node": "the ranks' gradients are averaged in another order",
    "train.compile": "compiled kernels fuse and round otherwise",
}
TOLERANCE = 1e-4

# Where a read-to-run change shows in a stage's account of its work, and why that is not its work.
PROBE_ROWS = "the smoke probe measures its checks on its first micro-batches: another micro-batch measures other rows"
RECORDED = {
    "train.micro_batch": (
        ("report.json.batch.", "report.json.checks[", "report.json.val_loss", "report.md:4"),
        PROBE_ROWS,
    ),
    "train.nproc_per_node": (
        (
            "report.json.batch.",
            "report.json.world",
            "report.json.checks[",
            "report.json.val_loss",
            "report.json.checkpoint_written_bytes",
            "report.md:4",
        ),
        PROBE_ROWS + "; a checkpoint holds each rank's RNG and data position",
    ),
    "train.parallel": (("report.json.checkpoint_written_bytes",), "an FSDP checkpoint is written as shards"),
    "train.fsdp_one_rank": (
        ("report.json.checkpoint_written_bytes",),
        "DCP's metadata describes the parameters as DTensors of a 1-rank mesh",
    ),
    "train.compile": (
        ("report.json.checks[", "report.json.attention_kernel"),
        "the probe adds a check that the compiled step matches the eager one, and names the attention a CPU's "
        "compiled step writes out (kiln.model.sdpa.blockwise_causal)",
    ),
    "train.activation_checkpointing": (
        ("report.json.activation_checkpointing",),
        "the probe records the checkpointing it ran",
    ),
    "smoke.profile_step": (("report.json.probe.measured_steps",), "a profiled step is left out of the timed steps"),
    "eval.in_loop.every": (
        ("report.json.checks[sandbox]",),
        "with the in-loop eval on, the gate records the sandbox its programs will run in",
    ),
}

# A checkpoint holds the run's config, so its size moves with the config's text: a setting whose value
# is a longer string writes a checkpoint that many bytes larger (torch.save pads each record to 64
# bytes, so by 0 or 64 here). The smoke stage's timed checkpoint reports its size; within this many
# bytes it is the same checkpoint.
CHECKPOINT_BYTES = "report.json.checkpoint_written_bytes"
CONFIG_TEXT_BYTES = 256

# Settings a run on one machine here cannot change. Where each is proven instead.
ELSEWHERE = {
    "train.nnodes": "tests/slurm/test_pipeline_on_slurm.py: two nodes train the loss curve of two ranks on one",
    "train.node_rank": "tests/process/test_launch.py starts each node's torchrun with its rank",
    "train.device": "cuda needs a GPU: bench/gpu_check runs the stages on one (docs/benchmarks.md)",
    "tokenizer.encoding": "tiktoken's named encodings are downloaded (no network here): tokenizer.path's ranks are tested",
    "eval.humaneval.samples_share": "acts on a GPU (samples: auto): tests/unit/eval/test_sizes.py prices its choice",
}

# Reruns its stage, but a run this small cannot show it: its outputs come out equal, and the test
# checks they do (an entry goes when its setting starts to show).
AT_SCALE = {
    ("model.document_mask", "smoke"): "the smoke probe's rows of 32 tokens here hold no end of a document: "
    "its mask is the causal one (the train stage's rows show it)",
    **{
        ("run_name", stage): f"names the run's folder: {stage} writes the same into results/<the new name>/"
        for stage in ("smoke", "train", "eval_data")
    },
    (
        "download.invalid_utf8",
        "download",
    ): "the standard library's files are valid UTF-8: skip and fail read them alike",
    ("smoke.gate", "smoke"): "with every check passing, a gate off writes the same report (it lets a failed run train)",
    ("train.eval_every", "plan"): "moves only the plan's time figures (validations x their measured time), noise here",
    (
        "smoke.precision_steps",
        "smoke",
    ): "times each precision under train.precision auto: its measured speeds, noise here",
    ("train.budget", "train"): "binds only where it buys fewer steps than train.max_steps (12 take 0.03 s here)",
}


# Stages another waits for without reading what they write (an ancient input): smoke starts once the
# rehearsal has passed, and a rehearsal redone gives it no new inputs.
GATES = {"rehearse"}


def upstream(stage: str) -> set[str]:
    """The stages whose outputs `stage` reads, directly or through another (kiln.layout.Stage.needs)."""
    spec = BY_NAME[stage]
    direct = set(spec.needs if spec.needs is not None else STAGES[: STAGES.index(stage)]) - GATES
    return direct.union(*(upstream(s) for s in direct))


def jobs(stage: str) -> list[str]:
    """The rules that make `stage`'s outputs: a scattered stage's plan and part jobs, then its own."""
    return [*SCATTER_JOBS.get(stage, ()), stage]


@dataclass
class Finished:
    """The finished run every change starts from, and what runs the changes."""

    workdir: Path
    cfg: dict
    files: dict[str, str]
    folder: Path
    noise: dict[str, set[str]]
    batch: subprocess.Popen
    trained_again: bool = False  # the second run's forced train trained (its summary's speed is new)

    def snakemake(self, workdir: Path, *args: str) -> dict:
        argv = ["-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "2", *args]
        self.batch.stdin.write(json.dumps(argv) + "\n")
        self.batch.stdin.flush()
        return json.loads(self.batch.stdout.readline())

    def written(self, workdir: Path, cfg: dict, stage: str) -> dict:
        return written(workdir / "results", cfg, stage)


def _start_warm_python(folder: Path) -> tuple[subprocess.Popen, str]:
    """The warm interpreter's server, and a PATH with its shim first."""
    server, shim_bin = warm_python.start(folder)
    return server, os.pathsep.join([str(shim_bin), VENV_BIN, os.environ.get("PATH", "")])


def _log_tails(workdir: Path, cfg: dict, stages: list[str]) -> str:
    """The end of each stage's log, for a failure's message."""
    layout = Layout(cfg, root=workdir / "results")
    logs = [Path(layout.log(stage)) for stage in stages]
    return "\n".join(f"--- {log}\n{log.read_text()[-1500:]}" for log in logs if log.is_file())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tags")
    server, path = _start_warm_python(folder)
    batch = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "snakemake_batch.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PATH=path),
    )
    try:
        workdir = folder / "base"
        cfg = kiln_config.resolve([CONFIG])
        run = Finished(workdir, cfg, {}, folder, {}, batch)
        answer = run.snakemake(workdir, "--configfile", str(CONFIG))
        assert answer["ok"], answer["tail"]
        run.files = change_files(workdir, workdir / "results" / cfg["run_name"], folder)
        again = folder / "again"
        shutil.copytree(workdir, again, symlinks=True)
        forced = [job for stage in STAGES for job in jobs(stage)]
        answer = run.snakemake(again, "--configfile", str(CONFIG), "--forcerun", *forced)
        assert answer["ok"], answer["tail"]
        assert set(answer["rules"]) == set(STAGES)
        run.noise = {s: noise(s, run.written(workdir, cfg, s), run.written(again, cfg, s)) for s in STAGES}
        summaries = [
            read_json(Layout(cfg, root=w / "results").output("train", "summary.json")) for w in (workdir, again)
        ]
        run.trained_again = summaries[0]["tokens_per_s"] != summaries[1]["tokens_per_s"]
        yield run
    finally:
        batch.stdin.close()
        batch.wait(timeout=60)
        os.killpg(server.pid, 9)
        server.wait()


# What two runs of one config may disagree on: the measurements, and the figures made from them.
MEASURED = ("_s", "_mb", "_per_rank", "tflops", "fraction", "eta_h", "device_hours", "figure", "mfu")
PLOTTED = ("loss.png",)  # its throughput panel


def test_two_runs_of_one_config_differ_only_in_measurements(finished):
    """The noise left out of the comparisons is time, throughput and memory (a stage that wrote anything
    else differently twice would hide a setting's effect there); and a forced train trains again, even
    with the smoke stage above it forced too (it once kept the finished run's weights and summary)."""
    for stage in ("download", "tokenizer", "pretokenize", "shard", "eval_data", "eval"):
        assert not finished.noise[stage], (stage, finished.noise[stage])
    assert finished.trained_again
    unexplained = [
        place
        for places in finished.noise.values()
        for place in places
        if not (place.endswith(PLOTTED) or ".md:" in place or place.rsplit(".", 1)[-1].endswith(MEASURED))
    ]
    assert not unexplained


def test_the_settings_no_stage_reads_are_those_kiln_plan_reads():
    """A setting with no stage is read by `kiln plan` alone (its figures before anything runs)."""
    assert [path for path, reads in SETTINGS.items() if not reads.stages] == ["plan.mfu"]
    assert dict(SETTINGS["plan.gpu"].stages) == {"rehearse": OUTPUT}  # the card the rehearsal fits


@pytest.mark.parametrize("path", [path for path, reads in SETTINGS.items() if reads.stages and path not in ELSEWHERE])
def test_a_setting_changes_what_its_tag_says_it_does(finished, path):
    context = {key: filled(value, finished.files) for key, value in CONTEXT.get(path, {}).items()}
    before = apply(context, CONFIG) if context else finished.cfg
    change = {key: filled(value, finished.files) for key, value in LEAN.get(path, {}).items()}
    change = change or changes(path, before, finished.files)
    after = apply(context | change, CONFIG)
    assert after != before, f"{path}: {change} changes nothing in {CONFIG.name}"
    tags = {stage: effect(path, stage, after) for stage in SETTINGS[path].stages}
    reruns = {stage for stage, tag in tags.items() if tag == OUTPUT}
    # The stages whose inputs the change leaves alone: there a difference is the stage's own doing. And
    # train whenever it reads the setting: new inputs rerun it, but it resumes a finished run whose
    # fingerprint (its OUTPUT settings, kiln.train.fingerprint) matches, so its own tag decides what
    # a change trains (read to run, it is forced, and must train the same weights from step 0).
    run = [s for s in STAGES if s in tags and (not upstream(s) & reruns or s == "train")]
    read_to_run = [stage for stage in run if tags[stage] == RUN]
    workdir = finished.folder / path
    shutil.copytree(finished.workdir, workdir, symlinks=True)
    if context:
        _run(finished, workdir, context, before, run, forced=run)
        reference = {stage: finished.written(workdir, before, stage) for stage in run}
    else:
        reference = {stage: finished.written(finished.workdir, before, stage) for stage in run}
    started = time.monotonic()
    _run(finished, workdir, context | change, after, run, forced=read_to_run)
    recorded = RECORDED.get(path, ((), ""))[0]
    wrong = []
    after_written = {stage: finished.written(workdir, after, stage) for stage in run}
    for stage in run:
        found = differences(
            reference[stage],
            after_written[stage],
            finished.noise[stage],
            TOLERANCE if stage in read_to_run and path in TOLERANT else 0.0,
        )
        if stage in read_to_run:
            found = [place for place in found if not place.startswith(recorded)]
        if CHECKPOINT_BYTES in found:
            sizes = [written.get(CHECKPOINT_BYTES) or 0 for written in (reference[stage], after_written[stage])]
            if abs(sizes[0] - sizes[1]) <= CONFIG_TEXT_BYTES:
                found.remove(CHECKPOINT_BYTES)
        at_scale = (path, stage) in AT_SCALE
        if stage not in read_to_run and not at_scale and not found:
            wrong.append(f"{stage}: tagged to rerun, but writes the same with {change}")
        if (stage in read_to_run or at_scale) and found:
            wrong.append(f"{stage}: tagged read-to-run, but writes otherwise with {change}: {found[:5]}")
    assert not wrong, f"{path} ({time.monotonic() - started:.1f} s; in {workdir}): " + "; ".join(wrong)
    shutil.rmtree(workdir)  # a failure's folder stays, to look into


def _run(finished: Finished, workdir: Path, change: dict, cfg: dict, stages: list[str], forced: list[str]) -> None:
    """`snakemake --configfile tags.yaml --config <change>`, as the user types it, run to `stages` (to
    the last of them: Snakemake 9 stops half-way through `--forcerun smoke train --until smoke train`,
    "BUG: Out of jobs ready to be started"), the `forced` ones forced: the others rerun, or not, as
    Snakemake decides from the rules' params, which is what a tag to rerun is for."""
    args = user_args(change, finished.folder, CONFIG)
    last = [stage for stage in stages if not any(stage in upstream(other) for other in stages)]
    force = ["--forcerun", *(job for stage in forced for job in jobs(stage))] if forced else []
    answer = finished.snakemake(workdir, *args, *force, "--until", *last)
    assert answer["ok"], f"snakemake {' '.join(args)}:\n{answer['tail']}\n{_log_tails(workdir, cfg, stages)}"
