"""The one exception type for bad input: a message a user can act on, naming the key, file or column;
and the exit codes a stage ends with (docs/operations.md, "When a run dies", lists them)."""

from __future__ import annotations

from enum import IntEnum

# Set by kiln.train.launch to a file in a folder of its own: a rank that stops with a Kiln exit code
# writes the code there (kiln.stage.run_main), and the launcher exits with it.
EXIT_FILE_ENV = "KILN_EXIT_FILE"


class ExitCode(IntEnum):
    """What a stage's exit status means. kiln.train.launch hands the ranks' code on through
    torchrun (which would report every failure as 1)."""

    OK = 0
    ERROR = 1  # a KilnError (config, data, files, disk full) or a crash: the log's last lines say which
    # A preemption signal (SIGTERM, SIGUSR1): every rank saved a checkpoint at the same step. The value
    # is sysexits' EX_TEMPFAIL, "try again later": rerunning continues from the next step.
    PREEMPTED = 75
    # The loss or gradient norm was not finite (or train.nonfinite.max_skips batches were skipped):
    # the update was not applied and nothing was saved after it; the message names the last good
    # checkpoint, which a rerun resumes from.
    NONFINITE = 76


class KilnError(ValueError):
    """Expected failure caused by input (config, data, files); stage scripts print it without a traceback."""

    exit_code = ExitCode.ERROR


class ConfigError(KilnError):
    """A run config that cannot run: one line per problem, each starting with the dotted key path."""


class RunStopped(KilnError):
    """The run stopped itself on purpose, with `exit_code` (PREEMPTED or NONFINITE) and a message saying
    which checkpoint a rerun continues from."""

    def __init__(self, message: str, exit_code: ExitCode):
        super().__init__(message)
        self.exit_code = exit_code


class GroupBroken(KilnError):
    """A failure after which the process group is broken or left: its destructor can wait forever at
    interpreter exit for gloo threads that never finish (pytorch/pytorch#56297), so a stage ending
    with one leaves with os._exit (kiln.stage.run_main) once its message and exit code are written."""


class CollectiveTimeout(GroupBroken):
    """A collective waited past train.collective_timeout_s: another rank is stuck or dead."""


class RanksOutOfMemory(GroupBroken):
    """A rank ran out of memory and every rank agreed on it after leaving the process group
    (kiln.gate.oom): each ends with the same message."""
