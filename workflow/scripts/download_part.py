"""download_part stage job: the order-free checks of one share of the input files (UTF-8, size,
quality filters, decontamination, content hash, MinHash) for the download job to gather. One such job
per share is the download stage's scatter (kiln.data.raw_scatter).

Writes <out>/verdicts.parquet and part.json.
"""

from pathlib import Path

from kiln.data.raw_scatter import write_part
from kiln.io import atomic_dir
from kiln.layout import ScatterPlan
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument("--plan", required=True, type=Path, help="download_plan's output")
    parser.add_argument("--part", required=True, type=int, help="the share's index in the plan")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/raw-<key>.parts/part-00000"
    )
    args = parser.parse_args()
    download = stage_config(args, "download").download
    with atomic_dir(args.out) as tmp:
        counts = write_part(download, ScatterPlan.load(args.plan), args.part, tmp)
    print(f"download_part {args.part}: {counts['records']} records, {counts['candidates']} candidates -> {args.out}")


if __name__ == "__main__":
    run_main(main)
