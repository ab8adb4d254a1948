"""What the download stage's cleaning removes from a code corpus and a prose corpus, as the run's
report shows it (kiln.report.cleaning), with the time it took against the same download with every
cleaning step off, in the same run.

    python bench/cleaning.py            # the stdlib (quality: code) and site-packages' prose (quality: prose)
    python bench/cleaning.py --quick    # two stdlib packages and 20 of the prose files

It runs in site-packages (the prose patterns are relative to it, so a document's id is its path there).

The prose corpus is what this machine has offline: the English documentation every installed
package ships in site-packages (its README as dist-info/METADATA, *.md and *.rst files, LICENSE
texts, and the short *.txt lists), about 1,000 files. FineWeb's Gopher filters (kiln.data.quality,
at datatrove's defaults) run on it as on a web crawl. Each corpus is downloaded twice, in this
process: with the schema's defaults for its quality family (exact and near duplicates, filters,
HumanEval decontamination), and with all of them off (exact duplicates kept too).
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.data.quality import FILTER_NAMES
from kiln.data.raw import write_raw
from kiln.io import read_json
from kiln.report.cleaning import cleaning_section

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
PROSE = ["*.dist-info/METADATA", "*.dist-info/LICENSE*", "**/*.md", "**/*.rst", "**/*.txt"]


def download(source: dict, out: Path, cleaned: bool) -> tuple[float, dict]:
    """The download stage on one source, with the schema's cleaning defaults or with none."""
    section = {"sources": [source], "rows_per_part": 500}
    if not cleaned:
        section |= {
            "dedup": False,
            "near_dup": {"enabled": False},
            "decontaminate": {"humaneval": False},
            "filters": dict.fromkeys(FILTER_NAMES, False),
        }
    cfg = RunConfig.of(kiln_config.resolve([ROOT / "config" / "config.yaml"], {"download": section})).download
    start = time.perf_counter()
    write_raw(cfg, out)
    return time.perf_counter() - start, read_json(out / "manifest.json")


def main() -> None:
    args = common.parser(__doc__, quick="two stdlib packages and 20 prose files").parse_args()
    os.chdir(SITE)  # relative patterns: the prose documents' ids are their paths inside site-packages
    prose = list(PROSE)
    corpora = {
        "stdlib": {
            "name": "stdlib",
            "kind": "stdlib",
            "include": ["json/*.py", "http/*.py"] if args.quick else ["**/*.py"],
        },
        "prose": {"name": "prose", "kind": "local", "paths": prose[:1] if args.quick else prose, "quality": "prose"},
    }
    if args.quick:
        corpora["prose"]["max_rows"] = 20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in corpora.items():
            cleaned_s, manifest = download(source, Path(tmp) / f"{name}-cleaned", cleaned=True)
            plain_s, plain = download(source, Path(tmp) / f"{name}-plain", cleaned=False)
            rows.append((name, source.get("quality", "code"), plain, manifest, plain_s, cleaned_s))
            print(f"\n### {name} ({source.get('quality', 'code')} filters)\n")
            print("\n".join(cleaning_section(manifest)[2:]))  # the report's table and examples, its heading left out
    print("\n| corpus | filters | documents | MB | kept | s, cleaning off | s, cleaned | MB/s cleaned |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, family, plain, cleaned, plain_s, cleaned_s in rows:
        mb = plain["bytes"] / 1e6
        print(
            f"| {name} | {family} | {plain['rows']:,} | {mb:.1f} | {cleaned['rows']:,} | {plain_s:.1f} | "
            f"{cleaned_s:.1f} | {mb / cleaned_s:.1f} |"
        )


if __name__ == "__main__":
    main()
