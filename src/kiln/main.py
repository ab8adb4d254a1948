"""`kiln`: commands around a run, for the person at the terminal (the stages themselves run under
Snakemake). Each command lives in its own module, which adds its subparser in `register`.

    kiln plan --configfile config/experiments/swallow-code-llama-1b.yaml   # price a run before it starts
    kiln rehearse --configfile config/experiments/swallow-code-llama-1b.yaml   # its GPU memory, on this CPU
    kiln status results/stdlib-code                                        # where a run stands
    kiln export results/stdlib-code                                        # its Hugging Face folder again
"""

from __future__ import annotations

import argparse
import logging
import sys

from kiln import forecast
from kiln.errors import KilnError
from kiln.rehearse import command as rehearse
from kiln.report import export, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    forecast.register(commands)
    rehearse.register(commands)
    status.register(commands)
    export.register(commands)
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except KilnError as exc:
        logging.basicConfig(format="kiln: %(message)s")
        logging.getLogger("kiln").error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
