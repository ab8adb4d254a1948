"""A real two-node Slurm cluster on this one machine, for tests (Debian's slurm-wlm 22.05).

What it brings up, all as root, with every state, spool, pid, socket and log file under one state
folder (default /tmp/kiln-slurm):

    munged -> mariadbd (127.0.0.1 + socket) -> slurmdbd -> slurmctld -> slurmd -N n1, slurmd -N n2

Two nodes, n1 and n2, each declared as a GPU node (32 CPUs, 256 GB, 8 GPUs: character devices
like /dev/null under <state>/gpu), and two partitions over both nodes: `cpu` (the default) and
`gpu`, the names profiles/slurm requests with `slurm_partition`. Accounting runs through slurmdbd
so `sacct` works (the executor plugin polls with sacct and hangs without it).

Use:
    cluster = up()                  # installs the packages if needed, reuses a healthy cluster
    subprocess.run(["srun", ...], env=cluster.env(), check=True)
    cluster.sacct([job_id])         # -> [{"JobID": ..., "State": "COMPLETED", ...}]
    cluster.stop()

By hand:  python tests/slurm/cluster.py up|down|status [--state DIR]

Snakemake against this cluster: pass `--executor slurm --slurm-init-seconds-before-status-checks 2`.
The plugin waits 40 s before its first status check by default; with 2 s a two-job chain takes
~30 s instead of ~2 min (see /work/shared/NOTES.md).

Outside the state folder this touches only: the Debian packages, /etc/hosts (adds
`127.0.0.1 n1 n2`) and /etc/slurm/slurm.conf, a symlink to <state>/etc/slurm.conf. The symlink is
there because the slurm-jobstep plugin strips SLURM_* variables (SLURM_CONF included) before its
inner `srun`, which then falls back to the compiled-in /etc/slurm/slurm.conf. Ports are fixed (PORTS)
and the symlink is global: one such cluster per machine at a time. stop() removes it again.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE = Path(os.environ.get("KILN_SLURM_STATE", "/tmp/kiln-slurm"))
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server"]
# Everything we start or call; all come from PACKAGES.
BINARIES = [
    "munged",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "sacct",
    "sacctmgr",
    "sinfo",
    "scontrol",
]

CLUSTER_NAME = "kiln"
NODES = ("n1", "n2")
GPUS_PER_NODE = 8
PARTITIONS = ("cpu", "gpu")
# Ports away from Slurm's and MariaDB's defaults (6817-6819, 3306), so a real installation on the
# same machine is not disturbed.
PORTS = {"slurmctld": 17817, "slurmdbd": 17819, "mariadb": 17306, "n1": 17001, "n2": 17002}
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES) + "  # kiln tests/slurm/cluster.py"

SACCT_FIELDS = ["JobID", "JobName", "State", "AllocTRES", "NNodes", "NodeList", "ExitCode", "Start", "End"]
DONE_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster at all (not Linux, not root, no packages and no apt)."""


class SlurmError(RuntimeError):
    """Installation or start-up broke on a machine where it should work."""


# --- configuration text ---------------------------------------------------------------------------


def slurm_conf(state: Path) -> str:
    host = socket.gethostname().split(".")[0]
    nodes = ",".join(NODES)
    node_lines = "\n".join(
        # NodeHostname is the real host (slurmd -N nX checks it); NodeAddr where slurmctld reaches it;
        # each slurmd listens on its own Port. With config_overrides (below) these figures are what
        # Slurm schedules by, whatever the machine has.
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={PORTS[n]} "
        f"CPUs=32 RealMemory=256000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for n in NODES
    )
    return f"""\
# Written by kiln tests/slurm/cluster.py; regenerated on every start.
ClusterName={CLUSTER_NAME}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={PORTS["slurmctld"]}
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
# munged runs on its own socket under the state folder, not /run/munge.
AuthInfo=socket={state}/munge/munge.socket

StateSaveLocation={state}/ctld
SlurmctldPidFile={state}/run/slurmctld.pid
SlurmctldLogFile={state}/log/slurmctld.log
# %n: one spool, pid and log file per slurmd (two slurmd on one host).
SlurmdSpoolDir={state}/d-%n
SlurmdPidFile={state}/run/slurmd-%n.pid
SlurmdLogFile={state}/log/slurmd-%n.log

# No cgroups in containers: track processes by parent pid, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
# Schedule by the node lines below, not by the 2 cores / 24 GB / 0 GPUs slurmd finds.
SlurmdParameters=config_overrides
# A node that was down comes back by itself once its slurmd registers.
ReturnToService=2
# Short waits: tests kill and restart things.
KillWait=5
InactiveLimit=0
MinJobAge=300
# Debian's default (/bin/mail) is not installed: avoids an error line in every log.
MailProg=/bin/true

GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={PORTS["slurmdbd"]}
# For the slurmdbd connection this, not AuthInfo, names the munge socket.
AccountingStoragePass={state}/munge/munge.socket
# Without this, sacct's AllocTRES has no gres/gpu=N.
AccountingStorageTRES=gres/gpu
# Job accounting sampling needs cgroups or procfs polling; not needed for sacct's job records.
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none

{node_lines}
PartitionName=cpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={nodes} MaxTime=INFINITE State=UP
"""


def gres_conf(state: Path) -> str:
    # Without File= the node reports 0 GPUs and is set INVALID; the files are char devices (1,3).
    lines = [f"NodeName={n} Name=gpu File={state}/gpu/gpu[0-{GPUS_PER_NODE - 1}]" for n in NODES]
    return "# Written by kiln tests/slurm/cluster.py\nAutoDetect=off\n" + "\n".join(lines) + "\n"


def slurmdbd_conf(state: Path) -> str:
    return f"""\
# Written by kiln tests/slurm/cluster.py (slurmdbd wants it owned by SlurmUser, mode 600).
AuthType=auth/munge
AuthInfo=socket={state}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={PORTS["slurmdbd"]}
SlurmUser=slurm
PidFile={state}/run/slurmdbd.pid
LogFile={state}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={PORTS["mariadb"]}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
"""


# --- small helpers ---------------------------------------------------------------------------------


def _which(name: str) -> str | None:
    # Root's PATH usually has /usr/sbin, but not always (e.g. under sudo or a venv's shell).
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(
    cmd: list[str], *, env: dict | None = None, check: bool = True, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"timed out after {timeout}s: {' '.join(cmd)}") from e
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


def _alive(pid: int) -> bool:
    """Running and not a zombie (a daemon we started with Popen is our child until reaped)."""
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our dead child
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _chown(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --- installation ----------------------------------------------------------------------------------


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if _which(b) is None]


def check_possible() -> None:
    """Raise SlurmUnavailable if this machine cannot run the cluster, whatever we do."""
    if platform.system() != "Linux":
        raise SlurmUnavailable(f"Slurm test cluster needs Linux, this is {platform.system()}")
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            "Slurm test cluster needs root (it starts munged, MariaDB, slurmdbd, slurmctld and two "
            f"slurmd as their own users and edits /etc/hosts); running as uid {os.geteuid()}"
        )
    missing = missing_binaries()
    if missing and _which("apt-get") is None:
        raise SlurmUnavailable(
            f"Slurm binaries missing ({', '.join(missing)}) and no apt-get to install {' '.join(PACKAGES)}"
        )


def install() -> None:
    """apt-get install the packages if any binary is missing (root only)."""
    check_possible()
    if not missing_binaries():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the packages' postinst from starting munge/mariadb/slurm as system services: we start
    # our own. Docker images usually have this file already; add it only for the install.
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = not policy.exists()
    if added_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        _run(["apt-get", "update"], env=env, timeout=600)
        _run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], env=env, timeout=1200)
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)
    if missing := missing_binaries():
        raise SlurmError(f"installed {' '.join(PACKAGES)} but still missing: {', '.join(missing)}")


# --- the cluster -----------------------------------------------------------------------------------


@dataclass
class Cluster:
    state: Path = DEFAULT_STATE
    reused: bool = False  # True when up() found this cluster already running

    # daemon name -> pid file, in start order
    def pid_files(self) -> dict[str, Path]:
        s = self.state
        files = {
            "munged": s / "munge/munged.pid",
            "mariadbd": s / "mysql-run/mariadbd.pid",
            "slurmdbd": s / "run/slurmdbd.pid",
            "slurmctld": s / "run/slurmctld.pid",
        }
        files |= {f"slurmd-{n}": s / f"run/slurmd-{n}.pid" for n in NODES}
        return files

    @property
    def conf(self) -> Path:
        return self.state / "etc/slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        """Environment for sbatch/srun/sacct/snakemake. SLURM_CONF is redundant with the
        /etc/slurm/slurm.conf symlink but says explicitly which cluster is meant."""
        return dict(os.environ if base is None else base, SLURM_CONF=str(self.conf))

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return _run(cmd, env=self.env(), check=check, timeout=timeout)

    # --- queries

    def sacct(self, job_ids=None, *, since: str | None = None, allocations: bool = True) -> list[dict]:
        """sacct rows as dicts with SACCT_FIELDS. job_ids: ids (int or str) or None; since: a sacct
        time (e.g. "now-1hour", "2024-01-01T00:00:00"); allocations=False adds the job steps."""
        cmd = ["sacct", "--parsable2", "--noheader", "--format=" + ",".join(SACCT_FIELDS)]
        if allocations:
            cmd.append("--allocations")
        if job_ids is not None:
            cmd.append("--jobs=" + ",".join(str(j) for j in job_ids))
        cmd.append("--starttime=" + (since or ("1970-01-01" if job_ids is not None else "now-1day")))
        out = self.run(cmd).stdout
        return [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]

    def wait_done(self, job_ids, timeout: float = 60) -> list[dict]:
        """Wait until sacct has every job in a final state and under its name, and return those rows.
        The record reaches slurmdbd a moment after the job ends; under load it can arrive first
        without the job's name, which slurmdbd then stores as "allocation" until the job's own start
        record fills it in (as_mysql_job_start). Every job the tests submit is named."""
        want = {str(j) for j in job_ids}
        deadline = time.monotonic() + timeout
        while True:
            rows = [r for r in self.sacct(job_ids) if r["JobID"] in want]
            if len(rows) == len(want) and all(
                r["State"].split()[0] in DONE_STATES and r["JobName"] != "allocation" for r in rows
            ):
                return rows
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"jobs {sorted(want)} not finished (or not yet under their names) after {timeout}s: {rows}"
                )
            time.sleep(0.5)

    def node_states(self) -> dict[str, list[str]]:
        """partition -> states of its nodes (sinfo -N prints a node once per partition)."""
        states = {}
        for part in PARTITIONS:
            proc = self.run(["sinfo", "-h", "-N", "-p", part, "-o", "%T"], check=False, timeout=10)
            states[part] = proc.stdout.split() if proc.returncode == 0 else []
        return states

    def daemons_alive(self) -> dict[str, bool]:
        return {name: (pid := _read_pid(f)) is not None and _alive(pid) for name, f in self.pid_files().items()}

    def working(self) -> bool:
        """All daemons up, every node in every partition up (idle or running jobs), sacct answering."""
        if not all(self.daemons_alive().values()):
            return False
        up_states = {"idle", "mixed", "allocated", "completing"}  # "idle*" etc.: not responding
        states = self.node_states()
        if not all(len(s) == len(NODES) and set(s) <= up_states for s in states.values()):
            return False
        return self._accounting_ok()

    def healthy(self) -> bool:
        """working() and every node idle: what a fresh start waits for."""
        return self.working() and all(s == ["idle"] * len(NODES) for s in self.node_states().values())

    def _accounting_ok(self) -> bool:
        # The plugin calls `sacct --clusters all`, which needs the cluster registered in slurmdbd.
        p = self.run(["sacctmgr", "-nP", "list", "cluster", "format=cluster"], check=False, timeout=10)
        if p.returncode != 0 or CLUSTER_NAME not in p.stdout.split():
            return False
        p = self.run(["sacct", "-X", "-n", "--clusters", "all", "-S", "now-1hour"], check=False, timeout=10)
        return p.returncode == 0

    def status(self) -> dict:
        return {
            "state": str(self.state),
            "daemons": self.daemons_alive(),
            "nodes": self.node_states() if self.conf.exists() else {},
        }

    # --- start and stop

    def start(self, timeout: float = 90) -> None:
        """Start every daemon on a fresh state folder and wait until the cluster is healthy."""
        s = self.state
        self.stop()
        if s.exists():  # everything but the session registry, which session() holds a lock in
            for child in s.iterdir():
                if child.name != "sessions":
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        for sub in ["etc", "gpu", "munge", "mysql", "mysql-run", "ctld", "run", "log", *[f"d-{n}" for n in NODES]]:
            (s / sub).mkdir(parents=True, exist_ok=True)
        s.chmod(0o755)
        for sub, owner, mode in [
            ("munge", "munge", 0o755),
            ("mysql", "mysql", 0o700),
            ("mysql-run", "mysql", 0o755),
            ("ctld", "slurm", 0o755),
            ("run", "slurm", 0o755),
            ("log", "slurm", 0o755),
        ]:
            _chown(s / sub, owner)
            (s / sub).chmod(mode)
        for i in range(GPUS_PER_NODE):  # fake GPUs: character devices 1,3 (like /dev/null)
            os.mknod(s / f"gpu/gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        (s / "etc/slurm.conf").write_text(slurm_conf(s))
        (s / "etc/gres.conf").write_text(gres_conf(s))
        dbd = s / "etc/slurmdbd.conf"
        dbd.write_text(slurmdbd_conf(s))
        _chown(dbd, "slurm")
        dbd.chmod(0o600)
        _link_system_conf(self.conf)
        _ensure_hosts()

        env = self.env()
        self._start_munge()
        self._start_mariadb()
        _run(["slurmdbd"], env=env)
        self._wait(lambda: _port_open(PORTS["slurmdbd"]), 30, "slurmdbd listening", "log/slurmdbd.log")
        _run(["slurmctld"], env=env)
        self._wait(
            lambda: self.run(["scontrol", "ping"], check=False, timeout=10).returncode == 0,
            30,
            "slurmctld answering",
            "log/slurmctld.log",
        )
        for n in NODES:
            _run(["slurmd", "-N", n], env=env)
        self._wait(
            self.healthy,
            timeout,
            "both nodes idle and sacct answering",
            *(f"log/slurmd-{n}.log" for n in NODES),
            "log/slurmctld.log",
            "log/slurmdbd.log",
        )
        (s / "config.sha256").write_text(_config_hash(s))

    def _start_munge(self) -> None:
        m = self.state / "munge"
        _run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                _which("munged"),
                f"--socket={m}/munge.socket",
                f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log",
                f"--seed-file={m}/munged.seed",
                "--key-file=/etc/munge/munge.key",
            ]
        )
        self._wait(lambda: (m / "munge.socket").exists(), 10, "munged socket", "munge/munged.log")

    def _start_mariadb(self) -> None:
        s = self.state
        sock = s / "mysql-run/mysqld.sock"
        _run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={s}/mysql",
                "--user=mysql",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ],
            timeout=120,
        )
        log = open(s / "log/mariadbd.log", "ab")
        # mariadbd does not daemonize: its own session, so it outlives this process and Ctrl-C.
        subprocess.Popen(
            [
                _which("mariadbd"),
                "--no-defaults",
                f"--datadir={s}/mysql",
                "--user=mysql",
                "--bind-address=127.0.0.1",
                f"--port={PORTS['mariadb']}",
                f"--socket={sock}",
                f"--pid-file={s}/mysql-run/mariadbd.pid",
                "--skip-name-resolve",
                # small and quick: a test database of a few rows
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        client = [_which("mariadb"), "--no-defaults", f"--socket={sock}", "-uroot"]
        self._wait(
            lambda: _run([*client, "-e", "select 1"], check=False).returncode == 0,
            60,
            "MariaDB answering",
            "log/mariadbd.log",
        )
        _run(
            [*client],
            input=(
                "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';\n"
                "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';\n"
                "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n"
                "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';\n"
            ),
        )

    def _wait(self, ok, timeout: float, what: str, *logs: str) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {self.state / lg}\n{_tail(self.state / lg)}" for lg in logs)
                raise SlurmError(
                    f"Slurm test cluster: no {what} after {timeout}s (daemons alive: {self.daemons_alive()})\n{tails}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 20) -> None:
        """Stop every daemon by its pid file, last started first (SIGTERM, then SIGKILL)."""
        for name, f in reversed(list(self.pid_files().items())):
            pid = _read_pid(f)
            if pid is None or not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            f.unlink(missing_ok=True)
        # With no controller to answer, a config left in /etc makes every Slurm client wait ~9 s for it:
        # the Slurm executor plugin runs `scontrol show config` each time Snakemake starts.
        if SYSTEM_CONF.is_symlink() and SYSTEM_CONF.resolve() == self.conf.resolve():
            SYSTEM_CONF.unlink()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _config_hash(state: Path) -> str:
    text = slurm_conf(state) + gres_conf(state) + slurmdbd_conf(state)
    return hashlib.sha256(text.encode()).hexdigest()


def _link_system_conf(conf: Path) -> None:
    """Point /etc/slurm/slurm.conf at our config; never replace a config someone else wrote."""
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    if SYSTEM_CONF.is_symlink() or not SYSTEM_CONF.exists():
        SYSTEM_CONF.unlink(missing_ok=True)
        SYSTEM_CONF.symlink_to(conf)
    elif "Written by kiln" not in SYSTEM_CONF.read_text(errors="replace"):
        raise SlurmError(
            f"{SYSTEM_CONF} exists and was not written by this module: not replacing it "
            "(this machine seems to have a real Slurm configuration)"
        )


def _ensure_hosts() -> None:
    """n1 and n2 resolve to 127.0.0.1 (jobs may use the first node's name as a rendezvous host)."""
    hosts = Path("/etc/hosts")
    text = hosts.read_text()
    for line in text.splitlines():
        names = line.split("#")[0].split()
        if names[:1] == ["127.0.0.1"] and all(n in names[1:] for n in NODES):
            return
    hosts.write_text(text + ("" if text.endswith("\n") else "\n") + HOSTS_LINE + "\n")


def up(state: Path | str = DEFAULT_STATE, *, install_packages: bool = True, timeout: float = 90) -> Cluster:
    """A working cluster on `state`: reuses one already running there (same config, daemons up,
    nodes up, possibly running jobs), otherwise tears down whatever is left (stale: a dead daemon, a
    down node, another config) and starts afresh, waiting until both nodes are idle in every
    partition and sacct answers. Installs the packages first if needed."""
    cluster = Cluster(Path(state))
    check_possible()
    if install_packages:
        install()
    elif missing := missing_binaries():
        raise SlurmUnavailable(f"Slurm binaries missing: {', '.join(missing)}")
    same_config = (cluster.state / "config.sha256").exists() and (
        cluster.state / "config.sha256"
    ).read_text() == _config_hash(cluster.state)
    if same_config and all(cluster.daemons_alive().values()):
        try:  # reuse it even while it runs jobs (another test session may be using it)
            cluster._wait(cluster.working, 10, "working cluster")
            cluster.reused = True
            return cluster
        except SlurmError:
            pass
    cluster.start(timeout=timeout)
    return cluster


@contextmanager
def session(state: Path | str = DEFAULT_STATE, *, keep: bool = False):
    """up() for one user of the cluster (a pytest session), stopping it when the last user that
    needs it leaves. Several sessions may share one cluster at once: up() runs under a lock, each
    session registers its pid under <state>/sessions, and the cluster is stopped only when no other
    live session is registered and a session started it (one brought up by hand stays up), unless
    keep (then the next session reuses it in under a second)."""
    state = Path(state)
    registry = state / "sessions"
    registry.mkdir(parents=True, exist_ok=True)
    me = registry / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # <pid>-<nonce>: one per session()
    started_by_sessions = registry / "started"
    with _locked(registry / "lock"):
        cluster = up(state)
        if not cluster.reused:
            started_by_sessions.touch()
        me.touch()
    try:
        yield cluster
    finally:
        with _locked(registry / "lock"):
            me.unlink(missing_ok=True)
            others = [
                p for p in registry.glob("*-*") if p.name.split("-")[0].isdigit() and _alive(int(p.name.split("-")[0]))
            ]
            if not keep and not others and started_by_sessions.exists():
                cluster.stop()
                started_by_sessions.unlink()


@contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def down(state: Path | str = DEFAULT_STATE) -> None:
    Cluster(Path(state)).stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["install", "up", "down", "status"])
    ap.add_argument("--state", type=Path, default=DEFAULT_STATE, help="state folder (%(default)s)")
    args = ap.parse_args(argv)
    if args.action == "install":  # the Debian packages only (.ci/run, before the tests)
        try:
            install()
        except SlurmUnavailable as e:  # the Slurm tests skip here, saying why
            print(f"not installed: {e}")
            return 0
        print("installed: " + " ".join(BINARIES))
    elif args.action == "up":
        t0 = time.monotonic()
        cluster = up(args.state)
        # brought up by hand: test sessions that reuse it leave it running
        (args.state / "sessions/started").unlink(missing_ok=True)
        how = "reused" if cluster.reused else "started"
        print(f"{how} in {time.monotonic() - t0:.1f}s; export SLURM_CONF={cluster.conf}")
    elif args.action == "down":
        down(args.state)
        print("stopped")
    else:
        cluster = Cluster(args.state)
        print(json.dumps(cluster.status(), indent=2))
        return 0 if cluster.working() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
