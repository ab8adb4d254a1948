"""`kiln status` on run folders laid out as a real run leaves them (tests/configs/tiny.yaml run by hand:
outputs, logs, benchmarks, metrics.jsonl, checkpoints/LATEST, Snakemake's markers and locks), one
real Snakemake job looking at itself, and fake squeue/sacct for the formatting of their answers."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln import layout, main
from kiln.report import status

ROOT = Path(__file__).resolve().parents[2]
STAGES = [
    "download",
    "tokenizer",
    "pretokenize",
    "shard",
    "rehearse",
    "smoke",
    "plan",
    "train",
    "eval_data",
    "eval",
    "report",
]
# What each stage of the tiny run left under results/tiny (a subset of every folder's files).
FILES = {
    "download": ["raw/manifest.json", "raw/stdlib/part-00000.parquet", "raw/.snakemake_timestamp"],
    "tokenizer": ["tokenizer/tokenizer.json", "tokenizer/stats.json"],
    "pretokenize": ["tokens/meta.json", "tokens/train.bin", "tokens/val.bin", "tokens/val_ids.txt"],
    "shard": ["shards/manifest.json", "shards/train-00000.bin", "shards/val-00000.bin"],
    "rehearse": ["rehearse/rehearsal.json"],
    "eval_data": ["eval_data/eval_data.json", "eval_data/lm_eval_tasks/next_line.jsonl"],
    "smoke": ["smoke/report.json"],
    "plan": ["smoke/plan.md"],  # plan.json: written with its real keys below
    "train": [
        "train/model.safetensors",
        "train/model_config.json",
        "train/summary.json",
        "train/hf/config.json",
        "train/hf/model.safetensors",
    ],
    "eval": ["eval/metrics.json", "eval/samples.json"],
    "report": ["report.md", "loss.png"],
}
BENCHMARK = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n{s}\t0:00:13\t640.32\t1890.95\t456.36\t540.63\t4.04\t4.54\t122.33\t19.15\n"
SMOKE_FAILURE = """2026-12-01 04:36:01,257 kiln.smoke INFO probe step 12/12
2026-12-01 04:36:02,101 kiln ERROR smoke: FAILED: health (thresholds are in the smoke section, see smoke/report.json)
"""


def metrics_line(step: int) -> str:
    return (
        json.dumps(
            {
                "step": step,
                "loss": 6.0 - step / 100,
                "lr": 0.005,
                "grad_norm": 0.38,
                "tokens": step * 1024,
                "tokens_per_s": 41558.8,
                "tflops": 0.0368,
                "mfu": None,
                "memory_mb": 400.7,
            }
        )
        + "\n"
    )


KEYS = {stage: f"{i:012x}" for i, stage in enumerate(layout.DATA_STAGES, 1)}  # results/data/<folder>-<key>


def paths_of(run: Path) -> layout.Layout:
    return layout.Layout.read(run)


def stage_file(run: Path, rel: str, stage: str) -> Path:
    """A file FILES names (as an older Kiln laid it out in the run folder) where the run's layout puts it."""
    paths = paths_of(run)
    inside = rel.split("/", 1)[1] if layout.BY_NAME[stage].folder else rel
    return paths.folder(stage) / inside


def finish(run: Path, stage: str, seconds: float = 13.71) -> None:
    """Leave what a finished stage leaves: its outputs, log and benchmark."""
    paths = paths_of(run)
    for rel in FILES[stage]:
        path = stage_file(run, rel, stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    if stage == "plan":
        Path(paths.output("plan", "plan.json")).write_text(
            json.dumps({"ranks": 1, "tokens_per_step": 1024, "max_steps": 200, "tokens_per_s": 43382.3, "eta_s": 4.7})
        )
    for path, text in ((paths.log(stage), f"{stage}: done\n"), (paths.benchmark(stage), BENCHMARK.format(s=seconds))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


def start(workdir: Path, stage: str, job_id: str | None = None) -> None:
    """What Snakemake writes when it starts (or submits) a job: an incomplete marker per output."""
    for output in paths_of(workdir / "results" / "tiny").outputs(stage):
        path = status.marker_path(workdir, Path(output).relative_to(workdir).as_posix())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"external_jobid": job_id}))


def hold_lock(workdir: Path) -> None:
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text("/abs/results/tiny/train/model.safetensors\n")
    (locks / "0.input.lock").write_text("/abs/results/tiny/shards\n")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    (tmp_path / "bin").mkdir()
    layout.Layout(run="tiny", root=tmp_path / "results", keys=KEYS).write()  # what snakemake's onstart writes
    return tmp_path


def fake_tool(workdir: Path, name: str, output: str) -> None:
    """A squeue/sacct that prints what the real one prints for our format options."""
    tool = workdir / "bin" / name
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {workdir}/{name}.calls\nprintf '{output}'\n")
    tool.chmod(0o755)


def kiln_status(workdir: Path, *args: str, capsys) -> tuple[int, str]:
    code = main.main(["status", "results/tiny", "--directory", str(workdir), *args])
    return code, capsys.readouterr().out


def states(workdir: Path) -> dict[str, str]:
    return {s.name: s.state for s in status.inspect_run(workdir, workdir / "results" / "tiny")}


def test_outputs_are_the_rules_declared_outputs():
    """kiln.layout.STAGES, which status reads, is what the rules declare (their outputs are built
    from it: a rule that spelled a path itself would fail here)."""
    pattern = layout.Layout.pattern()
    for stage in layout.STAGES:
        rules = "".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
        rule = rules.split(f"\nrule {stage.name}:\n")[1]  # the plan rule is in smoke.smk
        block = rule.split("output:")[1].split("params:")[0]
        declared = re.findall(r'P\.output\("(\w+)"(?:, "([^"]+)")?\)', block)
        assert declared and all(s == stage.name for s, _ in declared), stage.name
        assert [pattern.output(s, n or None) for s, n in declared] == pattern.outputs(stage.name), stage.name


def test_a_finished_run(workdir, capsys):
    for stage in STAGES:
        finish(workdir / "results" / "tiny", stage, seconds=10.0)
    train = workdir / "results" / "tiny" / "train"
    (train / "metrics.jsonl").write_text("".join(metrics_line(s) for s in range(10, 201, 10)))
    (train / "checkpoints").mkdir()
    (train / "checkpoints" / "LATEST").write_text("step-0000200\n")
    code, out = kiln_status(workdir, capsys=capsys)
    assert code == 0
    assert re.search(r"^train\s+done\s+0m10s\s+step 200/200 loss 4.00 41.6k tok/s ckpt 200$", out, re.M)
    assert out.rstrip().endswith(f"complete in 1m50s: {workdir / 'results' / 'tiny' / 'report.md'}")
    assert "slurm" not in out  # no empty Slurm column off a cluster


def test_a_scattered_stage_counts_its_plan_and_part_jobs(workdir):
    """pretokenize's time is its plan's, its part jobs' and its gather's (kiln.layout.SCATTER_JOBS)."""
    run = workdir / "results" / "tiny"
    for stage in STAGES:
        finish(run, stage, seconds=10.0)
    paths = paths_of(run)
    for path in (
        paths.benchmark("pretokenize", "pretokenize_plan"),
        *(paths.benchmark("pretokenize", "pretokenize_part", part=i) for i in range(3)),
    ):
        Path(path).write_text(BENCHMARK.format(s=2.0))
    seconds = {s.name: s.seconds for s in status.inspect_run(workdir, run)}
    assert seconds["pretokenize"] == 18.0 and seconds["tokenizer"] == 10.0


def test_a_scattered_stage_runs_while_its_part_jobs_do(workdir):
    """pretokenize's gather has not started, but a part job has: the stage is running, not pending."""
    run = workdir / "results" / "tiny"
    for stage in STAGES[:2]:
        finish(run, stage)
    paths = paths_of(run)
    layout.ScatterPlan([{"index": 0}, {"index": 1}]).save(Path(paths.scatter_plan("pretokenize")))
    hold_lock(workdir)
    assert states(workdir)["pretokenize"] == "pending"
    marker = status.marker_path(workdir, Path(paths.part("pretokenize", 1)).relative_to(workdir).as_posix())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"external_jobid": None}))
    assert states(workdir)["pretokenize"] == "running"


def test_train_mid_way_with_a_torn_metrics_line(workdir, capsys):
    run = workdir / "results" / "tiny"
    for stage in STAGES[:7]:
        finish(run, stage)
    start(workdir, "train")
    hold_lock(workdir)
    (run / "train" / "checkpoints").mkdir(parents=True)
    (run / "train" / "checkpoints" / "LATEST").write_text("step-0000100\n")
    torn = metrics_line(130)[:40]  # the job was killed mid-write
    (run / "train" / "metrics.jsonl").write_text("".join(metrics_line(s) for s in range(10, 121, 10)) + torn)
    code, out = kiln_status(workdir, capsys=capsys)
    assert code == 0
    eta = status.format_eta((200 - 120) * 1024 / 41558.8)
    assert out.rstrip().endswith(f"train running: step 120/200 loss 4.80 41.6k tok/s ETA {eta} ckpt 100")
    assert states(workdir) == dict.fromkeys(STAGES[:7], "done") | {
        "train": "running",
        "eval_data": "pending",
        "eval": "pending",
        "report": "pending",
    }
    report = json.loads(kiln_status(workdir, "--json", capsys=capsys)[1])
    assert report["stages"][7]["progress"]["step"] == 120 and report["stages"][7]["progress"]["checkpoint_step"] == 100


def test_a_failed_stage_shows_its_log_tail(workdir, capsys):
    run = workdir / "results" / "tiny"
    for stage in STAGES[:5]:
        finish(run, stage)
    (run / "logs").mkdir(exist_ok=True)
    (run / "logs" / "smoke.log").write_text(SMOKE_FAILURE)
    code, out = kiln_status(workdir, capsys=capsys)
    assert code == 0
    assert "smoke failed: see results/tiny/logs/smoke.log" in out
    assert (
        "last lines of results/tiny/logs/smoke.log:\n  2026-12-01 04:36:01,257 kiln.smoke INFO probe step 12/12" in out
    )
    assert "kiln ERROR smoke: FAILED: health" in kiln_status(workdir, "--stage", "smoke", capsys=capsys)[1]
    assert states(workdir)["train"] == "pending"


def test_markers_without_snakemake_are_an_interrupted_job(workdir):
    for stage in STAGES[:7]:
        finish(workdir / "results" / "tiny", stage)
    start(workdir, "train")  # Snakemake was killed: its markers stay, its locks went with it
    train = status.inspect_run(workdir, workdir / "results" / "tiny")[7]
    assert train.state == "failed" and "--rerun-incomplete" in train.note


def test_a_failure_older_than_the_running_snakemake_is_pending(workdir):
    run = workdir / "results" / "tiny"
    for stage in STAGES[:5]:
        finish(run, stage)
    (run / "logs").mkdir(exist_ok=True)
    (run / "logs" / "smoke.log").write_text(SMOKE_FAILURE)
    os.utime(run / "logs" / "smoke.log", (1e9, 1e9))  # yesterday's attempt; a new Snakemake now holds the folder
    hold_lock(workdir)
    assert states(workdir)["smoke"] == "pending"


def test_slurm_job_running(workdir, capsys):
    run = workdir / "results" / "tiny"
    for stage in STAGES[:7]:
        finish(run, stage)
    start(workdir, "train", job_id="1234")
    hold_lock(workdir)
    slurm_log = workdir / ".snakemake" / "slurm_logs" / "rule_train" / "1234.log"
    slurm_log.parent.mkdir(parents=True)
    slurm_log.write_text("")
    (run / "train").mkdir(exist_ok=True)
    (run / "train" / "metrics.jsonl").write_text(metrics_line(10))
    fake_tool(workdir, "squeue", "RUNNING|n1\\n")
    fake_tool(workdir, "sacct", "")
    code, out = kiln_status(workdir, capsys=capsys)
    assert re.search(r"^train\s+running\s+\S+\s+1234 RUNNING n1\s+step 10/200", out, re.M)
    assert "train running on n1 (job 1234): step 10/200" in out
    assert (workdir / "squeue.calls").read_text().split() == ["-h", "-j", "1234", "-o", "%T|%N"]
    detail = kiln_status(workdir, "--stage", "train", capsys=capsys)[1]
    assert "slurm job: 1234 RUNNING n1, log .snakemake/slurm_logs/rule_train/1234.log" in detail


def test_slurm_job_gone_from_the_queue_is_asked_of_sacct(workdir, capsys):
    for stage in STAGES[:7]:
        finish(workdir / "results" / "tiny", stage)
    start(workdir, "train", job_id="1234")
    hold_lock(workdir)
    fake_tool(workdir, "squeue", "")  # squeue forgets finished jobs
    fake_tool(workdir, "sacct", "TIMEOUT|n2\\n")
    code, out = kiln_status(workdir, capsys=capsys)
    assert code == 0 and "train failed (Slurm job timeout)" in out
    assert re.search(r"^train\s+failed\s+\S+\s+1234 TIMEOUT n2", out, re.M)


def test_without_squeue_or_sacct_the_state_is_unknown(workdir, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(workdir / "bin"))  # a host with no Slurm client
    for stage in STAGES[:7]:
        finish(workdir / "results" / "tiny", stage)
    start(workdir, "train", job_id="1234")
    hold_lock(workdir)
    code, out = kiln_status(workdir, "--stage", "train", capsys=capsys)
    assert code == 0 and "slurm job: 1234 unknown" in out and "not on PATH" in out


def test_no_results_folder(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kiln.main", "status", "results/tiny"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"kiln: {tmp_path / 'results' / 'tiny'}: no such run folder")


SNAKEFILE = """
rule train:
    output:
        "results/tiny/train/model.safetensors", "results/tiny/train/model_config.json",
        "results/tiny/train/summary.json", directory("results/tiny/train/hf"),
    shell:
        "{python} -c 'import sys; from kiln.main import main; code = main(sys.argv[1:]);"
        " assert \\"torch\\" not in sys.modules; sys.exit(code)' status results/tiny --json > seen.json"
        " && mkdir {{output[3]}} && touch {{output[0]}} {{output[1]}} {{output[2]}}"
"""


def test_a_real_snakemake_job_sees_itself_running(workdir):
    """Snakemake's own markers and locks, as its persistence module writes them (not our reading of
    its source): a job that runs `kiln status` finds itself running, and done afterwards."""
    for stage in STAGES[:7]:
        finish(workdir / "results" / "tiny", stage)
    (workdir / "Snakefile").write_text(SNAKEFILE.format(python=sys.executable))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "-d", str(workdir), "-s", str(workdir / "Snakefile")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads((workdir / "seen.json").read_text())
    assert [s["state"] for s in seen["stages"]] == ["done"] * 7 + ["running", "pending", "pending", "pending"]
    assert states(workdir)["train"] == "done"


def test_a_run_folder_of_an_older_kiln_still_reads(tmp_path, capsys):
    """Before shared data stages, raw/, tokenizer/, tokens/ and shards/ sat in the run folder and no
    layout.json was written: such a folder reads as it was, with a note saying what changed."""
    run = tmp_path / "results" / "tiny"
    for stage in STAGES:
        for rel in FILES[stage] + (["smoke/plan.json"] if stage == "plan" else []):
            (run / rel).parent.mkdir(parents=True, exist_ok=True)
            (run / rel).write_text("x")
        (run / "logs").mkdir(exist_ok=True)
        (run / "logs" / f"{stage}.log").write_text("done\n")
    assert [s.state for s in status.inspect_run(tmp_path, run)] == ["done"] * 11
    code, out = kiln_status(tmp_path, capsys=capsys)
    assert code == 0 and "raw/, tokenizer/, tokens/, shards/ are data stages from an older Kiln" in out
    assert f"now live in {tmp_path / 'results' / 'data'}/" in out


def test_a_sweep_lists_its_arms(workdir, capsys):
    layout.write_sweep_index("lr", ["lr-a", "lr-b"], workdir / "results")
    for arm in ("lr-a", "lr-b"):
        layout.Layout(run=arm, root=workdir / "results", keys=KEYS).write()
    for stage in STAGES:
        finish(workdir / "results" / "lr-a", stage, seconds=10.0)
    for stage in STAGES[:5]:
        finish(workdir / "results" / "lr-b", stage)  # the data stages are lr-a's folders; the rehearsal its own
    code = main.main(["status", "results/lr", "--directory", str(workdir)])
    out = capsys.readouterr().out
    assert code == 0 and "sweep lr (" in out and "2 arms" in out
    assert re.search(r"^  lr-a  complete in \S+: .*results/lr-a/report.md$", out, re.M)
    assert re.search(r"^  lr-b  stopped after rehearse; next: smoke$", out, re.M)
    assert "overlay report: not yet" in out


def test_eval_data_failing_beside_training_shows_as_failed(workdir):
    """eval_data needs only the data stages (kiln.layout.Stage.needs): its log without its outputs is a
    failure while smoke and train have not finished, not a stage waiting its turn."""
    run = workdir / "results" / "tiny"
    for stage in STAGES[:4]:
        finish(run, stage)
    log = Path(paths_of(run).log("eval_data"))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Traceback: disk full\n")
    assert states(workdir) == dict.fromkeys(STAGES[:4], "done") | dict.fromkeys(STAGES[4:], "pending") | {
        "eval_data": "failed"
    }
