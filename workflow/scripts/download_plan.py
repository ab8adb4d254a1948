"""download_plan stage job: how many download_part jobs the download stage scatters into, and which
files of which source each checks (kiln.data.raw_scatter). A Snakemake checkpoint: the workflow reads
the count from it.

Writes <out> (kiln.layout.ScatterPlan).
"""

from pathlib import Path

from kiln.data.raw_scatter import download_plan
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument("--out", required=True, type=Path, help="e.g. results/data/raw-<key>.plan.json (kiln.layout)")
    args = parser.parse_args()
    download = stage_config(args, "download").download
    planned = download_plan(download)
    planned.save(args.out)
    files = sum(len(stamp["files"]) for stamp in planned.stamps)
    print(f"download_plan: {files} files in {planned.parts} download_part jobs -> {args.out}")


if __name__ == "__main__":
    run_main(main)
