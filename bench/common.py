"""What every bench script's command line shares: --quick, which tests/bench/test_bench.py runs, and --rounds
for the scripts that take turns timing their arms.

    from common import parser   # bench/ is sys.path[0] for `python bench/X.py`
    args = parser(__doc__, rounds=3).parse_args()
"""

from __future__ import annotations

import argparse

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
