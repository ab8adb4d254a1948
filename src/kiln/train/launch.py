"""How the smoke and train stages start their ranks: `python -m kiln.train.launch --train JSON
[--attempt N --max-resubmits N --record FILE --log FILE] -- script ARGS...` (torch-free until it hands over to torchrun).

- One node: `torchrun --standalone` (a private rendezvous on a free local port), nproc_per_node ranks.
- Several nodes inside a Slurm allocation (the job the slurm profile submits for train.nnodes nodes,
  one task per node): one `srun` step runs torchrun once on every node; torchrun's c10d rendezvous
  meets on the allocation's first host, on a port derived from the job id, with the job id as the
  rendezvous id. Nothing in the config names a host, and torchrun gives each node its rank.
- Several nodes without Slurm: the same command on every node, each with its own train.node_rank and
  node 0's host:port as train.rdzv_endpoint (torchrun's static rendezvous).

Every rank writes to the same log (srun forwards each task's output); only rank 0 writes files.

The launcher waits for torchrun and exits with the ranks' own code (kiln.errors.ExitCode: 75 after
a preemption save, 76 after a non-finite step), which a rank leaves in a file the launcher names in
KILN_EXIT_FILE: torchrun itself reports any failed rank as 1. It makes torchrun pass SIGUSR1 on to the
ranks too (its defaults are SIGTERM, SIGINT, SIGHUP, SIGQUIT) and give them SHUTDOWN_TIMEOUT_S to save
before it kills them: 10 minutes for train's checkpoint, 30 s for the smoke stage (`--stage smoke`).
It passes no signal on itself: Slurm signals every process of a job step and a terminal its
foreground group, so torchrun gets each signal already, and a second copy would cut its
graceful shutdown short. (The train rule execs it, so no shell between Snakemake and it dies first.)

Each rank's environment (rank_environment), unless the user set the variable: the CUDA caching
allocator with expandable segments (PYTORCH_ALLOC_CONF=expandable_segments:True, as torchtitan
advises: fewer fragmented blocks at a large model's peak), and TORCHINDUCTOR_COMPILE_THREADS, this
node's CPUs shared among its ranks (at most inductor's own cap of 32): inductor would otherwise start
min(32, CPUs) compile workers in every rank, 8 ranks x 32 processes against the node's memory.

Resubmission (train.max_resubmits): under a cluster executor Snakemake resubmits a failed train job
(the `retries` the Snakefile's onstart sets on the rule), whatever made it fail. The train rule hands
the launcher its Snakemake attempt and `--record` (train/jobs.jsonl, kiln.layout.TRAIN_JOBS), where
every job leaves a line as it starts and one with its exit code as it ends. A resubmission (attempt
2 onwards) trains only when the job before it was preempted (exit 75: Slurm's time-limit warning, a
preemption) or died without a code (killed at its time limit, a lost node); after any other code (a
config error, a crash, a non-finite loss) it exits at once with that code, so a real error costs
seconds per remaining resubmission, not a day of GPUs. After exit 0 (the run finished, and Snakemake
failed the job for outputs it did not see in time) it exits 0 at once rather than train it again.
A job that fails keeps a copy of its log beside it (logs/train.job-<Slurm job id>.log, named in its
jobs.jsonl line), since Snakemake deletes the log before the next attempt starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from kiln.errors import EXIT_FILE_ENV, ExitCode, KilnError
from kiln.io import last_json_line

RDZV_BASE_PORT = 29500  # torchrun's default; a Slurm job adds job id % RDZV_PORT_SPAN to it
RDZV_PORT_SPAN = 1000
# How long torchrun lets the ranks finish a step and save after it passed a signal on, before SIGKILL,
# by stage: train's ranks save a checkpoint (torchrun's default, 30 s, is short for a large model's);
# the smoke stage's save nothing, and a rank blocked in a CUDA call or an NCCL collective never runs
# its handler, so waiting longer only holds the node. Slurm's own kill still bounds either. (When a
# rank fails rather than a signal arriving, torch 2.13's agent stops the others after a fixed 30 s,
# whatever this says: measured in docs/benchmarks.md, "A failed rank's neighbours".)
SHUTDOWN_TIMEOUT_S = {"train": 600, "smoke": 30}
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
LAUNCH_START_ENV = "KILN_LAUNCH_START"  # epoch seconds when the launcher started the stage
WAIT_THROUGH = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def slurm_job(job_id: str) -> dict[str, str]:
    """A Slurm job's fields (NodeList, NumNodes, CPUs/Task, ...) from `scontrol show job`. Read from
    Slurm rather than the environment: the slurm executor plugin strips every SLURM_* variable but
    the job id from a job's command, so the nested srun starts from a clean slate."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True, check=True)
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def slurm_hostnames(nodelist: str) -> list[str]:
    """The hosts of a Slurm node list (`n[1-2]` -> n1, n2), expanded by Slurm itself."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def command(train: Mapping, script: Sequence[str], env: Mapping[str, str] = os.environ) -> list[str]:
    """The argv that starts train.nproc_per_node x train.nnodes ranks running `script`."""
    nproc, nnodes = train["nproc_per_node"], train["nnodes"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1 and not train["rdzv_endpoint"]:
        return [*torchrun, "--standalone", *script]
    if train["rdzv_endpoint"]:
        return [
            *torchrun,
            f"--nnodes={nnodes}",
            f"--node_rank={train['node_rank']}",
            "--rdzv_backend=static",
            f"--rdzv_endpoint={train['rdzv_endpoint']}",
            *script,
        ]
    if "SLURM_JOB_ID" not in env:
        raise KilnError(
            f"train.nnodes: {nnodes} nodes need a Slurm allocation of {nnodes} nodes (snakemake "
            "--profile profiles/slurm) or, started by hand on each node, train.rdzv_endpoint and "
            "train.node_rank"
        )
    job = env["SLURM_JOB_ID"]
    fields = slurm_job(job)
    hosts = slurm_hostnames(fields["NodeList"])
    if len(hosts) != nnodes:
        raise KilnError(
            f"train.nnodes: {nnodes}, but Slurm job {job} holds {len(hosts)} node(s) "
            f"({', '.join(hosts)}): the rule's `nodes` resource must follow train.nnodes"
        )
    port = RDZV_BASE_PORT + int(job) % RDZV_PORT_SPAN
    step = ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if fields.get("CPUs/Task", "").isdigit():  # since Slurm 22.05 a step no longer inherits the job's value
        step.append(f"--cpus-per-task={fields['CPUs/Task']}")
    return [
        *step,
        *torchrun,
        f"--nnodes={nnodes}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={hosts[0]}:{port}",
        f"--rdzv_id={job}",
        *script,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--train", required=True, help="train.nproc_per_node, nnodes, node_rank and rdzv_endpoint as JSON"
    )
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt of this job (1: the first)")
    parser.add_argument("--max-resubmits", type=int, default=0, help="train.max_resubmits: attempts past the first")
    parser.add_argument(
        "--record",
        type=Path,
        help="train/jobs.jsonl: a line per job as it starts and ends; with "
        "--attempt > 1 the job trains only if the one before it was preempted",
    )
    parser.add_argument(
        "--log",
        type=Path,
        help="the job's log (the rule's); with --record, a job that fails keeps "
        "a copy beside it, since Snakemake deletes the log before the next attempt",
    )
    parser.add_argument(
        "--stage",
        choices=sorted(SHUTDOWN_TIMEOUT_S),
        default="train",
        help="the stage whose ranks these are: how long torchrun waits for them after a signal (SHUTDOWN_TIMEOUT_S)",
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- then the script and its arguments")
    args = parser.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("no script given after --")
    try:
        train = json.loads(args.train)
        argv_out = command(train, script)
    except KilnError as exc:
        print(f"kiln.train.launch: {exc}", file=sys.stderr)
        return 1
    if args.record is not None:
        refused = resubmission_refused(args.record, args.attempt, args.max_resubmits)
        _record(args.record, args.attempt, None if refused is None else refused[0])
        if refused is not None:
            print(f"kiln.train.launch: {refused[1]}", file=sys.stderr, flush=True)
            return refused[0]
    print("launch:", " ".join(argv_out[: argv_out.index(script[0])]), file=sys.stderr, flush=True)
    code = run_ranks(argv_out, rank_environment(train["nproc_per_node"]), SHUTDOWN_TIMEOUT_S[args.stage])
    if args.record is not None:
        _record(args.record, args.attempt, code, _keep_log(args.log) if code else None)
    return code


RETRYABLE = (ExitCode.PREEMPTED, None)  # None: the job before left no code (killed at its limit, a lost node)


def resubmission_refused(record: Path, attempt: int, max_resubmits: int) -> tuple[int, str] | None:
    """(exit code, why) when this attempt of a train job must not train, else None: a first attempt
    always trains; a resubmission only after a preemption (RETRYABLE), at most max_resubmits times."""
    if attempt <= 1:
        return None
    last = last_json_line(record)
    code = None if last is None else last.get("code")
    log_named = f"; its log: {last['log']}" if last and last.get("log") else ""
    if code == ExitCode.OK:  # trained to the end; Snakemake failed the job after (outputs not seen in time)
        return 0, (
            f"resubmission {attempt - 1}: not training again, the job before it finished (exit 0); "
            "Snakemake checks its outputs once more"
        )
    if code not in RETRYABLE:
        return int(code), (
            f"resubmission {attempt - 1}: not training, the job before it exited with code {code}, "
            f"not {int(ExitCode.PREEMPTED)} (preempted) ({record}{log_named}); only a preempted "
            "train job is resubmitted: fix what that log names and run the same command again"
        )
    if attempt - 1 > max_resubmits:
        return int(ExitCode.PREEMPTED), (
            f"resubmission {attempt - 1}: not training, train.max_resubmits is "
            f"{max_resubmits}; run the same command again to continue"
        )
    return None


def _keep_log(log: Path | None) -> str | None:
    """A copy of a failed job's log beside it (train.job-<Slurm job id or time>.log): the next attempt
    starts by deleting the log (Snakemake does), and would otherwise take the reason with it."""
    if log is None or not log.is_file():
        return None
    tag = os.environ.get("SLURM_JOB_ID") or time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    kept, n = log.with_name(f"{log.stem}.job-{tag}{log.suffix}"), 1
    while kept.exists():  # two failed jobs within one second: keep both
        kept, n = log.with_name(f"{log.stem}.job-{tag}-{n}{log.suffix}"), n + 1
    try:
        sys.stderr.flush()
        shutil.copyfile(log, kept)
    except OSError as exc:
        print(f"kiln.train.launch: could not keep a copy of {log}: {exc}", file=sys.stderr, flush=True)
        return None
    return str(kept)


def _record(record: Path, attempt: int, code: int | None, log: str | None = None) -> None:
    """A line in train/jobs.jsonl: this job's attempt, Slurm job id and host, its exit code (None as it
    starts) and, after a failure, where its log was kept. Appended and flushed at once: a kill
    mid-job leaves the start line as the last."""
    entry = {
        "attempt": attempt,
        "code": code,
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
        "time": time.time(),
    } | ({"log": log} if log else {})
    Path(record).parent.mkdir(parents=True, exist_ok=True)
    with open(record, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


INDUCTOR_MAX_THREADS = 32  # inductor's own cap on compile workers per process (torch._inductor.config)


def rank_environment(nproc_per_node: int, env: Mapping[str, str] = os.environ, cpus: int | None = None) -> dict:
    """The variables the ranks get beside `env` (see the module's doc); one the user set is kept."""
    cpus = cpus or len(os.sched_getaffinity(0))
    out = {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, min(INDUCTOR_MAX_THREADS, cpus // nproc_per_node)))}
    if "PYTORCH_ALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in env:
        out["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    return {key: value for key, value in out.items() if key not in env}


def run_ranks(
    argv: list[str], ranks_env: Mapping[str, str] | None = None, shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S["train"]
) -> int:
    """Run torchrun (or srun) with `argv`, `ranks_env` added to this environment, and return the exit
    code the ranks reported, else its own; torchrun gives the ranks shutdown_timeout_s after it passes
    a signal on."""
    env = dict(os.environ) | dict(ranks_env or {})
    env.setdefault(LAUNCH_START_ENV, repr(time.time()))  # the smoke stage times train's start-up from it
    # torchrun's --signals-to-handle (read from PET_*; older versions read TORCHELASTIC_* directly)
    env.setdefault("PET_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
    env.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout_s))
    with tempfile.TemporaryDirectory(prefix="kiln-launch-") as folder:
        exit_file = Path(folder) / "exit.json"
        env[EXIT_FILE_ENV] = str(exit_file)
        # torchrun's --log-dir (its ranks' error files): by default a new /tmp/torchelastic_* per run,
        # never removed; here it goes with this folder (on the other nodes of an srun step, that path)
        env.setdefault("PET_LOG_DIR", str(Path(folder) / "torchelastic"))
        proc = subprocess.Popen(argv, env=env)
        # These reached torchrun too: wait for the ranks to save and exit.
        previous = {sig: signal.signal(sig, _note_signal) for sig in WAIT_THROUGH}
        try:
            returncode = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if exit_file.exists():
            code = json.loads(exit_file.read_text(encoding="utf-8"))["code"]
            try:
                name = ExitCode(code).name
            except ValueError:
                name = "?"
            print(f"kiln.train.launch: the ranks exited with code {code} ({name})", file=sys.stderr, flush=True)
            return code
    return returncode if returncode >= 0 else 128 - returncode


def _note_signal(signum: int, frame) -> None:
    print(
        f"kiln.train.launch: {signal.Signals(signum).name} received; waiting for the ranks to save and exit",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
