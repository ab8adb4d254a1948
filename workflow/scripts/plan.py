"""plan stage: the full run priced from the smoke stage's measurements. Writes plan.json and plan.md:
tokens, time, cost (smoke.price_per_gpu_hour), tokens per parameter and disk of the full run at the
measured speed, the steps a train.budget buys and the precision (kiln.plan.steps.build_plan, the
builder `kiln plan` calls with assumed figures).

Train plans its steps from the same measurements itself (workflow/scripts/train.py), so a new price
reprices the plan here and trains nothing (kiln.config.settings tags the price so: `plan` reads it for its
output, `train` only when the budget is in dollars).
"""

import math
from pathlib import Path

from kiln.io import atomic_file, write_json
from kiln.plan.tables import render_plan
from kiln.plan.verdict import SmokeReport
from kiln.stage import run_main, stage_config, stage_parser

UNAVAILABLE = "# Plan for the full run\n\nUnavailable: the probe did not run.\n"


def main() -> None:
    parser = stage_parser("plan", __doc__)
    parser.add_argument("--smoke", required=True, type=Path, help="smoke stage's report.json")
    parser.add_argument("--plan", required=True, type=Path, help="output plan.json, e.g. results/<run>/smoke/plan.json")
    parser.add_argument("--markdown", required=True, type=Path, help="output plan.md")
    args = parser.parse_args()
    config = stage_config(args, "plan")
    measured = SmokeReport.load(args.smoke).measurements
    plan = None
    if measured is not None:
        plan = measured.plan(config.train, config.smoke.price_per_gpu_hour)
    if plan is not None and math.isfinite(plan["eta_s"]):
        write_json(args.plan, plan)
        markdown = render_plan(plan)
    else:
        write_json(args.plan, {"unavailable": "the probe did not run"})
        markdown = UNAVAILABLE
    with atomic_file(args.markdown) as tmp:
        tmp.write_text(markdown, encoding="utf-8")
    print(markdown)


if __name__ == "__main__":
    run_main(main)
