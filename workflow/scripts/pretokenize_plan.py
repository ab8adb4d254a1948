"""pretokenize_plan stage job: how many pretokenize_part jobs the pretokenize stage scatters into (one
per raw part), and what each must be made from (the raw part's checksum, the tokenizer's, the
encoder, the first validation round). A Snakemake checkpoint: the workflow reads the count from it.

Writes <out> (kiln.layout.ScatterPlan).
"""

from pathlib import Path

from kiln.data.token_plan import scatter_plan
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("pretokenize", __doc__)
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json")
    parser.add_argument(
        "--out", required=True, type=Path, help="e.g. results/data/tokens-<key>.plan.json (kiln.layout)"
    )
    args = parser.parse_args()
    run = stage_config(args, "pretokenize")
    planned = scatter_plan(args.raw, args.tokenizer, run.seed, run.pretokenize)
    planned.save(args.out)
    print(f"pretokenize_plan: {planned.parts} raw parts, {planned.parts} pretokenize_part jobs -> {args.out}")


if __name__ == "__main__":
    run_main(main)
