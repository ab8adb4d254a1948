"""The rehearse rule (workflow/rules/rehearse.smk) as a user meets it: it runs first, from the config
alone; a run that will not fit its card stops there, naming the phase and the fix, before any data
is downloaded or smoke takes a GPU; and `kiln plan` shows a finished run's rehearsal beside its
estimate, and only for the settings it rehearsed."""

from __future__ import annotations

import re
import subprocess
import sys

from tiny import TINY, snakemake

from kiln.config.run_config import RunConfig
from kiln.plan.rehearsal import Rehearsal

TOO_BIG = ["model={n_layer: 8, d_model: 8192, n_head: 64}", "plan={gpu: RTX 3080 Ti}"]  # 6.4B: 24 GiB of weights


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
