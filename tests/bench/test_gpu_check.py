"""bench/gpu_check, the GPU check no CPU machine can pass, does not rot: its --cpu-dry-run runs
every check's CPU-capable part at tiny shapes (CUDA hidden) and prints the table a GPU run prints,
each row skipped for want of CUDA, none failed, from a clone with no Kiln installed and no
PYTHONPATH. Its process handling holds on the CPU as on the GPU machine: a check over budget is
ended with everything it started, a torchrun-style rank in a session of its own included, the rows
it finished before are kept, and the run's deadline still leaves a row, with the reason, for every
check."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_CHECK = [sys.executable, str(REPO / "bench" / "gpu_check")]  # `python bench/gpu_check`: the folder's __main__
# The checks' budgets are sized for the GPU. On two cores shared with the suite's other lanes, a cold
# inductor build took gpt2's row past its 120 s (CI, stop 54): the dry runs here get four times as
# long, and HANG_S is a hang guard, not a timing (~60 s on a quiet 2-core machine, cold).
DRY_RUN = ["--cpu-dry-run", "--budget-scale", "4"]
HANG_S = 1200
ROWS = [
    "flash SDPA",
    "fused AdamW",
    "torch.compile gpt2-124m",
    "host run-ahead, stop flag read",
    "MFU gpt2-124m seq 1024",
    "bench/train_throughput.py gpt2-124m",
    "chunked loss memory, flagship logits",
    "MFU llama3.2-1b seq 8192",
    "MFU llama3.2-1b, torchtitan transformers-backend count",
    "memory estimate llama3.2-1b seq 8192",
    "smoke memory snapshot",
    "eval on GPU vs CPU",
    "tiny pipeline, train.device=cuda",
    "bench/generate.py",
    "FSDP2 on one rank, NCCL, compiled",
    "FSDP2 on one rank, DCP resume",
    "seed 000's path: 1B, flex document mask, compiled, FSDP2 one rank, Muon",
    "seed 000's path: the smoke gate's eager validation",
    "seed 000's path: the in-loop decode",
    "two-rank smoke, NCCL",
    "DDP 2 ranks, NCCL",
    "FSDP 2 ranks, NCCL",
]


def _table(stdout: str) -> list[list[str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert lines[0] == "| check | result | figure | expected |"
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


def node_image(folder: Path) -> Path:
    """The python of a venv that holds what a GPU node holds (bench/gpu_check/image.py): torch's
    distribution and what it requires, NODE_WHEELS and what they require (this environment's files,
    linked), and no Kiln: a clone's bench finds its src/ itself (bench/common.py). A module of
    anything else is absent there, as on the node."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from gpu_check import image
    finally:
        sys.path.remove(str(REPO / "bench"))
    venv.create(folder, symlinks=True)
    [site] = (folder / "lib").glob("python3*/site-packages")
    for name in {*image.requirements(("torch",)), *image.requirements(image.NODE_WHEELS)}:
        dist = importlib.metadata.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)).resolve())
    return folder / "bin" / "python"


def test_a_node_with_torch_and_the_listed_wheels_only_runs_every_row_but_the_pipeline(tmp_path):
    """The whole dry run as the docs write it, `python bench/gpu_check` from the clone's root, in a
    venv of only torch, NODE_WHEELS and what they require (node_image) and no PYTHONPATH, as a GPU
    node runs it: Kiln is this clone's src/ (nothing else there has it), every row is printed and
    none fails; each check's CPU part ran and gave its figure; the pipeline's row, which runs every
    stage, says what the node lacks (the next test runs it where the packages are). `--list-wheels`
    names what to carry."""
    python = node_image(tmp_path / "node")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = subprocess.run([str(python), "-c", "import kiln"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "No module named 'kiln'" in bare.stderr  # the node has no Kiln but the clone's
    command = [str(python), "bench/gpu_check", *DRY_RUN, "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S, env=env, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _table(done.stdout)
    assert [r[0] for r in rows] == ROWS
    by_check = {check: (result, figure, expected) for check, result, figure, expected in rows}
    result, figure, _ = by_check.pop("tiny pipeline, train.device=cuda")
    assert result.startswith("skipped: no snakemake, pyarrow") and "every stage" in figure
    for check, (result, figure, expected) in by_check.items():
        assert result == "skipped: no CUDA", (check, result, figure)
        assert figure.startswith("CPU part: ") and expected, check
    figures = {check: figure for check, (_, figure, _) in by_check.items()}
    assert "flash" in figures["flash SDPA"] and "_fused_adamw_" in figures["fused AdamW"]
    assert "chunked vs" in figures["chunked loss memory, flagship logits"]
    assert "estimated" in figures["memory estimate llama3.2-1b seq 8192"]
    assert "torchtitan transformers-backend count" in figures["MFU gpt2-124m seq 1024"]
    assert "with later work still queued: True" in figures["host run-ahead, stop flag read"]
    # compiled as train compiles at world 1 (kiln.train.parallel.compile_blocks): block by block, one graph for all
    assert "per block: 2 dynamo graph(s) for 2 blocks and the loss" in figures["torch.compile gpt2-124m"]
    # the two-rank worker ran under torchrun (gloo here): the gate passed, DDP's ranks agree, FSDP matches DDP
    assert "checks passed" in figures["two-rank smoke, NCCL"] and "FAILED" not in figures["two-rank smoke, NCCL"]
    assert "ranks' weights equal" in figures["DDP 2 ranks, NCCL"]
    assert "of DDP's" in figures["FSDP 2 ranks, NCCL"]
    # train.fsdp_one_rank on gloo: fully_shard over one rank, compiled (aot_eager), its DCP shards resumed
    assert "of the plain rank's" in figures["FSDP2 on one rank, NCCL, compiled"]
    assert "DCP shards resumed: 2 steps" in figures["FSDP2 on one rank, DCP resume"]
    # seed 000's config from its file, its 1B model on meta, then the tiny twin through the same functions
    seed = [figures[row] for row in ROWS if row.startswith("seed 000's path")]
    assert "1.04B parameters, vocab 32,768, seq 8,192, flex on CUDA: True" in seed[0], seed[0]
    assert "parameters sharded (DTensor), document mask: dense, optimizer muon" in seed[0], seed[0]
    assert "held-out loss" in seed[1] and "2 prompts x 4 new tokens" in seed[2] and "lengths [4]" in seed[2]
    assert (tmp_path / "out" / "snapshot" / "smoke" / "trace.json").exists()  # the smoke probe traced its step
    wheels = subprocess.run([*GPU_CHECK, "--list-wheels"], capture_output=True, text=True, timeout=60)
    assert wheels.returncode == 0, wheels.stderr
    assert "pip download --no-deps --only-binary=:all: -d kiln-wheels" in wheels.stdout
    for wheel in ("numpy==", "pyyaml==", "safetensors==", "psutil==", "tokenizers==", "pydantic==", "pydantic-core=="):
        assert wheel in wheels.stdout, wheel
    assert "torch==" not in wheels.stdout  # the node's own


def test_the_pipeline_row_runs_where_the_data_and_eval_packages_are(tmp_path):
    """The one row the node image skips, in this environment: `--only pipeline` prints it, not failed."""
    command = [*GPU_CHECK, *DRY_RUN, "--only", "pipeline", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    [[check, result, figure, expected]] = _table(done.stdout)
    assert (check, result) == ("tiny pipeline, train.device=cuda", "skipped: no CUDA") and expected
    assert figure.startswith("CPU part: ") and "merged into tiny.yaml's train section" in figure


def test_a_deadline_already_spent_still_gives_every_row_a_reason(tmp_path):
    """With no time left nothing starts, not even the environment probe, and the table still has
    every check's rows, each a FAIL saying why, and the run exits 1."""
    command = [*GPU_CHECK, "--cpu-dry-run", "--out", str(tmp_path), "--deadline-s", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = _table(done.stdout)
    assert [r[0] for r in rows] == ROWS
    assert all(result == "FAIL" and "not started: the 0 s deadline" in figure for _, result, figure, _ in rows), rows


# A check that does what torchrun does to a rank: a launcher in the check's own session starts the
# rank in a session of its own (torch elastic's start_new_session=True), so the check's process group
# and session both miss it. Run in a separate interpreter: gpu_check.procs makes its caller a child
# subreaper, which pytest's process should not become.
DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from gpu_check.procs import run_isolated

    work, hang = Path(sys.argv[2]), sys.argv[3] == "hang"
    RANK = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); " \\
           "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(120)"
    LAUNCHER = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-S', '-c', %r, sys.argv[1]], "
                "start_new_session=True); time.sleep(120)") % RANK

    def check():  # two rows, the first as soon as the rank is up
        subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(work / "rank.pid")])
        while not (work / "rank.pid").exists():
            time.sleep(0.05)
        (work / "progress.tsv").write_text("1\\tthe rank is up\\n")
        yield ["pass", "the rank is up"]
        if hang:
            time.sleep(120)
        yield ["pass", "returned, its rank still running"]

    done = run_isolated(check, work / "r.jsonl", work / "r.log", 6 if hang else 60, work / "progress.tsv")
    print(json.dumps({"rows": done.items, "why": done.why}))
""")


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="walks /proc (Linux)")
@pytest.mark.parametrize("mode", ["hang", "return"])
def test_a_check_is_ended_with_a_rank_it_started_in_a_session_of_its_own(tmp_path, mode):
    """Over budget ("hang") or done ("return"), the check's rank is gone afterwards: killing the
    check's process group (the old way) leaves it running, holding the next check's GPU. The reason
    of a check over budget quotes its last progress note, and the row it finished before its overrun
    is kept (rows came back only with a check's end before: its overrun lost every row)."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO / "bench"), str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rank = int((tmp_path / "rank.pid").read_text())
    try:
        assert not _running(rank), "the rank outlived its check"
    finally:
        if _running(rank):
            os.kill(rank, signal.SIGKILL)
    result = json.loads(done.stdout.splitlines()[-1])
    up = ["pass", "the rank is up"]
    if mode == "hang":
        assert result["rows"] == [up] and "over its 6 s budget" in result["why"] and "the rank is up" in result["why"]
    else:
        assert result["rows"] == [up, ["pass", "returned, its rank still running"]] and result["why"] is None


def test_the_budgets_sum_under_the_deadline_and_nine_minutes(monkeypatch):
    """The GPU run must end within a device command's 10 minutes with numbers in every row: the
    per-check budgets (the environment probe's included) fit inside the enforced deadline, 9 minutes,
    with and without the two-rank check, and the deadline leaves the interpreter's start-up and the
    table their minute."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # as `python bench/gpu_check` has it
    from gpu_check import checks

    one_gpu = checks.ENVIRONMENT_S + sum(c.budget_s for c in checks.CHECKS if c.gpus == 1)
    every = one_gpu + sum(c.budget_s for c in checks.CHECKS if c.gpus > 1)
    assert one_gpu <= 500 and every <= checks.DEADLINE_S <= 540
    assert [row for c in checks.CHECKS for row in c.rows] == ROWS


def test_the_train_bench_mark_passes_what_the_h200_measured_and_fails_what_it_is_there_to_catch(monkeypatch):
    """The gpt2-bench row's pass mark against nanoGPT's loop compiled whole (docs/benchmarks.md, "Loss
    chunks on the H200", gpt2-124m at 16 x 1024): Kiln's step, the loss whole as it now runs there,
    measured 418,388 tokens/s against the loop's 491,792, so a mark of 1.0x failed by design; the
    chunked loss's slowdown the row is there to catch read 148,707. The mark passes the first with a
    tenth to spare and fails the second."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from gpu_check import benches

    assert 148_707 / 491_792 < benches.COMPILED_LOOP_MARK <= 0.9 * 418_388 / 491_792


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace") and _running(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="walks /proc (Linux)")
def test_a_run_stopped_while_torchrun_ranks_train_ends_them_and_still_prints_the_table(tmp_path):
    """SIGTERM (a device session ending) once the two-rank check's ranks have joined their group:
    the run still prints the check's rows, each saying why it has no figures, exits 1, and leaves no
    rank behind, though torchrun started each in a session of its own."""
    command = [*GPU_CHECK, *DRY_RUN, "--out", str(tmp_path), "--only", "two-ranks"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress, give_up = tmp_path / "two-ranks" / "progress.tsv", time.monotonic() + HANG_S
    while "ranks joined" not in (progress.read_text() if progress.exists() else "") and run.poll() is None:
        assert time.monotonic() < give_up, "the ranks never joined"
        time.sleep(0.2)
    assert _processes_naming(str(tmp_path / "two-ranks" / "plan.json")), "no rank to stop"
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=60)
    try:
        assert run.returncode == 1, stdout + stderr
        rows = _table(stdout)
        assert [r[0] for r in rows] == ROWS[-3:]
        assert rows[0][1:3] == ["FAIL", "interrupted (SIGTERM)"], rows
        assert all(r[1:3] == ["FAIL", "not reached: the check stopped at 'two-rank smoke, NCCL'"] for r in rows[1:])
        assert _processes_naming(str(tmp_path)) == []
    finally:
        for pid in _processes_naming(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)


def test_a_row_is_written_as_its_part_ends_and_a_stop_in_the_next_part_keeps_it(tmp_path):
    """fsdp-one-rank's first row (the mode against the plain rank) is in the check's rows file while
    its second part (the resume) still runs, and the run stopped then (SIGTERM, a device session
    ending) prints that row as the check measured it; only the row it was at reads why it has no
    figure. Before, a check's rows came back with its end alone: both read "interrupted"."""
    command = [*GPU_CHECK, *DRY_RUN, "--out", str(tmp_path), "--only", "fsdp-one-rank"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows_file, give_up = tmp_path / "fsdp-one-rank.jsonl", time.monotonic() + HANG_S
    while '"item"' not in (rows_file.read_text() if rows_file.exists() else "") and run.poll() is None:
        assert time.monotonic() < give_up, "the first row never came"
        time.sleep(0.1)
    assert run.poll() is None, "the check ended before its first row was read: " + run.communicate()[0]
    run.send_signal(signal.SIGTERM)  # the resume's run, a whole train run, is under way
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == 1, stdout + stderr
    first, second = _table(stdout)
    assert first[:2] == ["FSDP2 on one rank, NCCL, compiled", "skipped: no CUDA"], first
    assert first[2].startswith("CPU part: ") and "of the plain rank's" in first[2]
    assert second[:3] == ["FSDP2 on one rank, DCP resume", "FAIL", "interrupted (SIGTERM)"], second
