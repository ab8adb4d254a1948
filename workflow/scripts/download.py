"""download stage: gather each configured source's documents as parquet parts plus a manifest.

Writes <out>/<source>/part-NNNNN.parquet (id, text, metadata{path, source}) and <out>/manifest.json
(rows, bytes and sha256 per part, skipped counts). The folder appears whole or not at all.
"""

from pathlib import Path

from kiln.cli import run_main, stage_config, stage_parser
from kiln.data.sources import write_raw
from kiln.io import atomic_dir


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/raw")
    args = parser.parse_args()
    cfg = stage_config(args, "download")["download"]
    with atomic_dir(args.out) as tmp:
        manifest = write_raw(cfg["sources"], tmp, cfg["rows_per_part"])
    print(f"download: {manifest['rows']} documents, {manifest['bytes']} bytes -> {args.out}")


if __name__ == "__main__":
    run_main(main)
