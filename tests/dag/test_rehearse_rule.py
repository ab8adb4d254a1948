"""The rehearse rule (workflow/rules/rehearse.smk) as a user meets it: it runs first, from the config
alone; a run that will not fit its card stops there, naming the phase and the fix, before any data
is downloaded or smoke takes a GPU; it rehearses the eval batches the whole config turns on, and
reruns when one is turned on or off; and `kiln plan` shows a finished run's rehearsal beside its
estimate, and only for the settings it rehearsed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tiny import TINY, snakemake

from kiln.config.run_config import RunConfig
from kiln.plan.rehearsal import Rehearsal

TOO_BIG = ["model={n_layer: 8, d_model: 8192, n_head: 64}", "plan={gpu: RTX 3080 Ti}"]  # 6.4B: 24 GiB of weights
REHEARSAL = "results/tiny/rehearse/rehearsal.json"
NO_LM_EVAL = "eval={lm_eval: {tasks: []}}"


def test_a_run_that_will_not_fit_its_card_stops_at_the_rehearsal_before_anything_else_runs(tmp_path):
    # one core: the jobs run one at a time, the rehearsal (priority) first
    result = snakemake(tmp_path, "--configfile", str(TINY), "--config", *TOO_BIG, "--cores", "1")
    assert result.returncode != 0
    log = (tmp_path / "results" / "tiny" / "logs" / "rehearse.log").read_text()
    assert re.search(r"build: model, parallel, optimizer will not fit on RTX 3080 Ti: 24\.0 GiB per rank", log), log
    assert "train.parallel: fsdp" in log  # what helps where the weights alone do not fit
    ran = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", result.stdout + result.stderr, flags=re.M)
    assert ran == ["rehearse"], ran  # no download started, no smoke
    assert not (tmp_path / "results" / "tiny" / "rehearse" / "rehearsal.json").exists()


def _plan(workdir, *config: str) -> str:
    argv = [sys.executable, "-m", "kiln.main", "plan", "--configfile", str(TINY)] + (
        ["--config", *config] if config else []
    )
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kiln_plan_shows_the_finished_runs_rehearsal_for_its_settings_only(finished_run):
    workdir, run, _ = finished_run
    rehearsal = Rehearsal.load(run / "rehearse" / "rehearsal.json")
    assert rehearsal.run == "tiny" and rehearsal.gpu.fragment == RunConfig.of({"plan": {}}).plan.gpu
    train_step = rehearsal.phase("train step")
    assert train_step.fits and train_step.peak > rehearsal.phase("build").peak  # activations on top of the model
    row = next(line for line in _plan(workdir).splitlines() if line.startswith("| memory per GPU, rehearsed |"))
    assert "train step: forward, backward, optimizer" in row and "results/tiny/rehearse/rehearsal.json" in row
    changed = _plan(workdir, "train={micro_batch: 4}")  # a setting the rehearsal reads: not this rehearsal's
    assert "rehearsal.json rehearsed other settings" in changed


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    """A folder where the rehearse rule alone has run on the tiny run with lm-eval off (eval.lm_eval.tasks
    []). Tiny trains with FIM (pretokenize.fim.rate 0.5, a section the rehearse stage does not read)."""
    workdir = tmp_path_factory.mktemp("rehearsed")
    result = snakemake(workdir, REHEARSAL, "--configfile", str(TINY), "--config", NO_LM_EVAL)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def _scheduled(workdir, *config: str) -> list[str]:
    """The rules a dry run of the rehearsal schedules with --config `config` on the tiny run."""
    result = snakemake(workdir, REHEARSAL, "--configfile", str(TINY), "--config", *config, "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    return re.findall(r"^(?:local)?rule (\w+):", result.stdout, flags=re.M)


def test_the_rule_rehearses_the_eval_batches_the_whole_config_turns_on(rehearsed):
    """Infilling for a run that trains with FIM, as `kiln rehearse` on the whole config has it; no
    lm-eval where the config turns it off."""
    phases = [p.name.split(",")[0] for p in Rehearsal.load(rehearsed / REHEARSAL).phases if p.name.startswith("eval")]
    assert phases == ["eval: held-out loss", "eval: infilling", "eval: HumanEval and HumanEval-Infilling decode"]


def test_turning_an_eval_batch_on_reruns_the_rehearsal_and_resizing_one_does_not(rehearsed):
    assert _scheduled(rehearsed, NO_LM_EVAL) == []  # as rehearsed
    assert _scheduled(rehearsed, "eval={lm_eval: {tasks: [kiln_heldout_perplexity]}}") == ["rehearse"]
    # tiny's one HumanEval problem, then two: the same batch of prompts, rehearsed already
    assert _scheduled(rehearsed, "eval={lm_eval: {tasks: []}, humaneval: {problems: 2}}") == []
