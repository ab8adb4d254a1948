"""download stage: gather each configured source's documents, cleaned, as parquet parts plus a manifest.

Writes <out>/<source>/part-NNNNN.parquet (id, text, metadata{path, source, repo}) and <out>/manifest.json
(rows, bytes and sha256 per part, what was skipped and why). Parts are staged beside the output in
.<out>.partial and the folder is renamed into place when complete; a rerun after an interruption
resumes after the last complete part.
"""

from pathlib import Path

from kiln.config import RunConfig
from kiln.data.raw import write_raw
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/raw-<key> (kiln.layout)"
    )
    args = parser.parse_args()
    manifest = write_raw(RunConfig.of(stage_config(args, "download")).download, args.out)
    print(f"download: {manifest['rows']} documents, {manifest['bytes']} bytes -> {args.out}")


if __name__ == "__main__":
    run_main(main)
