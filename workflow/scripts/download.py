"""download stage: gather each configured source's documents, cleaned, as parquet parts plus a manifest.

Writes <out>/<source>/part-NNNNN.parquet (id, text, metadata{path, source, repo}) and <out>/manifest.json
(rows, bytes and sha256 per part, what was skipped and why). The sources' shares come checked by the
download_part jobs (--parts); the rest (streams that cannot be cut by file, a budget's shares past its
expected reach) are read and checked here (kiln.data.raw_scatter). Parts
are staged beside the output in .<out>.partial and the folder is renamed into place when complete; a
rerun after an interruption resumes after the last complete part.
"""

from pathlib import Path

from kiln.data.raw import write_raw
from kiln.data.raw_scatter import part_verdicts
from kiln.layout import ScatterPlan
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument("--plan", type=Path, help="download_plan's output (with --parts)")
    parser.add_argument("--parts", nargs="*", type=Path, default=[], help="the download_part folders, in plan order")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/raw-<key> (kiln.layout)"
    )
    args = parser.parse_args()
    download = stage_config(args, "download").download
    verdicts = part_verdicts(download, ScatterPlan.load(args.plan), args.parts) if args.plan else None
    manifest = write_raw(download, args.out, verdicts)
    print(f"download: {manifest['rows']} documents, {manifest['bytes']} bytes -> {args.out}")


if __name__ == "__main__":
    run_main(main)
