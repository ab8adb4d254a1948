"""kiln.train.launch: the argv that starts a stage's ranks, and the exit code it hands on. The Slurm
path (srun + c10d on the allocation's first host) runs for real in tests/slurm/test_pipeline_on_slurm.py;
torchrun passing a rank's code and a signal on, in tests/dag/test_kill_resume.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.errors import KilnError
from kiln.train.launch import (
    SHUTDOWN_TIMEOUT_S,
    command,
    main,
    rank_environment,
    resubmission_refused,
    run_ranks,
)

ONE_NODE = {"nproc_per_node": 4, "nnodes": 1, "node_rank": 0, "rdzv_endpoint": ""}


def test_one_node_is_a_standalone_torchrun_of_this_python():
    argv = command(ONE_NODE, ["train.py", "--x"], env={})
    assert argv == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=4",
        "--standalone",
        "train.py",
        "--x",
    ]


def test_nodes_started_by_hand_meet_at_the_static_endpoint():
    train = ONE_NODE | {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "node0:29400"}
    argv = command(train, ["train.py"], env={"SLURM_JOB_ID": "7"})  # an endpoint wins over Slurm
    assert argv[3:] == [
        "--nproc_per_node=4",
        "--nnodes=2",
        "--node_rank=1",
        "--rdzv_backend=static",
        "--rdzv_endpoint=node0:29400",
        "train.py",
    ]


def test_several_nodes_without_slurm_or_an_endpoint_name_the_keys():
    with pytest.raises(KilnError, match="train.nnodes: 2 nodes need a Slurm allocation.*train.rdzv_endpoint"):
        command(ONE_NODE | {"nnodes": 2}, ["train.py"], env={})


def test_each_rank_gets_its_share_of_compile_workers_and_expandable_segments_unless_set():
    env = rank_environment(8, env={}, cpus=64)
    assert env == {"TORCHINDUCTOR_COMPILE_THREADS": "8", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert rank_environment(1, env={}, cpus=96)["TORCHINDUCTOR_COMPILE_THREADS"] == "32"  # inductor's own cap
    assert rank_environment(8, env={}, cpus=4)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    assert rank_environment(8, env=mine, cpus=64) == {}
    # and torchrun's ranks see them
    probe = "import os, sys; sys.exit(int(os.environ['TORCHINDUCTOR_COMPILE_THREADS']))"
    assert run_ranks([sys.executable, "-c", probe], {"TORCHINDUCTOR_COMPILE_THREADS": "7"}) == 7


def test_the_module_reports_the_error_in_one_line_and_exits_1():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kiln.train.launch",
            "--train",
            '{"nproc_per_node": 1, "nnodes": 3, "node_rank": 0, "rdzv_endpoint": ""}',
            "--",
            "train.py",
        ],
        capture_output=True,
        text=True,
        env={"PATH": ""},
    )
    assert result.returncode == 1 and "train.nnodes: 3 nodes need a Slurm allocation" in result.stderr


def test_the_launcher_exits_with_the_code_a_rank_left_else_its_childs():
    # What kiln.stage.run_main does on a rank that stops with a Kiln exit code, then torchrun's exit 1.
    rank = (
        "import json, os, sys; json.dump({'code': 75, 'message': 'preempted'}, "
        "open(os.environ['KILN_EXIT_FILE'], 'w')); sys.exit(1)"
    )
    before = signal.getsignal(signal.SIGTERM)
    assert run_ranks([sys.executable, "-c", rank]) == 75
    assert signal.getsignal(signal.SIGTERM) is before  # its wait-through handlers are gone again
    assert run_ranks([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert run_ranks([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) == 137
    env = "import os, sys; sys.exit(0 if os.environ['PET_SIGNALS_TO_HANDLE'].endswith('SIGUSR1') else 1)"
    assert run_ranks([sys.executable, "-c", env]) == 0  # torchrun is asked to pass SIGUSR1 on


def test_a_resubmitted_train_job_trains_only_after_a_preemption(tmp_path, capsys):
    """Snakemake resubmits a failed train job whatever failed (train.max_resubmits): attempt 2 onwards
    goes on after exit 75 or a job that left no code (killed at its limit), and after any other code
    exits at once with it, recording that, so each further resubmission does the same."""
    record = tmp_path / "train" / "jobs.jsonl"
    args = ["--train", json.dumps(ONE_NODE), "--max-resubmits", "2", "--record", str(record), "--", "train.py"]

    def write(*codes):
        record.parent.mkdir(exist_ok=True)
        record.write_text("".join(json.dumps({"attempt": n + 1, "code": c}) + "\n" for n, c in enumerate(codes)))

    assert resubmission_refused(record, 1, 2) is None  # no record yet: a first attempt always trains
    write(1)
    assert resubmission_refused(record, 1, 2) is None  # a new snakemake command after a fix: attempt 1 again
    write(None, 75)
    assert resubmission_refused(record, 2, 2) is None
    write(None, 75, None)  # attempt 2 started and was killed without a code
    assert resubmission_refused(record, 3, 2) is None
    assert resubmission_refused(record, 4, 2)[0] == 75  # past train.max_resubmits (a sweep's larger bound)

    write(None, 1)  # a config error, a crash
    with record.open("a") as f:  # the failed job's end line names the copy of its log
        f.write(json.dumps({"attempt": 1, "code": 1, "log": "logs/train.job-41.log"}) + "\n")
    assert main(["--attempt", "2", *args]) == 1
    err = capsys.readouterr().err
    assert "not training, the job before it exited with code 1, not 75 (preempted)" in err
    assert "its log: logs/train.job-41.log" in err
    assert json.loads(record.read_text().splitlines()[-1])["code"] == 1  # the next resubmission refuses too
    assert main(["--attempt", "3", *args]) == 1
    write(None, 76)
    assert main(["--attempt", "2", *args]) == 76  # a non-finite loss comes back on a resume
    write(None, 0)  # finished; Snakemake failed the job over its outputs: never train it again
    assert main(["--attempt", "2", *args]) == 0


# A rank whose handler cannot end it: as a rank blocked in a CUDA call or an NCCL collective, whose
# Python handler never runs. It says it is ready, then waits far longer than any test.
DEAF_RANK = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *args: None)
pathlib.Path(sys.argv[1], os.environ["RANK"]).touch()
time.sleep(900)
"""


def test_torchruns_own_files_go_in_the_launchers_folder_and_leave_with_it(tmp_path):
    """torchrun makes a folder per run for its ranks' error files, in /tmp by default, and never removes
    it (one per train job on a node); the launcher points it into its own temporary folder."""
    note = tmp_path / "error_file"
    script = tmp_path / "rank.py"
    script.write_text(
        f"import os, pathlib\npathlib.Path({str(note)!r}).write_text(os.environ['TORCHELASTIC_ERROR_FILE'])\n"
    )
    assert run_ranks(command(ONE_NODE | {"nproc_per_node": 1}, [str(script)])) == 0
    error_file = Path(note.read_text())
    assert "kiln-launch-" in str(error_file), error_file
    [launch_folder] = [p for p in error_file.parents if p.name.startswith("kiln-launch-")]
    assert error_file.is_relative_to(launch_folder / "torchelastic") and not launch_folder.exists()


def test_the_smoke_stages_ranks_are_killed_30_s_after_a_signal_not_trains_10_minutes(tmp_path):
    """Slurm cancels a smoke job (scancel: SIGTERM to every process of the step): torchrun passes it on,
    the ranks cannot act on it, and torchrun kills them after the smoke stage's shutdown timeout,
    since they save nothing; train's 10 minutes would hold the node for nothing."""
    script = tmp_path / "deaf_rank.py"
    script.write_text(DEAF_RANK)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "kiln.train.launch", "--train", json.dumps(ONE_NODE | {"nproc_per_node": 2})]
        + ["--stage", "smoke", "--", str(script), str(tmp_path)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while len(list(tmp_path.glob("[01]"))) < 2:  # both ranks started and deaf
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        os.killpg(launcher.pid, signal.SIGTERM)
        signalled = time.monotonic()
        code = launcher.wait(timeout=300)  # train's 600 s would run past this
        waited = time.monotonic() - signalled
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert code != 0 and waited >= SHUTDOWN_TIMEOUT_S["smoke"] - 1  # killed after its timeout, not before
    assert SHUTDOWN_TIMEOUT_S["smoke"] <= 60 < SHUTDOWN_TIMEOUT_S["train"]
