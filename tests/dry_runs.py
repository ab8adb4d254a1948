"""Many `snakemake -n` runs in one process: the argument lists as JSON on stdin, each answer (the
rules the dry run schedules, or its error) as one JSON line on stdout. The same entry points the
`snakemake` command calls (snakemake.cli.parse_args, args_to_api), without a Python start and the
imports for each of the ~150 dry runs tests/dag/test_settings.py makes (0.2 s each instead of 3.5 s)."""

import contextlib
import io
import json
import re
import sys

from snakemake.cli import args_to_api, parse_args

from kiln.layout import STAGE_OF_JOB


def dry_run(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            parser, args = parse_args([*argv, "--dry-run"])
            ok = args_to_api(args, parser)
        except Exception as exc:  # noqa: BLE001 - the answer says what failed, for the test's message
            print(f"{type(exc).__name__}: {exc}")
            ok = False
    text = out.getvalue()
    found = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", text, flags=re.M)
    rules = sorted({STAGE_OF_JOB.get(r, r) for r in found} - {"all"})  # a scattered stage's jobs count as it
    return {"ok": bool(ok), "rules": rules, "tail": "" if ok else text[-2000:]}


if __name__ == "__main__":
    for argv in json.load(sys.stdin):
        print(json.dumps(dry_run(argv)), flush=True)
