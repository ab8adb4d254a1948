"""Host memory of a resume on several ranks: what each rank holds while it loads a full-format
checkpoint (model and AdamW state in state.pt), on CPU under torchrun with gloo.

    python bench/resume_memory.py                               # 2 ranks, ~109M parameters (1.3 GB state.pt)
    python bench/resume_memory.py --ranks 4 --d-model 1024 --n-layer 8
    python bench/resume_memory.py --quick       # 2 ranks, a 1 x 64 model: what tests/bench/test_bench.py runs
    PYTHONPATH=/tmp/old/src python bench/resume_memory.py       # the same against another checkout's kiln

One process writes the checkpoint (a Trainer, one optimizer step, saved); then R ranks each build the
Trainer and call its resume (Trainer.resume_or_start, as train does), while a thread reads
/proc/self/status every 2 ms: resident memory (VmRSS), of it the process's own (RssAnon) and the
pages mapped from files (RssFile: shared with every process mapping the same file, and with the page
cache, so a node holds them once however many ranks map them), and the kernel's peak (VmHWM). Each
figure is its growth over the rank's figure just before the resume (the model already built). On a
GPU the loaded state is copied to the device and its host copy dropped; here the model lives in host
memory, so the growth is the loaded copy alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import common  # bench/ is sys.path[0] (the ranks' too: torchrun runs this file)
import torch
from train_throughput import synthetic_shards

from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.train import checkpoint
from kiln.train.distributed import shutdown
from kiln.train.trainer import Trainer

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status() -> dict[str, int]:
    """This process's FIELDS from /proc/self/status, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in FIELDS:
            out[key] = int(value.split()[0]) * 1024
    return out


class Peaks(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done = status(), threading.Event()

    def run(self):
        while not self.done.wait(0.002):
            now = status()
            self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.join()
        now = status()
        return {k: max(v, now[k]) for k, v in self.peak.items()}


def sections(args) -> dict:
    model = {"n_layer": args.n_layer, "n_head": args.d_model // 64, "d_model": args.d_model}
    train = {
        "micro_batch": 1,
        "batch_tokens": args.ranks * args.seq_len,
        "max_steps": 2,
        "warmup_steps": 1,
        "checkpoint_every": 1,
        "keep_checkpoints": 1,
        "precision": "fp32",
        "compile": False,
        "nproc_per_node": args.ranks,
        "parallel": "ddp",
        "checkpoint_format": "full",
        "eval_every": 1000,
        "log_every": 1,
    }
    return kiln_config.stage_sections("train", shard={"seq_len": args.seq_len}, model=model, train=train)


def child(plan: dict) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(RunConfig.of(plan["sections"]), Path(plan["shards"]))
    before = status()
    peaks = Peaks()
    peaks.start()
    trainer.resume_or_start(Path(plan["out"]))
    peak = peaks.stop()
    assert trainer.step == 1, trainer.step
    row = {
        "rank": trainer.dist.rank,
        **{f"{k}_growth": peak[k] - before[k] for k in FIELDS},
        "VmHWM": peak["VmHWM"],
        "RssAnon_before": before["RssAnon"],
    }
    Path(plan["out"], f"rank{trainer.dist.rank}.json").write_text(json.dumps(row))
    shutdown(synced=True)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        vars(args).update(ranks=2, d_model=64, n_layer=1, seq_len=16, vocab=512)
    if args.child:
        return child(json.loads(Path(args.child).read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "shards").mkdir()
        shards = synthetic_shards(Path(tmp) / "shards", args.vocab, args.seq_len, rows=64, seed=0)
        out = Path(tmp) / "train"
        plan = {"sections": sections(args), "shards": str(shards), "out": str(out)}
        torch.set_num_threads(1)
        writer = Trainer(RunConfig.of(plan["sections"]), shards)
        saver = checkpoint.Saver(out / "checkpoints", "full", 1, rank=0, world=1)
        writer.train_step()
        writer.save_checkpoint(saver)
        state = out / "checkpoints" / checkpoint.step_name(1) / checkpoint.STATE
        n_params = writer.model.num_params(non_embedding=False)
        del writer
        (Path(tmp) / "plan.json").write_text(json.dumps(plan))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.ranks}",
                __file__,
                "--child",
                str(Path(tmp) / "plan.json"),
            ],
            check=True,
            env=env,
        )
        rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
        import kiln

        print(
            f"kiln from {Path(kiln.__file__).parent}; {n_params:,} parameters; state.pt {state.stat().st_size / 2**20:,.0f} MiB; "
            f"{args.ranks} ranks"
        )
        print("| rank | RSS growth | of it own (RssAnon) | of it file pages (RssFile, shared) | peak RSS (VmHWM) |")
        print("|---|---|---|---|---|")
        for row in rows:
            print(
                f"| {row['rank']} | {row['VmRSS_growth'] / 2**20:,.0f} MiB | {row['RssAnon_growth'] / 2**20:,.0f} MiB | "
                f"{row['RssFile_growth'] / 2**20:,.0f} MiB | {row['VmHWM'] / 2**20:,.0f} MiB |"
            )


if __name__ == "__main__":
    main()
