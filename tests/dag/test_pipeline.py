"""The whole DAG as a user runs it: subprocess Snakemake on the tiny config in a temporary folder."""

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tiny import ROOT, TINY, VENV_BIN, snakemake, tiny_layout

from kiln import config as kiln_config
from kiln.config.train_sections import TrainSection
from kiln.data.sources import raw_part_count
from kiln.layout import STAGE_OF_JOB, ScatterPlan
from kiln.plan.steps import StageTimes, steps_within
from kiln.train.device import cpu_bf16_emulated
from kiln.train.schedule import Replanned


def planned_rules(result: subprocess.CompletedProcess) -> set[str]:
    """The rules Snakemake planned (a dry run) or ran (it logs them on stderr then)."""
    found = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", result.stdout + result.stderr, flags=re.M)
    return {STAGE_OF_JOB.get(rule, rule) for rule in found} - {"all"}  # a scattered stage's jobs count as it


def test_pretokenize_ran_one_job_per_raw_part_and_wrote_the_bytes_of_one_job(finished_run, tmp_path):
    """Issue 31, item 5: the workflow's pretokenize is one pretokenize_part job per raw part and a
    gather; the stage script run by hand as one job on the same inputs writes the same bytes."""
    workdir, _, _ = finished_run
    paths = tiny_layout(workdir)
    parts = raw_part_count(paths.folder("download"))
    assert parts >= 2
    assert [Path(paths.log("pretokenize", "pretokenize_part", part=i)).is_file() for i in range(parts)] == [
        True
    ] * parts
    assert not Path(paths.part("pretokenize", 0)).parent.exists()  # temporary: deleted once gathered
    one_job = tmp_path / "tokens"
    argv = [f"{VENV_BIN}/python", str(ROOT / "workflow" / "scripts" / "pretokenize.py"), "--config", str(TINY)]
    argv += ["--raw", str(paths.folder("download")), "--tokenizer", paths.output("tokenizer", "tokenizer.json")]
    result = subprocess.run(
        [*argv, "--out", str(one_job), "--workers", "2"], cwd=workdir, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = paths.folder("pretokenize")
    assert sorted(p.name for p in one_job.iterdir()) == sorted(p.name for p in gathered.glob("[!.]*"))
    for name in ("train.bin", "val.bin", "val_ids.txt", "meta.json"):
        assert (one_job / name).read_bytes() == (gathered / name).read_bytes(), name


def test_download_ran_one_job_per_share_of_the_files_and_wrote_the_bytes_of_one_job(finished_run, tmp_path):
    """Issue 31, item 5: the workflow's download is a plan, one download_part job per share of the
    input files (tiny.yaml: 0.5 MB each) and a gather; the stage script run by hand as one job (no
    --plan) writes the same bytes, manifest included."""
    workdir, _, _ = finished_run
    paths = tiny_layout(workdir)
    plan = ScatterPlan.load(Path(paths.scatter_plan("download")))
    assert plan.parts >= 2
    assert all(Path(paths.log("download", "download_part", part=i)).is_file() for i in range(plan.parts))
    assert not Path(paths.part("download", 0)).parent.exists()  # temporary: deleted once gathered
    one_job = tmp_path / "raw"
    script = ROOT / "workflow" / "scripts" / "download.py"
    argv = [f"{VENV_BIN}/python", str(script), "--config", str(TINY), "--out", str(one_job)]
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = paths.folder("download")
    mine = sorted(p.relative_to(one_job) for p in one_job.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(gathered) for p in gathered.rglob("[!.]*") if p.is_file())  # not Snakemake's
    assert mine == theirs
    assert len(mine) >= 3  # the manifest and two parts at least
    for name in mine:
        assert (one_job / name).read_bytes() == (gathered / name).read_bytes(), name


def test_until_a_scattered_stage_builds_it_from_an_empty_folder(tmp_path):
    """`--until pretokenize` (README) runs the plan, the part jobs and the gather: snakemake issue 2824
    would stop it after the plan, the checkpoint (worked around in workflow/rules/common.smk)."""
    result = snakemake(tmp_path, "--configfile", str(TINY), "--until", "pretokenize")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tiny_layout(tmp_path).folder("pretokenize") / "meta.json").is_file(), result.stderr[-3000:]
    assert not tiny_layout(tmp_path).folder("shard").exists()


def test_every_artifact_is_there(finished_run):
    workdir, run, _ = finished_run
    paths = tiny_layout(workdir)
    data = {stage: paths.folder(stage) for stage in ("download", "tokenizer", "pretokenize", "shard")}
    assert all(folder.parent == workdir / "results" / "data" for folder in data.values())
    shared = [
        data["download"] / "manifest.json",
        data["download"] / "stdlib" / "part-00000.parquet",
        data["tokenizer"] / "tokenizer.json",
        data["tokenizer"] / "stats.json",
        *(data["pretokenize"] / name for name in ("train.bin", "val.bin", "val_ids.txt", "meta.json")),
        *(data["shard"] / name for name in ("manifest.json", "train-00000.bin", "val-00000.bin")),
    ]
    assert [p for p in shared if not p.is_file()] == []
    for stage in data:
        assert Path(paths.log(stage)).exists() and Path(paths.benchmark(stage)).exists()
    assert json.loads((run / "layout.json").read_text())["data"]["shard"] == f"data/{data['shard'].name}"
    expected = [
        "smoke/report.json",
        "smoke/plan.json",
        "smoke/plan.md",
        "train/samples.jsonl",
        "train/model.safetensors",
        "train/model_config.json",
        "train/metrics.jsonl",
        "train/summary.json",
        "train/checkpoints/LATEST",
        "train/hf/config.json",
        "train/hf/model.safetensors",
        "train/hf/tokenizer.json",
        "eval_data/eval_data.json",
        "eval_data/lm_eval_tasks/next_line.jsonl",
        "eval/metrics.json",
        "eval/samples.json",
        "report.md",
        "loss.png",
    ]
    missing = [p for p in expected if not (run / p).is_file()]
    assert not missing
    for stage in ("eval_data", "smoke", "train", "eval", "report"):
        assert (run / "logs" / f"{stage}.log").exists() and (run / "benchmarks" / f"{stage}.tsv").exists()
    assert not list((workdir / "results").rglob(".*.tmp-*")), "temporary files left behind"


def test_model_beats_the_unigram_baseline(finished_run):
    workdir, run, result = finished_run
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["val_loss"] < metrics["unigram_val_loss"] - 0.1
    smoke = json.loads((run / "smoke" / "report.json").read_text())
    assert smoke["gate"] == "passed" and [c["name"] for c in smoke["checks"] if c["passed"]] == [
        "preflight",
        "causality",
        "init loss",
        "health",
        "generalisation",
        "data",
        "tokens",
        "overfit",
    ]
    plan = json.loads((run / "smoke" / "plan.json").read_text())
    assert plan["total_tokens"] == 200 * 16 * 64 and plan["eta_s"] > 0 and plan["grad_accum"] == 1
    steps = [json.loads(line)["step"] for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 200
    samples = [json.loads(line) for line in (run / "train" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [50, 100, 150, 200] and {s["prompt"] for s in samples} == {"import json\n"}
    assert set(metrics["contamination"]) == {
        "val_documents",
        "infill_problems",
        "lm_eval kiln_heldout_perplexity",
        "lm_eval kiln_heldout_next_line",
    }
    assert {"stdlib"} == set(metrics["val_by_source"]) and [c["step"] for c in metrics["checkpoints"]] == [100, 200]
    # HumanEval-Infilling's every kind, as the default runs them (tiny.yaml: 2 tasks of each, psm)
    infill = metrics["code"]["humaneval_infill"]["kinds"]
    assert list(infill) == ["single_line", "multi_line", "random_span"]
    assert [(list(modes), modes["psm"]["tasks"]) for modes in infill.values()] == [(["psm"], 2)] * 3
    report = (run / "report.md").read_text()
    for kind, row in infill.items():
        assert f"| {kind} | psm | 2 of {row['psm']['made']} | {row['psm']['pass@1']['value']:.1%} [" in report
    for section in (
        "loss.png",
        "unigram",
        "## Smoke gate",
        "Attention: SDPA's ",  # tiny.yaml trains eager: SDPA's CPU kernel, named
        "Plan against the full run",
        "Samples during training",
        "### Per source",
        "### Checkpoints kept",
        "Reference, measured elsewhere: val loss 5 (a round figure",
        "## Cleaning (download)",
        "## Decontamination against the held-out split (pretokenize)",
    ):
        assert section in report, section
    tokens = json.loads((tiny_layout(workdir).folder("pretokenize") / "meta.json").read_text())
    assert f"{tokens['heldout_overlap']['docs']:,} train documents" in report  # what was left out, named
    assert "results/tiny/report.md" in result.stdout + result.stderr


def test_nothing_reruns_when_nothing_changed(finished_run):
    workdir, _, _ = finished_run
    result = snakemake(workdir, "--configfile", str(TINY), "-n")
    assert result.returncode == 0 and planned_rules(result) == set(), result.stdout


def test_a_training_change_reruns_training_stages_only(finished_run, tmp_path):
    workdir, _, _ = finished_run
    cfg = yaml.safe_load(TINY.read_text())
    cfg["train"]["lr"] = 0.004
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    result = snakemake(workdir, "--configfile", str(changed), "-n")
    assert result.returncode == 0, result.stderr
    assert planned_rules(result) == {"smoke", "plan", "train", "eval", "report"}


def test_a_log_setting_trains_nothing_and_leaves_the_weights_alone(finished_run, tmp_path):
    """The most common step of experimenting: a finished run, one presentation setting changed
    (train.log_every, kiln.config.settings tags it RUN), a real rerun. No job runs: the weights are the same
    bytes, train's log and metrics untouched, nothing set aside."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    train = copy / "results" / "tiny" / "train"
    before = {name: (train / name).read_bytes() for name in ("model.safetensors", "metrics.jsonl")}
    log_before = (copy / "results" / "tiny" / "logs" / "train.log").read_bytes()
    result = snakemake(copy, "--configfile", str(TINY), "--config", "train={log_every: 20}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert planned_rules(result) == set(), result.stdout + result.stderr
    assert {name: (train / name).read_bytes() for name in before} == before
    assert (copy / "results" / "tiny" / "logs" / "train.log").read_bytes() == log_before
    assert not (train / "superseded").exists()


def test_a_train_job_rerun_for_a_rewritten_input_trains_nothing(finished_run, tmp_path):
    """Snakemake reruns train whenever its inputs are rewritten: here the smoke stage, redone for a gate
    setting (smoke.steps). Nothing train trains on changed, so the job resumes the finished run at its
    last step: no training step, the weights and the summary the same bytes, nothing set aside."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    train = copy / "results" / "tiny" / "train"
    before = {name: (train / name).read_bytes() for name in ("model.safetensors", "summary.json", "metrics.jsonl")}
    result = snakemake(copy, "--configfile", str(TINY), "--config", "smoke={steps: 14}", "--until", "train")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert planned_rules(result) == {"smoke", "train"}
    log = (copy / "results" / "tiny" / "logs" / "train.log").read_text()
    assert "nothing to train, its weights and summary kept" in log and "starting from step 0" not in log
    assert {name: (train / name).read_bytes() for name in before} == before
    assert not (train / "superseded").exists()


def test_a_single_stage_can_be_targeted(finished_run):
    workdir, _, _ = finished_run
    by_rule = snakemake(workdir, "--configfile", str(TINY), "-n", "--forcerun", "shard", "--until", "shard")
    assert planned_rules(by_rule) == {"shard"}, by_rule.stdout
    stats = Path(tiny_layout(workdir).output("tokenizer", "stats.json")).relative_to(workdir)
    by_file = snakemake(workdir, "--configfile", str(TINY), "-n", "-f", str(stats))
    assert planned_rules(by_file) == {"tokenizer"}, by_file.stdout
    until = snakemake(workdir, "--configfile", str(TINY), "-n", "--forcerun", "train", "--until", "train")
    assert planned_rules(until) == {"train"}, until.stdout


def test_bad_config_fails_before_any_job(tmp_path):
    cfg = yaml.safe_load(TINY.read_text())
    cfg["train"]["lerning_rate"] = 0.1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    result = snakemake(tmp_path, "--configfile", str(bad))
    assert result.returncode != 0
    assert (
        "train.lerning_rate: unknown key (allowed: activation_checkpointing, async_checkpoint, batch_tokens,"
        in result.stdout + result.stderr
    )
    assert not (tmp_path / "results").exists()


def test_empty_corpus_fails_in_download(tmp_path):
    cfg = yaml.safe_load(TINY.read_text())
    cfg["download"]["sources"][0]["include"] = ["no_such_package/*.py"]
    bad = tmp_path / "empty.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    result = snakemake(tmp_path, "--configfile", str(bad))
    assert result.returncode != 0
    paths = tiny_layout(tmp_path, bad)
    log = Path(paths.log("download")).read_text()
    assert "source 'stdlib' (stdlib) produced no documents" in log
    assert not paths.folder("download").exists()


def test_lint_is_clean(tmp_path):
    result = snakemake(tmp_path, "--configfile", str(TINY), "--lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_snakemake_html_report(finished_run):
    workdir, _, _ = finished_run
    result = snakemake(workdir, "--configfile", str(TINY), "--report", "report.html")
    assert result.returncode == 0, result.stderr[-2000:]
    html = (workdir / "report.html").read_text(errors="replace")
    assert "loss.png" in html and "report.md" in html


def test_a_time_budget_becomes_the_steps_train_runs(finished_run, tmp_path):
    """The smoke stage times bf16 against fp32 (precision auto) and turns a budget of minutes into
    steps from the times it measured; train starts from those steps and re-plans them from its own
    speed (kiln.train.budget), every decision in train/budget.jsonl, its schedule decaying over the
    steps it ends at; the log steps carry bits per byte. On a copy of the finished run: only smoke and
    train rerun."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    result = snakemake(
        copy,
        "--until",
        "train",
        "plan",
        "--configfile",
        str(TINY),
        "--config",
        "train={budget: {minutes: 0.5}, max_steps: null, precision: auto}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # fp32 to auto reruns the rehearsal too (bf16 on its GPU), but not here: smoke does not read its
    # output (workflow/rules/smoke.smk), it rehearses the new settings itself before its probe
    assert planned_rules(result) == {"smoke", "plan", "train"}
    run = copy / "results" / "tiny"
    plan = json.loads((run / "smoke" / "plan.json").read_text())
    timed = plan["precision_tokens_per_s"]
    if cpu_bf16_emulated():  # this machine's branch: its flags decide, nothing is timed
        assert plan["precision"] == "fp32" and timed == {} and "nor AMX" in plan["precision_why"]
    else:
        assert set(timed) == {"bf16", "fp32"} and plan["precision"] == max(timed, key=timed.get)
    assert plan["budget"] == {"minutes": 0.5} and plan["budget_s"] == pytest.approx(30)
    steps = plan["max_steps"]
    assert steps == steps_within(30, StageTimes(**plan["stage_times"]), eval_every=50, checkpoint_every=100) > 5
    assert plan["stage_s"] <= plan["budget_s"] and plan["total_tokens"] == steps * 16 * 64
    assert "budget | 0.5 minutes = 30 s of the train stage buys" in (run / "smoke" / "plan.md").read_text()
    summary = json.loads((run / "train" / "summary.json").read_text())
    decisions = [json.loads(line) for line in (run / "train" / "budget.jsonl").read_text().splitlines()]
    assert decisions and summary["decisions"] == len(decisions) and summary["planned_steps"] == steps
    final = summary["steps"]
    assert final == summary["final_steps"] == ([steps] + [d["max_steps"] for d in decisions])[-1]
    schedule = Replanned(lr=0.005, min_lr=0.0005, warmup_steps=5, max_steps=steps)  # tiny.yaml's: cosine
    for d in decisions:
        if d["max_steps"] != d["previous"]:
            schedule.replan(d["step"], d["max_steps"])
    records = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["step"] == final and last["lr"] == pytest.approx(schedule(final - 1))
    val = json.loads((tiny_layout(copy).folder("shard") / "manifest.json").read_text())["sources"]["stdlib"]["val"]
    assert last["val_bpb"] == pytest.approx(last["val_loss"] / math.log(2) * val["tokens"] / val["bytes"])
    train_log = (run / "logs" / "train.log").read_text()
    assert "bits/byte" in train_log
    # The finished 200-step run was another trajectory: set aside, not resumed (0 steps) and not deleted.
    assert "train: starting from step 0: step-0000200 was trained with other settings: " in train_log
    [aside] = (run / "train" / "superseded").iterdir()
    assert (aside / "checkpoints" / "step-0000200" / "complete.json").is_file()


def model_weights(path: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_a_changed_lr_trains_the_changed_lr_and_another_run_shares_the_data(finished_run, tmp_path):
    """A user finishes a run, changes train.lr and reruns: the train job trains the new lr from step 0
    (not a resume of the finished run with 0 steps), the old checkpoints set aside. Its weights are
    bitwise those of a fresh run at that lr, which, as another run of the same data, builds no data."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    changed = snakemake(copy, "--configfile", str(TINY), "--config", "train={lr: 0.004}", "--until", "train")
    assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
    assert planned_rules(changed) == {"smoke", "train"}
    train_log = (copy / "results" / "tiny" / "logs" / "train.log").read_text()
    assert "train: starting from step 0: step-0000200 was trained with other settings: " in train_log
    assert "train.lr: 0.005 in the checkpoint, 0.004 now" in train_log
    assert "resumed from step" not in train_log
    records = [
        json.loads(line) for line in (copy / "results" / "tiny" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == list(range(10, 201, 10))

    fresh = snakemake(
        copy, "--configfile", str(TINY), "--config", "run_name=tiny-fresh", "train={lr: 0.004}", "--until", "train"
    )
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert planned_rules(fresh) == {"smoke", "train"}  # the data stages were already built
    ours = model_weights(copy / "results" / "tiny" / "train" / "model.safetensors")
    theirs = model_weights(copy / "results" / "tiny-fresh" / "train" / "model.safetensors")
    original = model_weights(workdir / "results" / "tiny" / "train" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)
    assert any((ours[k] != original[k]).any() for k in ours)  # not the lr 0.005 model exported again
    assert (
        json.loads((copy / "results" / "tiny-fresh" / "layout.json").read_text())["data"]
        == json.loads((copy / "results" / "tiny" / "layout.json").read_text())["data"]
    )


def test_forcerun_train_on_a_finished_run_trains_it_again(finished_run, tmp_path):
    """docs/operations.md's "redo a stage": --forcerun train on a finished run trains from step 0 (the same
    weights, deterministic on CPU) and keeps the finished run's checkpoints under superseded/. The user
    turned on HumanEval during training (eval.in_loop, read to run: it alone reruns nothing) and sees
    its pass@1 in the retrained run's validations at its steps."""
    workdir, run, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    in_loop = "eval={in_loop: {every: 100, problems: 2, max_new_tokens: 8}}"
    redo = snakemake(copy, "--configfile", str(TINY), "--config", in_loop, "--forcerun", "train", "--until", "train")
    assert redo.returncode == 0, redo.stdout[-3000:] + redo.stderr[-3000:]
    assert planned_rules(redo) == {"train"}
    log = (copy / "results" / "tiny" / "logs" / "train.log").read_text()
    assert "a retrain was asked for" in log and "HumanEval pass@1" in log
    train = copy / "results" / "tiny" / "train"
    records = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(10, 201, 10))
    assert [r["step"] for r in records if "humaneval_pass@1" in r] == [100, 200]
    [aside] = (train / "superseded").iterdir()
    assert (aside / "checkpoints" / "step-0000200" / "complete.json").is_file() and (aside / "metrics.jsonl").is_file()
    ours, before = model_weights(train / "model.safetensors"), model_weights(run / "train" / "model.safetensors")
    assert all((ours[k] == before[k]).all() for k in before)


SWEEP = ROOT / "config" / "experiments" / "stdlib-lr-sweep.yaml"
NO_LM_EVAL = "eval={lm_eval: {tasks: []}}"


def test_a_three_arm_sweep_builds_the_data_once_and_overlays_the_arms(tmp_path):
    """The shipped CPU sweep over the tiny run's data (docs/experiments.md: how to sweep): Snakemake's own job list
    has each data stage once and smoke, train, eval and report once per arm; the overlay report marks
    the arm with the lowest held-out loss; kiln status lists the arms. Then a fourth value added to
    the sweep runs that arm alone."""
    # Each arm one thread, so two run side by side on two cores; no lm-eval tasks (their set-up is
    # most of a tiny eval, and this is about the sweep, not eval).
    result = snakemake(
        tmp_path,
        "--configfile",
        str(TINY),
        str(SWEEP),
        "--config",
        "train={budget: null}",
        NO_LM_EVAL,
        "--set-threads",
        "smoke=1",
        "train=1",
        "eval=1",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout + result.stderr
    table = out[out.index("Job stats:") :].split("\n\n")[0].splitlines()[3:]
    counts = {rule: int(n) for rule, n in (line.split() for line in table)}
    assert counts == {
        "download_plan": 1,  # the download's part jobs join the DAG once this checkpoint has listed the files
        "download": 1,
        "tokenizer": 1,
        "pretokenize_plan": 1,  # the part jobs join the DAG once this checkpoint has counted the parts
        "pretokenize": 1,
        "shard": 1,
        "eval_data": 3,
        "rehearse": 3,
        "smoke": 3,
        "train": 3,
        "eval": 3,
        "plan": 3,
        "report": 3,
        "sweep_report": 1,
        "all": 1,
        "total": 29,
    }
    arms = [f"stdlib-lr-sweep-lr-{lr}" for lr in ("0.002", "0.008", "0.02")]
    results = tmp_path / "results"
    val = {arm: json.loads((results / arm / "eval" / "metrics.json").read_text())["val_loss"] for arm in arms}
    assert len(set(val.values())) == 3 and all((results / arm / "report.md").is_file() for arm in arms)
    summary = json.loads((results / "stdlib-lr-sweep" / "sweep.json").read_text())
    assert summary["best"] == min(val, key=val.get)
    assert [a["values"] for a in summary["arms"]] == [{"train.lr": lr} for lr in (0.002, 0.008, 0.02)]
    report = (results / "stdlib-lr-sweep" / "sweep.md").read_text()
    assert f"| {summary['best']} **best** | 0.0" in report and all(arm in report for arm in arms)
    assert (results / "stdlib-lr-sweep" / "sweep.png").stat().st_size > 10_000
    status = subprocess.run(
        [VENV_BIN + "/kiln", "status", "results/stdlib-lr-sweep", "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0 and status.stdout.count(" complete in ") == 3, status.stdout

    wider = tmp_path / "wider.yaml"
    wider.write_text(SWEEP.read_text().replace("[0.002, 0.008, 0.02]", "[0.002, 0.008, 0.02, 0.001]"))
    again = snakemake(
        tmp_path,
        "-n",
        "--configfile",
        str(TINY),
        str(wider),
        "--config",
        "train={budget: null}",
        NO_LM_EVAL,
        "--set-threads",
        "smoke=1",
        "train=1",
        "eval=1",
    )
    assert again.returncode == 0 and planned_rules(again) == {
        "eval_data",
        "rehearse",  # the new arm's
        "smoke",
        "plan",
        "train",
        "eval",
        "report",
        "sweep_report",
    }
    assert again.stdout.count("results/stdlib-lr-sweep-lr-0.001/train/summary.json") >= 1
    assert "stdlib-lr-sweep-lr-0.002/train/summary.json" not in again.stdout.split("rule train:")[1].split("rule ")[0]


def test_a_run_continues_from_a_finished_runs_weights(finished_run, tmp_path):
    """docs/experiments.md's "how to continue": a second run with train.init_from {run: tiny} on the same data builds
    no data, validates before its first step at exactly the source's last validation, trains its own
    50 steps, and its report names where the weights came from."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    result = snakemake(
        copy,
        "--configfile",
        str(TINY),
        "--config",
        "run_name=tiny-continued",
        NO_LM_EVAL,
        "train={init_from: {run: tiny, warmup_from: source}, max_steps: 50, warmup_steps: 20, lr: 0.001,"
        " min_lr: 0.0001}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert planned_rules(result) == {"eval_data", "rehearse", "smoke", "plan", "train", "eval", "report"}
    source = [
        json.loads(line) for line in (copy / "results" / "tiny" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    continued = [
        json.loads(line)
        for line in (copy / "results" / "tiny-continued" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert continued[0]["step"] == 0 and continued[0]["val_loss"] == pytest.approx(source[-1]["val_loss"], rel=1e-6)
    assert [r["step"] for r in continued] == [0, 10, 20, 30, 40, 50]
    assert continued[1]["loss"] < source[0]["loss"] - 0.5  # it starts trained
    # warmup_from: source ramps from the LR of the source's last logged step, not from 0
    last_lr = [r["lr"] for r in source if "lr" in r][-1]
    cfg = kiln_config.resolve([TINY], {"train": {"max_steps": 50, "warmup_steps": 20, "lr": 0.001, "min_lr": 0.0001}})
    from_source, from_zero = (
        Replanned.from_config(
            TrainSection.of({**cfg["train"], "init_from": {"run": "tiny", "optimizer": False, "warmup_from": start}}),
            50,
        )
        for start in (last_lr, 0.0)
    )
    logged = {r["step"]: r["lr"] for r in continued if "lr" in r}  # step s: the LR its last step (s - 1) took
    assert logged[10] == pytest.approx(from_source(9), rel=1e-9) and logged[10] != pytest.approx(from_zero(9))
    report = (copy / "results" / "tiny-continued" / "report.md").read_text()
    assert "| initial weights | run results/tiny/train (weights) |" in report


def test_an_older_run_folder_is_told_how_to_move_its_data(finished_run, tmp_path):
    """A results/<run>/ of an older Kiln (its data stages inside it): Snakemake says so and prints the
    commands that move them where this version looks; run, they leave nothing to rebuild."""
    workdir, _, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    paths = tiny_layout(copy)
    for stage, old in (("download", "raw"), ("tokenizer", "tokenizer"), ("pretokenize", "tokens"), ("shard", "shards")):
        paths.folder(stage).rename(copy / "results" / "tiny" / old)  # as an older Kiln laid them out
    dry = snakemake(copy, "--configfile", str(TINY), "-n")
    message = (dry.stdout + dry.stderr).replace("\n", " ")
    assert "results/tiny: raw/, tokenizer/, tokens/, shards/ are data stages from an older Kiln" in message
    commands = re.search(r"move them instead of rebuilding: (.*?)\. Delete the old folders", message)[1]
    subprocess.run(commands, shell=True, cwd=copy, check=True)
    assert planned_rules(snakemake(copy, "--configfile", str(TINY), "-n")) == set()


def test_kiln_export_writes_the_runs_hf_folder_again_without_training(finished_run, tmp_path):
    """docs/operations.md's "export again": `kiln export` rebuilds train/hf from the final weights; the same
    config, tokenizer and weights as the train job's own export."""
    workdir, run, _ = finished_run
    out = tmp_path / "hf"
    done = subprocess.run(
        [VENV_BIN + "/kiln", "export", "results/tiny", "--directory", str(workdir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ours, theirs = model_weights(out / "model.safetensors"), model_weights(run / "train" / "hf" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)
    for name in ("config.json", "tokenizer.json"):
        assert (out / name).read_text() == (run / "train" / "hf" / name).read_text(), name
