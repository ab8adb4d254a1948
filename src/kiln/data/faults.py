"""Fault injection for the data stages: KILN_DATA_FAULT kills a stage's process (SIGKILL, as the OOM
killer or a lost node would) in the middle of writing its output, so the tests (and a drill) show that
the rerun regenerates it and never takes a partial file for a finished one. (The train stage's faults
are kiln.train.faults, KILN_FAULT.)

    KILN_DATA_FAULT="stage@n"        e.g. KILN_DATA_FAULT="pretokenize@1"

    download@n      the n-th part this process writes (across sources) is in its temporary file, not
                    yet renamed into the staging folder: complete parts staged, a dead writer's temp
                    beside them
    download_part@n the n-th share this process checks has its verdicts.parquet written in the part
                    folder's temporary folder, its part.json not yet
    pretokenize_part@n  the n-th raw part this process encodes has its train.bin written in the part
                    folder's temporary folder, its part.json not yet
    pretokenize@n   the n-th train part's ids appended to train.bin in the output's temporary folder
    shard@n         the n-th shard file (train split first) written in the output's temporary folder,
                    the manifest not yet

n counts the points this process reaches (a resumed download starts again at 1). A stage reads the
variable at those points only; the other stages ignore it.
"""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

from kiln.errors import KilnError

ENV = "KILN_DATA_FAULT"
STAGES = ("download", "download_part", "pretokenize_part", "pretokenize", "shard")
_SPEC = re.compile(r"(?P<stage>\w+)@(?P<n>\d+)")
_reached: Counter = Counter()


def planned() -> tuple[str, int] | None:
    """(stage, n) from KILN_DATA_FAULT, None when unset; a malformed value is an error naming it."""
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    match = _SPEC.fullmatch(spec)
    if not match or match["stage"] not in STAGES or int(match["n"]) < 1:
        raise KilnError(f"{ENV}: {spec!r} is not stage@n with stage one of {', '.join(STAGES)} and n >= 1")
    return match["stage"], int(match["n"])


def kill_point(stage: str) -> None:
    """Count one more of `stage`'s points; SIGKILL this process if KILN_DATA_FAULT names this one."""
    _reached[stage] += 1
    if planned() == (stage, _reached[stage]):
        os.kill(os.getpid(), signal.SIGKILL)
