"""What every stage script shares: how it learns its config sections and how it reports failure.

Under Snakemake a script receives its sections as two JSON params (kiln.config.settings): `--params`, the
settings that change the stage's outputs (which Snakemake compares between runs), and `--untracked`,
the rest of those sections (how the stage runs and shows its work, which it does not). Run by hand
it reads and validates a whole config file (`--config config/config.yaml`) instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from kiln import config as kiln_config
from kiln.config import settings
from kiln.config.run_config import RunConfig
from kiln.errors import EXIT_FILE_ENV, GroupBroken, KilnError
from kiln.io import write_json


def stage_parser(stage: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="a Kiln config file (YAML), validated before use")
    source.add_argument(
        "--params",
        help="the settings of this stage's sections that change its outputs, as JSON (with --untracked, "
        "the rest of them): this is how Snakemake calls the script",
    )
    parser.add_argument("--untracked", default="{}", help="with --params: the rest of the stage's sections, as JSON")
    return parser


def stage_config(args: argparse.Namespace, stage: str) -> RunConfig:
    """The sections this stage reads (kiln.config.settings.sections), whole and typed: parsed once here,
    and passed down as they are."""
    if args.config:
        return RunConfig.of(settings.stage_config(kiln_config.load(args.config), stage))
    return config_of(args.params, args.untracked)


def config_of(tracked: str, untracked: str) -> RunConfig:
    """A stage's sections from its two params (kiln.config.settings.tracked and untracked), typed."""
    params = json.loads(tracked)
    params.pop(settings.DERIVED, None)  # not a section: stage_derived reads it
    return RunConfig.of(settings.join(params, json.loads(untracked)))


def stage_tracked(args: argparse.Namespace, stage: str) -> str:
    """The settings that change this stage's outputs, as the canonical JSON Snakemake compares
    (kiln.config.settings.tracked): under Snakemake its --params, by hand from the whole config file."""
    return settings.tracked(kiln_config.load(args.config), stage) if args.config else args.params


def stage_derived(args: argparse.Namespace, stage: str) -> dict:
    """What this stage reads that the config implies rather than sets (kiln.config.settings.derived):
    under Snakemake from its tracked params, by hand from the whole config file."""
    if args.config:
        return settings.derived(kiln_config.load(args.config), stage)
    return json.loads(args.params).get(settings.DERIVED, {})


def run_main(main: Callable[[], None]) -> None:
    """Run a stage's main with console logging; expected failures end in one clear line and exit with
    the error's code (kiln.errors.ExitCode: 1, or the code of a run that stopped itself)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        main()
    except KilnError as exc:
        logging.getLogger("kiln").error("%s", exc)
        _report_exit(int(exc.exit_code), str(exc))
        if isinstance(exc, GroupBroken):  # a broken process group can hang the exit: leave now
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(exc.exit_code))
        sys.exit(int(exc.exit_code))


def _report_exit(code: int, message: str) -> None:
    """Leave the exit code where kiln.train.launch looks for it (torchrun reports any failed rank as
    1). Each node's first rank writes it; only on the launcher's node does its folder exist."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path and os.environ.get("LOCAL_RANK", "0") == "0" and Path(path).parent.is_dir():
        write_json(path, {"code": code, "message": message})
