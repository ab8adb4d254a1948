"""The pretokenize stage as Snakemake runs it, one pretokenize_part job per raw part and a gather, at
1, 2 and 4 cores, against the stage as one job with as many worker processes, on the same data in
the same run; then the time of seed 000's 10B tokens on 4 and 32 nodes, projected from the figures.
Then the download stage the same way: one download_part job per download.scatter_mb of input files
and a gather, against the stage script as one process (download_rounds).

    python bench/data_scatter.py                     # config/config.yaml: the stdlib
    python bench/data_scatter.py --rows-per-part 100 # more, smaller parts
    python bench/data_scatter.py --site-packages     # ~300 MB of real code: site-packages' .py files
    python bench/data_scatter.py --quick             # tests/configs/tiny.yaml, 2 cores
    python bench/data_scatter.py --train-tokens 1000000  # under a budget: the part jobs encode the
                                                     # train side only of the parts it is expected to reach
    python bench/data_scatter.py --hf-parquet-mb 1024  # the download alone, of an hf source: a dataset
                                                     # folder of parquet data files (below)

Builds the download and tokenizer once (snakemake --until tokenizer) in a scratch folder, then per
core count, taking turns for --rounds rounds (best kept):
- scatter: `snakemake --cores N --until pretokenize --forcerun pretokenize` (the part jobs and the
  gather, Snakemake's own start and DAG included: what a user waits for);
- one job: workflow/scripts/pretokenize.py without --parts, --workers N (the stage before the
  scatter, with a pool of N processes).
Every output is checked byte-equal to the first one job's. The part jobs' and the gather's own
seconds come from their benchmark files (kiln.layout).

Projection: the corpus of seed 000 (10B tokens, at the bytes per token measured here) cut in parts
of this run's mean part size; each node runs --node-cores part jobs at once, each at the measured
part-job rate (MB of raw text per second, its start-up included); then the gather: its fixed cost
measured here plus its read and write of the token bytes at the copy rate measured on a scratch
file of --copy-mb. Snakemake's `jobs:` (profiles/slurm) must allow that many jobs in flight.

--hf-parquet-mb N: the download stage alone, of one hf source read through `datasets`: a dataset
repository folder laid out as the Hub serves one (a card, parquet data files of --hf-file-mb of text
each), made of this interpreter's site-packages and standard library .py files, cycled with a header
naming the round until N MB (a later round's file is a near duplicate of the first's: the part jobs
check it all the same, the gather drops it). One download_part job per data file. The projection is of
the seeds' hf sources: seed 000's 90 GB of Python and seed 002's 48 GB of FineWeb-Edu (their max_bytes).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np
import yaml

from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.data.pretokenize import copy_range
from kiln.data.raw import write_raw
from kiln.data.raw_scatter import part_verdicts
from kiln.data.sources import raw_part_count
from kiln.io import benchmark_seconds as seconds
from kiln.io import read_json
from kiln.layout import Layout, ScatterPlan

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ("train.bin", "val.bin", "val_ids.txt", "meta.json")
SEED_TOKENS = 10e9  # seed 000: ~10B tokens of code
SEED_DOWNLOADS_MB = {"seed 000": 90e3, "seed 002": 48e3}  # their hf sources' max_bytes, in MB


def snakemake(workdir: Path, configfile: Path, *args: str) -> float:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--configfile", str(configfile), *args]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # the jobs' python
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"$ {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - start


def one_job(workdir: Path, configfile: Path, layout: Layout, out: Path, workers: int) -> float:
    cmd = [sys.executable, str(ROOT / "workflow" / "scripts" / "pretokenize.py"), "--config", str(configfile)]
    cmd += ["--raw", str(layout.folder("download")), "--tokenizer", layout.output("tokenizer", "tokenizer.json")]
    cmd += ["--out", str(out), "--workers", str(workers)]
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"$ {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def outputs(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in OUTPUTS}


def copy_rate_mb_s(folder: Path, size_mb: int) -> float:
    """MB/s of the gather's copy (kiln.data.pretokenize.copy_range) from a file not in the page
    cache's favour: written, then copied once."""
    src, dst = folder / "copy-src.bin", folder / "copy-dst.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(size_mb):
            f.write(block)
    start = time.perf_counter()
    with open(dst, "wb") as out:
        copy_range(out, src, 0, size_mb << 20)
        out.flush()
        os.fsync(out.fileno())
    rate = size_mb / (time.perf_counter() - start)
    src.unlink()
    dst.unlink()
    return rate


def main() -> int:
    parser = common.parser(
        __doc__, quick="tests/configs/tiny.yaml, 2 cores, one round", rounds=2, rounds_help="rounds; the best is shown"
    )
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--rows-per-part", type=int, help="download.rows_per_part (default: the config's)")
    parser.add_argument(
        "--site-packages",
        action="store_true",
        help="download every .py file under this interpreter's site-packages (a local source, 2000 files a part)",
    )
    parser.add_argument("--train-tokens", type=int, help="pretokenize.train_tokens, a budget (default: the config's)")
    parser.add_argument("--cores", default="1,2,4")
    parser.add_argument("--node-cores", type=int, default=64, help="part jobs one node runs at once (projection)")
    parser.add_argument("--copy-mb", type=int, default=1024)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kiln-data-scatter-bench"))
    parser.add_argument("--hf-parquet-mb", type=int, help="the download of an hf source of this many MB (below)")
    parser.add_argument("--hf-file-mb", type=int, default=32, help="MB of text per parquet data file")
    args = parser.parse_args()
    if args.hf_parquet_mb:
        return hf_download(args)
    if args.quick:
        args.configfile, args.cores, args.rounds, args.copy_mb = ROOT / "tests" / "configs" / "tiny.yaml", "2", 1, 16
        args.workdir = Path(tempfile.mkdtemp(prefix="kiln-data-scatter-"))
    configfile = args.configfile.resolve()
    download = {}
    if args.site_packages:
        code = f"{sysconfig.get_paths()['purelib']}/**/*.py"
        download = {"sources": [{"name": "code", "kind": "local", "paths": [code]}], "rows_per_part": 2000}
    if args.rows_per_part:
        download["rows_per_part"] = args.rows_per_part
    # the settings go into a config file, which the one jobs read too
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    if args.train_tokens or download:
        changed = yaml.safe_load(configfile.read_text(encoding="utf-8"))
        changed["download"] = changed.get("download", {}) | download
        if args.train_tokens:
            changed.setdefault("pretokenize", {})["train_tokens"] = args.train_tokens
        configfile = args.workdir / "config.yaml"
        configfile.write_text(yaml.safe_dump(changed), encoding="utf-8")
    cfg = kiln_config.resolve([configfile], {})
    layout = Layout(cfg, root=args.workdir / "results")
    print(f"download and tokenizer of {configfile.name} in {args.workdir} ...", flush=True)
    snakemake(args.workdir, configfile, "--cores", "all", "--until", "tokenizer")
    parts = raw_part_count(layout.folder("download"))
    raw_mb = read_json(layout.folder("download") / "manifest.json")["bytes"] / 1e6
    cores = [int(c) for c in args.cores.split(",")]
    best: dict[tuple[str, int], float] = {}
    part_s: list[float] = []
    gather_s: list[float] = []
    reference = None
    for _ in range(args.rounds):
        for n in cores:
            wall = one_job(args.workdir, configfile, layout, args.workdir / "one-job", n)
            best[("one job", n)] = min(best.get(("one job", n), math.inf), wall)
            reference = reference or outputs(args.workdir / "one-job")
            assert outputs(args.workdir / "one-job") == reference, f"one job at {n} workers wrote other bytes"
            wall = snakemake(
                args.workdir,
                configfile,
                "--cores",
                str(n),
                "--until",
                "pretokenize",
                "--forcerun",
                "pretokenize",
            )
            best[("scatter", n)] = min(best.get(("scatter", n), math.inf), wall)
            assert outputs(layout.folder("pretokenize")) == reference, f"the scatter at {n} cores wrote other bytes"
            part_s += [seconds(layout.benchmark("pretokenize", "pretokenize_part", part=i)) for i in range(parts)]
            reached = sum(stamp["train_side"] for stamp in ScatterPlan.load(layout.scatter_plan("pretokenize")).stamps)
            gather_s.append(seconds(layout.benchmark("pretokenize")))
    meta = read_json(layout.folder("pretokenize") / "meta.json")
    train = meta["splits"]["train"]
    print(
        f"\n{parts} raw parts, {raw_mb:.1f} MB of text, {train['tokens']:,} train tokens; {os.cpu_count()} cores here"
    )
    print("every output byte-equal to the one job's: yes")
    print(
        f"part jobs that encoded their part's train side: {reached} of {parts} (the rest: validation candidates); "
        f"part jobs' seconds, summed: {sum(part_s) / len(gather_s):.1f} a run\n"
    )
    print("| cores | scatter wall s (snakemake) | one job wall s (--workers N) | scatter / one job |")
    print("|---|---:|---:|---:|")
    for n in cores:
        scatter, single = best[("scatter", n)], best[("one job", n)]
        print(f"| {n} | {scatter:.1f} | {single:.1f} | {scatter / single:.2f} |")
    per_part = sorted(part_s)[len(part_s) // 2]
    gather_fixed = min(gather_s)
    part_rate = raw_mb / parts / per_part
    copy_rate = copy_rate_mb_s(args.workdir, args.copy_mb)
    print(
        f"\npart job: median {per_part:.2f} s for {raw_mb / parts:.1f} MB ({part_rate:.2f} MB/s, start-up included); "
        f"gather: {gather_fixed:.2f} s here; copy {copy_rate:.0f} MB/s"
    )
    bytes_per_token = train["bytes"] / train["tokens"]
    seed_mb = SEED_TOKENS * bytes_per_token / 1e6
    seed_parts = math.ceil(seed_mb / (raw_mb / parts))
    token_mb = SEED_TOKENS * np.dtype(meta["dtype"]).itemsize / 1e6
    gather = gather_fixed + 2 * token_mb / copy_rate  # read the parts' ids, write train.bin
    print(
        f"\nseed 000: {SEED_TOKENS / 1e9:.0f}B tokens x {bytes_per_token:.2f} bytes/token = {seed_mb / 1e3:.1f} GB in {seed_parts:,} parts"
    )
    print_projection("part jobs", seed_parts, per_part, gather, args.node_cores)
    download_rounds(args, configfile, layout, cores, {"seed 000": seed_mb})
    shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


def print_projection(jobs: str, parts: int, per_part: float, gather: float, node_cores: int) -> None:
    """The projected table: `parts` part jobs of per_part seconds, node_cores at once per node, on 1,
    4 and 32 nodes, then a serial gather of `gather` seconds."""
    print(f"| nodes | {jobs} at once | scatter min | gather min | total min |")
    print("|---|---:|---:|---:|---:|")
    for nodes in (1, 4, 32):
        slots = nodes * node_cores
        scatter = math.ceil(parts / slots) * per_part
        print(f"| {nodes} | {slots} | {scatter / 60:.1f} | {gather / 60:.1f} | {(scatter + gather) / 60:.1f} |")


def download_one_job(workdir: Path, configfile: Path, out: Path) -> float:
    """workflow/scripts/download.py without --plan: every source read and checked in one process."""
    cmd = [sys.executable, str(ROOT / "workflow" / "scripts" / "download.py"), "--config", str(configfile)]
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([*cmd, "--out", str(out)], cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"$ {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("[!.]*")) if p.is_file()}


def replay_seconds(workdir: Path, configfile: Path, layout: Layout) -> float:
    """The gather's replay alone (kiln.data.raw.write_raw over the part jobs' verdicts), timed in this
    process on part folders a last Snakemake run kept (--notemp): at this corpus size the gather job's
    wall time is mostly its interpreter's start-up."""
    snakemake(workdir, configfile, "--cores", "all", "--until", "download", "--forcerun", "download", "--notemp")
    download = RunConfig.of(kiln_config.resolve([configfile], {})).download
    plan = ScatterPlan.load(layout.scatter_plan("download"))
    dirs = [Path(layout.part("download", i)) for i in range(plan.parts)]
    start = time.perf_counter()
    write_raw(download, workdir / "replayed", part_verdicts(download, plan, dirs))
    elapsed = time.perf_counter() - start
    shutil.rmtree(Path(dirs[0]).parent)
    return elapsed


def download_rounds(args, configfile: Path, layout: Layout, cores: list[int], seeds_mb: dict[str, float]) -> None:
    """The download stage the same way: its plan, download_part jobs and gather through Snakemake
    (`--until download --forcerun download`) against the stage script as one process; then each
    seed's raw text (`seeds_mb`) through it, projected (its serial gather measured here in MB/s)."""
    print("\n## download: download_part jobs and a gather, against one job", flush=True)
    reference, best, part_s, gather_s = None, {}, [], []
    for _ in range(args.rounds):
        wall = download_one_job(args.workdir, configfile, args.workdir / "one-raw")
        best["one job"] = min(best.get("one job", math.inf), wall)
        reference = reference or folder_bytes(args.workdir / "one-raw")
        for n in cores:
            wall = snakemake(
                args.workdir, configfile, "--cores", str(n), "--until", "download", "--forcerun", "download"
            )
            best[n] = min(best.get(n, math.inf), wall)
            assert folder_bytes(layout.folder("download")) == reference, f"the scatter at {n} cores wrote other bytes"
            parts = ScatterPlan.load(layout.scatter_plan("download")).parts
            part_s += [seconds(layout.benchmark("download", "download_part", part=i)) for i in range(parts)]
            gather_s.append(seconds(layout.benchmark("download")))
    manifest = read_json(layout.folder("download") / "manifest.json")
    input_mb = sum(s["bytes"] for s in manifest["sources"].values()) / 1e6  # kept text; the input is a little more
    print(f"{parts} download_part jobs over {input_mb:.1f} MB kept; every output byte-equal to the one job's: yes")
    print(f"part jobs' seconds, summed: {sum(part_s) / len(gather_s):.1f} a run; gather: {min(gather_s):.2f} s\n")
    print("| cores | download scatter wall s (snakemake) | one job wall s | scatter / one job |")
    print("|---|---:|---:|---:|")
    for n in cores:
        print(f"| {n} | {best[n]:.1f} | {best['one job']:.1f} | {best[n] / best['one job']:.2f} |")
    share_mb = input_mb / parts
    per_part = sorted(part_s)[len(part_s) // 2]
    gather_rate = input_mb / replay_seconds(args.workdir, configfile, layout)
    for seed, seed_mb in seeds_mb.items():
        seed_parts = math.ceil(seed_mb / share_mb)
        gather = seed_mb / gather_rate
        print(
            f"\n{seed}'s {seed_mb / 1e3:.1f} GB in {seed_parts:,} shares of {share_mb:.1f} MB, each {per_part:.2f} s "
            f"(median part job here); the gather replays {gather_rate:.0f} MB/s (in one process, start-up aside)"
        )
        print_projection("download_part jobs", seed_parts, per_part, gather, args.node_cores)


def python_files() -> list[Path]:
    """This interpreter's site-packages and standard library .py files, in a fixed order."""
    roots = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])]
    return [path for root in roots for path in sorted(root.rglob("*.py")) if path.is_file()]


def write_parquet_dataset(folder: Path, total_mb: int, file_mb: int) -> int:
    """A dataset repository folder (tests/hf_dataset.py's layout) of total_mb MB of .py files' text in
    data files of about file_mb MB each; returns how many data files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "data").mkdir(parents=True)
    card = (
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n---\n"
    )
    (folder / "README.md").write_text(card)
    sources, written, files, rows, size = python_files(), 0, 0, [], 0
    for index in itertools.count():
        path = sources[index % len(sources)]
        text = path.read_bytes().decode("utf-8", errors="replace")
        rows.append({"text": f"# round {index // len(sources)}: {path.name}\n{text}"})
        size += len(rows[-1]["text"])
        if size >= file_mb << 20 or written + size >= total_mb << 20:
            pq.write_table(
                pa.Table.from_pylist(rows), folder / "data" / f"train-{files:05d}.parquet", row_group_size=256
            )
            written, files, rows, size = written + size, files + 1, [], 0
            if written >= total_mb << 20:
                return files


def hf_download(args) -> int:
    """--hf-parquet-mb: the download rounds on an hf source of parquet data files, one a part job."""
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    files = write_parquet_dataset(args.workdir / "dataset", args.hf_parquet_mb, args.hf_file_mb)
    print(f"{files} parquet data files, {args.hf_parquet_mb} MB of text, in {args.workdir / 'dataset'}", flush=True)
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    source = {"name": "code", "kind": "hf", "dataset": str(args.workdir / "dataset"), "quality": "code"}
    cfg["download"] = cfg.get("download", {}) | {"sources": [source], "scatter_mb": 1e-6}  # a data file a share
    configfile = args.workdir / "config.yaml"
    configfile.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    layout = Layout(kiln_config.resolve([configfile], {}), root=args.workdir / "results")
    download_rounds(args, configfile, layout, [int(c) for c in args.cores.split(",")], SEED_DOWNLOADS_MB)
    shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
