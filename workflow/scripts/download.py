"""download stage: gather each configured source's documents as parquet parts plus a manifest.

Writes <out>/<source>/part-NNNNN.parquet (id, text, metadata{path, source}) and <out>/manifest.json
(rows, bytes and sha256 per part, skipped counts). The folder appears whole or not at all.
"""

from pathlib import Path

from kiln.cli import run_main, stage_config, stage_parser
from kiln.data.sources import write_source
from kiln.io import atomic_dir, write_json


def main() -> None:
    parser = stage_parser("download", __doc__)
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/raw")
    args = parser.parse_args()
    cfg = stage_config(args, "download")["download"]
    with atomic_dir(args.out) as tmp:
        sources = {
            spec["name"]: write_source(spec, tmp / spec["name"], cfg["rows_per_part"])
            for spec in cfg["sources"]
        }
        write_json(tmp / "manifest.json", {
            "sources": sources,
            "rows": sum(s["rows"] for s in sources.values()),
            "bytes": sum(s["bytes"] for s in sources.values()),
        })
    print(f"download: {sum(s['rows'] for s in sources.values())} documents -> {args.out}")


if __name__ == "__main__":
    run_main(main)
