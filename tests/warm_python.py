"""A `python` that starts warm, for the DAG tests' Snakemake and its stage jobs (tests/tiny.py's
snakemake, the hundreds of tests/dag/test_tags.py, tests/dag/test_run_configs.py's dry runs).

Each job of a rule is `python <script> ...` or `python -m kiln.train.launch ... -- <script> ...`, and
a fresh interpreter spends ~2 s importing torch and Kiln before the stage's own work (a fraction of a
second on the tests' configs); `python -m snakemake` spends ~1.5 s importing Snakemake. Here one
server process imports every stage script's modules once and forks a child per job: the child takes the job's stdin, stdout and stderr (the shim passes them over a
Unix socket), its working directory, environment and argv, and runs the script as `python` would
(runpy, as __main__). The shim, put first on PATH as `python`, waits for the child's exit code and
exits with it, so Snakemake sees an ordinary process.

kiln.train.launch is process plumbing (torchrun for the ranks, resubmission records): a one-rank
launch runs its script in the child directly, with the environment torchrun gives rank 0 of 1. Any
other invocation (several ranks, `python -c`, a tool) execs the real interpreter unchanged.

Children fork from a process that has imported torch but never run an op, so no thread pool is
inherited half-started."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path

from kiln.train.launch import LAUNCH_START_ENV

SCRIPTS = Path(__file__).resolve().parents[1] / "workflow" / "scripts"
LAUNCH = "kiln.train.launch"
ONE_RANK = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}

SHIM = """#!{python} -IS
import json, os, socket, sys
argv = sys.argv[1:]
if not argv or not (argv[0].endswith(".py") or argv[0] == "-m"):
    os.execv({python!r}, [{python!r}, *argv])
sock = socket.socket(socket.AF_UNIX)
sock.connect({socket!r})
body = json.dumps({{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(sock, [len(body).to_bytes(8, "big")], [0, 1, 2])
sock.sendall(body)
code = sock.recv(4)
sys.exit(int.from_bytes(code, "big", signed=True) if len(code) == 4 else 70)
"""


def start(folder: Path) -> tuple[subprocess.Popen, Path]:
    """The warm interpreter's server, serving from folder/warm.sock once it has imported everything,
    and the folder holding its `python` shim (for the front of PATH). The server runs in a session of
    its own: killing its process group ends the jobs it forked too."""
    sock = folder / "warm.sock"
    server = subprocess.Popen(
        [sys.executable, __file__, str(sock)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert server.stdout.readline().strip() == "ready", "the warm interpreter did not start"
    write_shim(folder / "bin", sock)
    return server, folder / "bin"


def write_shim(bin_dir: Path, socket_path: Path) -> Path:
    """bin_dir/python: the shim that hands its job to the server at socket_path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "python"
    shim.write_text(SHIM.format(python=sys.executable, socket=str(socket_path)))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim


# What a stage imports only when it needs it (seconds each): lm-eval's tasks, transformers' tokenizer
# class for the Hugging Face export; and Snakemake's command line, for `python -m snakemake` itself
# (tests/tiny.py's snakemake: ~1.5 s of imports, pandas and sqlalchemy among them, each run).
LAZY = ("lm_eval", "lm_eval.models", "lm_eval.tasks", "transformers", "snakemake.cli")


def _preload() -> None:
    """Import what every stage script imports (each loaded under another name: its main() not run),
    and LAZY."""
    for script in sorted(SCRIPTS.glob("*.py")):
        runpy.run_path(str(script), run_name=f"warm_{script.stem}")
    for module in LAZY:
        importlib.import_module(module)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("the shim hung up")
        body += chunk
    return json.loads(body), fds


def _job_argv(argv: list[str], env: dict) -> list[str] | None:
    """The script and its arguments the child runs (argv[0] the script or `-m module`), or None where the
    real interpreter must run the job (a launch of several ranks)."""
    if argv[:2] != ["-m", LAUNCH]:
        return argv
    ranks = json.loads(argv[argv.index("--train") + 1])
    if ranks["nproc_per_node"] != 1 or ranks["nnodes"] != 1:
        return None
    env.update(ONE_RANK)
    return argv[argv.index("--") + 1 :]


def _run_job(request: dict, fds: list[int]) -> None:
    """In the job's child: become the job, run it, exit with its code. Never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env = dict(request["env"])
        # a stage's start-up is timed from its launcher's start (kiln.train.launch), else from its
        # imports, which here are the server's: the job starts now
        env.setdefault(LAUNCH_START_ENV, str(time.time()))
        argv = _job_argv(request["argv"], env)
        os.environ.clear()
        os.environ.update(env)
        if argv is None:
            os.execv(sys.executable, [sys.executable, *request["argv"]])
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _handle(conn: socket.socket) -> None:
    """In a connection's child: fork the job, wait for it, answer its exit code. Never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_job(request, fds)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    conn.sendall(os.waitstatus_to_exitcode(status).to_bytes(4, "big", signed=True))
    os._exit(0)


def serve(socket_path: Path) -> None:
    _preload()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(socket_path))
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the connection children reap themselves
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            _handle(conn)
        conn.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
