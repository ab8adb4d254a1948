"""Pre-tokenization throughput and memory: Kiln's pretokenize + shard stages against the seeds' recipe
and against the raw batch-encode speed of the encoders, on the same corpus and machine, in one run.

    python bench/dataprep.py                                   # the default corpus (Python stdlib)
    python bench/dataprep.py --quick   # QUICK_CONFIG (json and http of the stdlib), a 1 MiB big document
    python bench/dataprep.py --raw results/data/raw-<key> --tokenizer results/data/tokenizer-<key>/tokenizer.json   # kiln status shows the keys

Measured, each as corpus bytes per second of wall time (best of --rounds rounds, taken in turns):
- seeds' recipe (seed 003): `datasets.map` with a per-row encode, save/load, then a Python list
  buffer cut into fixed chunks (shard.seq_len + 1) written to parquet; once with `tokenizers` (the
  library our vocabulary is trained with) and once with tiktoken carrying it;
- raw batch encode, texts already in memory: tiktoken `encode_ordinary_batch` on every core, and
  `tokenizers` `encode_batch_fast`; both must give the same ids on every document (checked);
- Kiln: kiln.data.pretokenize (val split, FIM, every core) then kiln.data.shards, parquet to shards.
Then peak RSS of the pretokenize stage in a child process on the corpus x1 and x4 (bounded memory
means no growth), and on a corpus holding one --big-doc-mb document.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np
import yaml

from kiln import config as kiln_config
from kiln.config.data_sections import DownloadSection, ShardSection
from kiln.config.run_config import RunConfig
from kiln.data.encoders import tiktoken_encoding
from kiln.data.pretokenize import SPLITS, pretokenize
from kiln.data.quality import FILTER_NAMES
from kiln.data.raw import write_raw
from kiln.data.shards import shard_split
from kiln.data.sources import read_documents
from kiln.data.tokenizer import EOS, load_tokenizer
from kiln.data.tokenizer_build import build_tokenizer
from kiln.io import read_json

ROOT = Path(__file__).resolve().parents[1]
# --quick: tests/configs/tiny.yaml on two stdlib packages, written to the scratch folder (the memory
# part's children read the config from a file)
QUICK_CONFIG = {
    "download": {"sources": [{"name": "stdlib", "kind": "stdlib", "include": ["json/*.py", "http/*.py"]}]},
    "tokenizer": {"vocab_size": 512, "heldout_docs": 2},
    "pretokenize": {"val_tokens": 2000},
}


def kiln_pretokenize(raw: Path, tokenizer: Path, tokens: Path, run: RunConfig, workers: int) -> dict:
    """The pretokenize stage as the DAG runs it (minus process start-up)."""
    tokens.mkdir(parents=True)
    return pretokenize(raw, tokenizer, tokens, run.seed, run.pretokenize, workers)


def kiln_shard(tokens: Path, shards: Path, shard: ShardSection, meta: dict) -> None:
    """The shard stage as the DAG runs it (minus process start-up)."""
    shards.mkdir(parents=True)
    for split in SPLITS:
        shard_split(
            np.memmap(tokens / f"{split}.bin", dtype=meta["dtype"], mode="r"),
            shards,
            split,
            shard.seq_len + 1,
            shard.rows_per_shard,
            meta["padded_vocab_size"],
        )


def seeds_recipe(raw: Path, encode, eos: int, chunk: int, out: Path) -> None:
    """Seed 003: datasets.map with a per-row encode, then a Python list buffer cut into chunks."""
    import random

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    parts = sorted(str(p) for p in raw.glob("*/part-*.parquet"))
    ds = datasets.Dataset.from_parquet(parts, cache_dir=str(out / "cache")).select_columns(["text"])

    def tok_batch(batch):
        ids = [encode(t) + [eos] for t in batch["text"]]
        return {"input_ids": ids, "length": [len(i) for i in ids]}

    ds.map(tok_batch, batched=True, batch_size=1000, remove_columns=["text"]).save_to_disk(str(out / "tok"))
    src = datasets.load_from_disk(str(out / "tok"))
    random.seed(42)
    buf, batches, shard = [], {"train": [], "val": []}, {"train": 0, "val": 0}

    def write(split):
        table = pa.table({"input_ids": pa.array(batches[split], type=pa.list_(pa.int32()))})
        pq.write_table(table, out / f"{split}-{shard[split]:05d}.parquet")
        shard[split] += 1
        batches[split] = []

    for row in src:
        buf.extend(row["input_ids"])
        while len(buf) >= chunk:
            split = "train" if random.random() < 0.8 else "val"
            batches[split].append(buf[:chunk])
            del buf[:chunk]
            if len(batches[split]) >= 25000:
                write(split)
    for split in batches:
        write(split)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def vm_hwm_mb() -> float:
    """This process's peak resident memory since it started (Linux; unlike ru_maxrss, not inherited
    from the process that forked it)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def peak_rss_mb(raw: Path, tokenizer: Path, config: Path, workers: int, scratch: Path) -> tuple[float, float]:
    """Peak RSS (MiB) of the pretokenize stage run in a child process: (the stage process, its largest
    worker). The shard stage is left out: it reads tokens through a memory map, whose pages count as
    resident while cached but are the kernel's to drop."""
    code = (
        "import resource, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "import dataprep; from kiln import config as kiln_config;"
        "dataprep.kiln_pretokenize(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]),"
        " kiln_config.RunConfig.of(kiln_config.load(sys.argv[5])), int(sys.argv[6]));"
        "print(dataprep.vm_hwm_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
    )
    shutil.rmtree(scratch, ignore_errors=True)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(Path(__file__).parent),
            str(raw),
            str(tokenizer),
            str(scratch),
            str(config),
            str(workers),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        raise RuntimeError(f"the Kiln stages failed on {raw}:\n{result.stderr[-3000:]}")
    stage, worker = map(float, result.stdout.split()[-2:])
    return stage, worker


def uncleaned_raw(source: dict, out: Path, rows_per_part: int = 500) -> Path:
    """A download stage output of one source with exact deduplication only: no quality filters, no
    decontamination, no near-duplicate removal (the benches' corpora are cleaned already, or made of
    copies on purpose)."""
    write_raw(
        DownloadSection.of(
            {
                "sources": [{"quality": "none", **source}],
                "rows_per_part": rows_per_part,
                "scatter_mb": 8,
                "dedup": True,
                "near_dup": {"enabled": False, "shingle": 5, "bands": 25, "rows": 10, "seed": 42},
                "decontaminate": {"humaneval": False, "ngram": 13},
                "filters": dict.fromkeys(FILTER_NAMES, False),
                "min_doc_bytes": 1,
                "invalid_utf8": "skip",
                "retries": 0,
                "retry_backoff_s": 0,
            }
        ),
        out,
    )
    return out


def _local_raw(jsonl: Path, out: Path) -> Path:
    """A download stage output holding the documents of one jsonl file (made larger by copies). Read
    by its name from its own folder: a local document's id holds its path, and the ids decide which
    documents are held out and which validate, so a temporary folder's random name would change
    them from run to run (and, now and then, leave the big-document corpus no train document)."""
    with contextlib.chdir(jsonl.parent):
        uncleaned_raw({"name": "corpus", "kind": "local", "paths": [jsonl.name], "text_column": "text"}, out)
    jsonl.unlink()
    return out


def corpus_copies(raw: Path, copies: int, out: Path) -> Path:
    """The corpus `copies` times (each copy's texts marked, so none is a duplicate), as a raw folder."""
    docs = list(read_documents(raw, read_json(raw / "manifest.json")))
    jsonl = out / f"x{copies}.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for k in range(copies):
            for doc in docs:
                f.write(json.dumps({"text": f"# copy {k}\n{doc.text}"}) + "\n")
    return _local_raw(jsonl, out / f"raw-x{copies}")


def big_doc_corpus(raw: Path, megabytes: int, out: Path) -> Path:
    """A raw folder with 20 small documents and one of `megabytes` MiB (the corpus repeated)."""
    docs = [d.text for d in read_documents(raw, read_json(raw / "manifest.json"))]
    block = "\n".join(docs)
    jsonl = out / "big.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for text in docs[:20]:
            f.write(json.dumps({"text": text}) + "\n")
        f.write(json.dumps({"text": (block * (megabytes * 2**20 // len(block) + 1))[: megabytes * 2**20]}) + "\n")
    return _local_raw(jsonl, out / "raw-big")


def main() -> None:
    parser = common.parser(__doc__, rounds=1, rounds_help="rounds; the best time of each is reported")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--raw", type=Path, help="a download stage output (default: made from --config)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (default: trained per --config)")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--big-doc-mb", type=int, default=200)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kiln-dataprep-"))
    if args.quick:
        tiny = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
        args.config, args.big_doc_mb = scratch / "quick.yaml", 1
        args.config.write_text(yaml.safe_dump(tiny | QUICK_CONFIG), encoding="utf-8")
    run = RunConfig.of(kiln_config.load(args.config))
    try:
        raw = args.raw or scratch / "raw"
        if args.raw is None:
            write_raw(run.download, raw)
        tok_path = args.tokenizer or scratch / "tokenizer.json"
        if args.tokenizer is None:
            build_tokenizer(raw, run.tokenizer, run.seed)[0].save(str(tok_path))
        tokenizer = load_tokenizer(tok_path)
        encoding = tiktoken_encoding(tokenizer)
        texts = [d.text for d in read_documents(raw, read_json(raw / "manifest.json"))]
        corpus_mb = sum(len(t.encode("utf-8")) for t in texts) / 2**20
        eos, chunk = tokenizer.token_to_id(EOS), run.shard.seq_len + 1
        print(
            f"corpus: {len(texts)} documents, {corpus_mb:.1f} MiB; vocabulary {tokenizer.get_vocab_size()}; "
            f"{args.workers} workers; {os.cpu_count()} cores"
        )

        ids = {}

        def run_kiln():
            shutil.rmtree(scratch / "kiln", ignore_errors=True)
            meta = kiln_pretokenize(raw, tok_path, scratch / "kiln" / "tokens", run, args.workers)
            kiln_shard(scratch / "kiln" / "tokens", scratch / "kiln" / "shards", run.shard, meta)

        def run_seeds(name, encode):
            def go():
                shutil.rmtree(scratch / name, ignore_errors=True)
                (scratch / name).mkdir()
                seeds_recipe(raw, encode, eos, chunk, scratch / name)

            return go

        cases = {
            "seeds' recipe, tokenizers per row": run_seeds(
                "seeds-hf", lambda t: tokenizer.encode(t, add_special_tokens=False).ids
            ),
            "seeds' recipe, tiktoken per row": run_seeds("seeds-tt", encoding.encode_ordinary),
            "raw batch encode, tokenizers": lambda: ids.__setitem__(
                "tokenizers", [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
            ),
            "raw batch encode, tiktoken": lambda: ids.__setitem__(
                "tiktoken", encoding.encode_ordinary_batch(texts, num_threads=args.workers)
            ),
            "Kiln pretokenize + shard": run_kiln,
        }
        best = {name: float("inf") for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                best[name] = min(best[name], timed(fn))
        identical = ids["tiktoken"] == ids["tokenizers"]
        print(f"tiktoken ids == tokenizers ids on all {len(texts)} documents: {identical}")
        speed = {name: corpus_mb / s for name, s in best.items()}
        fastest = max(("raw batch encode, tiktoken", "raw batch encode, tokenizers"), key=speed.get)
        print("\n| pipeline | wall s | MiB/s | Kiln is |\n|---|---:|---:|---:|")
        for name in cases:
            ratio = speed["Kiln pretokenize + shard"] / speed[name]
            print(f"| {name} | {best[name]:.2f} | {speed[name]:.2f} | {ratio:.2f}x |")
        print(
            f"\nKiln / seeds' recipe (tokenizers): {speed['Kiln pretokenize + shard'] / speed[list(cases)[0]]:.1f}x "
            f"(target >= 5); Kiln / fastest raw encode ({fastest}): "
            f"{speed['Kiln pretokenize + shard'] / speed[fastest]:.0%} (target >= 80%)"
        )

        print(
            "\n| pretokenize on | MiB | peak RSS MiB, stage process | peak RSS MiB, largest worker |\n|---|---:|---:|---:|"
        )
        for copies in (1, 4):
            copied = corpus_copies(raw, copies, scratch)
            stage, worker = peak_rss_mb(copied, tok_path, args.config, args.workers, scratch / "rss")
            print(f"| corpus x{copies} | {copies * corpus_mb:.0f} | {stage:.0f} | {worker:.0f} |")
            shutil.rmtree(copied)
        if args.big_doc_mb:
            big = big_doc_corpus(raw, args.big_doc_mb, scratch)
            stage, worker = peak_rss_mb(big, tok_path, args.config, args.workers, scratch / "rss")
            print(f"| one {args.big_doc_mb} MiB document + 20 small | {args.big_doc_mb} | {stage:.0f} | {worker:.0f} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
