"""What every bench script shares: this clone's Kiln on sys.path, and the command line's --quick, which
tests/bench/test_bench.py runs, and --rounds for the scripts that take turns timing their arms.

    import common   # bench/ is sys.path[0] for `python bench/X.py`; importing common puts src/ after it
    args = common.parser(__doc__, rounds=3).parse_args()

Every bench script imports common before Kiln, so `python bench/X.py` from a fresh clone imports the
clone's src/kiln without PYTHONPATH or an install, ahead of an installed Kiln (the bench measures the
code beside it; tests/bench/test_gpu_check.py runs the GPU check where no Kiln is installed), and
behind PYTHONPATH's entries, which still pick another checkout's (to measure an older tree's code).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:  # after bench/ (sys.path[0]) and PYTHONPATH's entries, which come next; before site-packages
    PYTHONPATH = (
        [] if sys.flags.ignore_environment else [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    sys.path.insert(1 + len(PYTHONPATH), SRC)

QUICK = "tiny input through every part that prints the table (tests/bench/test_bench.py); figures meaningless"
ROUNDS = "timed rounds of each arm, taken in turns"


def parser(
    description: str | None, *, quick: str = QUICK, rounds: int | None = None, rounds_help: str = ROUNDS
) -> argparse.ArgumentParser:
    """A bench script's parser: its docstring as the description, --quick (`quick` says what it runs),
    and --rounds (default `rounds`) where given one."""
    out = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("--quick", action="store_true", help=quick)
    if rounds is not None:
        out.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    return out
