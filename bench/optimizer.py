"""train.optimizer adamw against muon at equal wall time, on the embedded default's model and data.

    python bench/optimizer.py                                  # adamw, and muon at train.muon_lr
    python bench/optimizer.py --muon-lrs 0.01 0.02 0.04 0.08   # ... and a search over Muon's LR
    python bench/optimizer.py --minutes 3 --precision fp32     # shorter arms; a fixed precision
    python bench/optimizer.py --quick      # a 1-layer model on kiln's own source, seconds: what tests/bench/test_bench.py runs

Each arm is Kiln's own Trainer (kiln.train.trainer, what the train stage runs) on config/config.yaml's
model, data (the shards `snakemake --until shard` builds; made here when missing) and train settings,
with train.optimizer (and train.muon_lr) set per arm. Equal wall time: every arm gets the same
seconds of training loop (--minutes, default the config's train.budget), turned into its own steps
from its own measured step time (a probe of a few steps, as the smoke stage does), so a slower step
buys fewer steps; the schedule (warmup, then the wsd cooldown) follows those steps, as a budgeted
run's does. The train stage's budget also pays for startup, validation and the export, which are the
same for every arm and left out here. Held-out figure: the mean loss over the whole validation split
(the held-out documents kiln's eval reports on), in bits per byte. precision auto takes whichever of
bf16 and fp32 the probe times faster for the first arm, for every arm.

The figures are for one machine and one seed; the table says which.
"""

from __future__ import annotations

import copy
import math
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # bench/ is sys.path[0]
import numpy as np
import torch

from kiln import config as kiln_config
from kiln.config.run_config import RunConfig
from kiln.data.shards import shard_split, tokens_per_byte
from kiln.io import write_json
from kiln.layout import Layout
from kiln.train.callbacks import Callback, StepEnd, default_callbacks
from kiln.train.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
PROBE = dict(warmup=5, timed=30)  # probe steps: untimed, then timed (the smoke stage times 30)
# --quick's arms stop at max_steps as well: its probe may be timed while the machine is quiet and its
# arms run while it is not (tests/bench/test_bench.py runs beside the Slurm lane): 150 s in CI for two "3 s" arms.
QUICK = dict(
    model={"family": "llama", "n_layer": 1, "n_head": 2, "d_model": 32},
    seq_len=64,
    seconds=3.0,
    max_steps=60,
    bytes=2**18,
)


def sections_for(raw: dict, optimizer: str, muon_lr: float | None, precision: str) -> dict:
    """The train stage's sections of `raw` for one arm: steps set per arm (Trainer's max_steps), one
    validation and one checkpoint, at the end; no samples, no wandb."""
    train = {
        "optimizer": optimizer,
        "budget": None,
        "max_steps": 10**9,
        "eval_every": 10**9,
        "checkpoint_every": 10**9,
        "log_every": 10**9,
        "precision": precision,
        "samples": {"prompts": []},
    } | ({"muon_lr": muon_lr} if muon_lr is not None else {})
    return kiln_config.stage_sections("train", raw, train=train, wandb={"mode": "disabled"})


def step_seconds(sections: dict, shards: Path) -> float:
    """Mean seconds of one optimizer step after PROBE["warmup"] untimed ones, on a fresh Trainer."""
    trainer = Trainer(RunConfig.of(sections), shards, max_steps=10**6)
    for _ in range(PROBE["warmup"]):
        trainer.train_step()[0].item()
    start = time.perf_counter()
    for _ in range(PROBE["timed"]):
        loss = trainer.train_step()[0]
    loss.item()  # the device has finished
    return (time.perf_counter() - start) / PROBE["timed"]


class LastRecord(Callback):
    """The newest log step's record, validation included (the train stage's callbacks run before it)."""

    record: dict | None = None

    def after_step(self, trainer: Trainer, end: StepEnd) -> None:
        self.record = end.record or self.record


def train_arm(sections: dict, shards: Path, seconds: float, out: Path, max_steps: int | None = None) -> dict:
    """The arm trained for `seconds` of loop time (at most max_steps): its steps, wall time and
    held-out bits per byte."""
    step_s = step_seconds(sections, shards)
    steps = max(sections["train"]["warmup_steps"] + 1, math.floor(seconds / step_s))
    steps = min(steps, max_steps or steps)
    trainer, last = Trainer(RunConfig.of(sections), shards, max_steps=steps), LastRecord()
    trainer.fit(out, callbacks=[*default_callbacks(), last])
    micro = sections["train"]["micro_batch"]
    loss = trainer.evaluate(n_batches=max(1, len(trainer.val_rows) // micro))  # the whole split
    ratio = tokens_per_byte(trainer.rows.manifest, "val")
    return {
        "steps": steps,
        "probe_step_s": step_s,
        "loop_s": last.record["elapsed_s"],  # the training loop's wall time, as metrics.jsonl has it
        "val_loss": loss,
        "val_bpb": None if ratio is None else loss / math.log(2) * ratio,
    }


def default_shards(raw: dict) -> Path:
    """The embedded default's shard folder, built by Snakemake (and what it needs) when missing."""
    folder = Layout(kiln_config.validate(copy.deepcopy(raw)), root=ROOT / "results").folder("shard")
    if not (folder / "manifest.json").is_file():
        cmd = ["snakemake", "--cores", "all", "--until", "shard", "--configfile", str(kiln_config.EMBEDDED_DEFAULT)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    return folder


def byte_shards(out: Path, seq_len: int) -> Path:
    """--quick's data: 256 KiB of kiln's own source as bytes (a 256-token vocabulary, one token a
    byte), the last tenth held out, with the byte counts bits per byte needs."""
    out.mkdir(parents=True, exist_ok=True)
    text = b"".join(p.read_bytes() for p in sorted((ROOT / "src" / "kiln").rglob("*.py")))[: QUICK["bytes"]]
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    cut = len(ids) * 9 // 10
    parts = {"train": ids[:cut], "val": ids[cut:]}
    splits = {s: shard_split(t, out, s, seq_len + 1, 512, 256) for s, t in parts.items()}
    counts = {s: {"tokens": len(t), "bytes": len(t)} for s, t in parts.items()}
    write_json(
        out / "manifest.json",
        {
            "seq_len": seq_len,
            "row_len": seq_len + 1,
            "dtype": "uint16",
            "vocab_size": 256,
            "padded_vocab_size": 256,
            "splits": splits,
            "sources": {"kiln": counts},
        },
    )
    return out


def pick_precision(raw: dict, shards: Path) -> str:
    """precision auto on this machine: the faster of bf16 and fp32 over the probe (adamw)."""
    times = {p: step_seconds(sections_for(raw, "adamw", None, p), shards) for p in ("bf16", "fp32")}
    print("probe step time: " + ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in times.items()), flush=True)
    return min(times, key=times.get)


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model, seconds a run (tests/bench/test_bench.py)")
    parser.add_argument("--minutes", type=float, help="training loop time per arm (default: train.budget.minutes)")
    parser.add_argument("--muon-lrs", type=float, nargs="+", help="one muon arm per LR (default: train.muon_lr)")
    parser.add_argument("--no-adamw", action="store_true", help="muon arms only (an LR search)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    args = parser.parse_args()

    raw = kiln_config.read_yaml(kiln_config.EMBEDDED_DEFAULT)
    with tempfile.TemporaryDirectory(prefix="kiln-optimizer-bench-") as tmp:
        tmp = Path(tmp)
        if args.quick:
            raw["model"], raw["shard"]["seq_len"] = QUICK["model"], QUICK["seq_len"]
            raw["train"] |= {"micro_batch": 8, "batch_tokens": None, "warmup_steps": 2, "compile": False}
            PROBE.update(warmup=1, timed=2)
            shards, seconds = byte_shards(tmp / "shards", QUICK["seq_len"]), QUICK["seconds"]
            max_steps = QUICK["max_steps"]
        else:
            max_steps = None
            shards = default_shards(raw)
            seconds = 60 * (args.minutes or raw["train"]["budget"]["minutes"])
        precision = args.precision if args.precision != "auto" else pick_precision(raw, shards)
        defaults = kiln_config.validate(copy.deepcopy(raw))["train"]
        arms = [] if args.no_adamw else [("adamw", None)]
        arms += [("muon", lr) for lr in args.muon_lrs or [defaults["muon_lr"]]]
        rows = []
        for i, (optimizer, muon_lr) in enumerate(arms):
            print(f"arm {optimizer}{'' if muon_lr is None else f' muon_lr {muon_lr:g}'}: {seconds:.0f} s", flush=True)
            sections = sections_for(raw, optimizer, muon_lr, precision)
            rows.append((optimizer, muon_lr, train_arm(sections, shards, seconds, tmp / f"arm-{i}", max_steps)))

    print(
        f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"precision {precision}, seed {raw['seed']}, "
        f"{seconds:.0f} s of training loop per arm"
    )
    print("\n| optimizer | lr (AdamW) | muon_lr | steps | loop s | val loss | val bits/byte |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for optimizer, muon_lr, r in rows:
        bpb = "n/a" if r["val_bpb"] is None else f"{r['val_bpb']:.4f}"
        print(
            f"| {optimizer} | {defaults['lr']:g} | {'' if muon_lr is None else f'{muon_lr:g}'} | {r['steps']} | "
            f"{r['loop_s']:.0f} | {r['val_loss']:.4f} | {bpb} |"
        )


if __name__ == "__main__":
    sys.exit(main())
