"""Many Snakemake invocations in one process: one JSON argument list per line on stdin (a dry run's
with `--dry-run` in it), each answer as one JSON line on stdout: whether it succeeded, the rules it
scheduled or ran, and the tail of its output when it failed. The same entry points the `snakemake`
command calls (snakemake.cli.parse_args, args_to_api), without a Python start and the imports for
each (0.2 s a dry run instead of 3.5 s): tests/dag/test_settings.py makes ~150 dry runs,
tests/dag/test_tags.py ~150 real ones."""

import contextlib
import io
import json
import re
import sys

from snakemake.cli import args_to_api, parse_args

from kiln.layout import STAGE_OF_JOB


def invoke(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            parser, args = parse_args(argv)
            ok = args_to_api(args, parser)
        except Exception as exc:  # noqa: BLE001 - the answer says what failed, for the test's message
            print(f"{type(exc).__name__}: {exc}")
            ok = False
    text = out.getvalue()
    found = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", text, flags=re.M)
    rules = sorted({STAGE_OF_JOB.get(r, r) for r in found} - {"all"})  # a scattered stage's jobs count as it
    return {"ok": bool(ok), "rules": rules, "tail": "" if ok else text[-3000:]}


if __name__ == "__main__":
    for line in sys.stdin:
        print(json.dumps(invoke(json.loads(line))), flush=True)
