"""kiln.plan.memory's estimate of a step's peak: against real train steps on this CPU, then for the
seeds' runs on their GPUs.

    python bench/memory_estimate.py              # both tables
    python bench/memory_estimate.py --seeds-only # the seeds' table alone (torch-free arithmetic, instant)
    python bench/memory_estimate.py --quick      # both tables, the CPU one on QUICK_ROWS: tests/bench/test_bench.py

The CPU table builds Kiln's Trainer on random-token shards (train.device cpu, compile off unless the
row says compiled: then aot_eager_decomp_partition, inductor's partitioner without its C++), runs one
step (AdamW's moments allocated) and measures the next: the weights and optimizer state alive before
it plus the peak of torch's CPU profiler during it (kiln.train.cpu_memory). The seeds' table is
`kiln plan`'s memory rows for the run files in config/experiments/ (not the sweeps laid over them), plus llama3.2-1b's flagship shape under
each activation checkpointing mode on one GPU.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln import config as kiln_config
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.forecast import model_vocab
from kiln.plan.memory import GIB, Setting, estimate, fit_report, setting_of
from kiln.plan.peaks import gpu_of

REPO = Path(__file__).resolve().parents[1]
CPU_ROWS = [  # tests/unit/plan/test_memory.py's shapes and more: (model, seq_len, micro_batch, vocab, precision, AC, compiled)
    ({"n_layer": 4, "n_head": 4, "d_model": 256}, 512, 8, 512, "bf16", "none", False),
    ({"n_layer": 4, "n_head": 4, "d_model": 256}, 512, 8, 512, "fp32", "full", False),
    ({"n_layer": 4, "n_head": 4, "d_model": 256}, 256, 16, 8192, "bf16", "selective", False),
    (
        {"family": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 256},
        512,
        8,
        512,
        "fp32",
        "selective",
        False,
    ),
    (
        {"family": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 256},
        512,
        8,
        512,
        "bf16",
        "none",
        False,
    ),
    (
        {"family": "llama", "n_layer": 6, "n_head": 8, "n_kv_head": 2, "d_model": 128},
        512,
        4,
        32768,
        "bf16",
        "full",
        False,
    ),
    ({"family": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 256}, 512, 8, 512, "bf16", "none", True),
    ({"n_layer": 4, "n_head": 4, "d_model": 256}, 256, 16, 8192, "bf16", "none", True),
]
# --quick: two tiny eager rows (a compiled row costs seconds of tracing; tests/unit/plan/test_memory.py
# compiles with the same backend)
QUICK_ROWS = [
    ({"n_layer": 1, "n_head": 2, "d_model": 32}, 32, 2, 512, "fp32", "none", False),
    ({"family": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 32}, 32, 2, 512, "bf16", "full", False),
]


def cpu_table(rows: list[tuple] = CPU_ROWS) -> None:
    import torch

    from kiln.train.cpu_memory import allocated_during, tensor_bytes
    from kiln.train.trainer import Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_throughput import synthetic_shards

    print("| model | tokens | V | precision | AC | measured MiB | estimated MiB | est / measured |")
    print("|---|---|---:|---|---|---:|---:|---:|")
    for model, seq, micro, vocab, precision, ac, compiled in rows:
        train = {
            "micro_batch": micro,
            "max_steps": 10,
            "warmup_steps": 1,
            "precision": precision,
            "compile": False,
            "activation_checkpointing": ac,
            "device": "cpu",
        }
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(
                RunConfig.of(
                    kiln_config.stage_sections("train", seed=1, shard={"seq_len": seq}, model=model, train=train)
                ),
                synthetic_shards(Path(tmp), vocab, seq, rows=4 * micro, seed=1),
            )
            if compiled:
                trainer.model.compile(backend="aot_eager_decomp_partition")
            trainer.train_step()
            resident = tensor_bytes(
                [*trainer.model.parameters(), *(t for s in trainer.optimizer.state.values() for t in s.values())]
            )
            _, step = allocated_during(trainer.train_step)
        measured = resident + step.peak
        est = estimate(
            trainer.model_config,
            Setting(
                micro_batch=micro, bf16=precision == "bf16", activation_checkpointing=ac, compiled=compiled, cuda=False
            ),
        ).total
        name = f"{model.get('family', 'gpt2')} {model['n_layer']}x{model['d_model']}" + (
            ", compiled" if compiled else ""
        )
        print(
            f"| {name} | {micro} x {seq} | {vocab:,} | {precision} | {ac} | {measured / 2**20:,.1f} | "
            f"{est / 2**20:,.1f} | {est / measured:.3f} |",
            flush=True,
        )
        del trainer
        torch._dynamo.reset()


def seeds_table() -> None:
    print("| run | GPU | setting | estimated GiB per GPU | fits? | what to change |")
    print("|---|---|---|---:|---|---|")
    for path in sorted((REPO / "config" / "experiments").glob("*.yaml")):
        raw = kiln_config.read_yaml(path)
        if raw.get("sweep"):  # an overlay on a run file listed here, not a run
            continue
        source = ((raw.get("train") or {}).get("init_from") or {}).get("hf")
        if source and not (REPO / source / "config.json").is_file():  # its shape is the checkpoint's
            print(f"| {path.stem} | | | | | needs the checkpoint it continues, {source} (not shipped) |")
            continue
        run = RunConfig.of(kiln_config.resolve([str(path)], {}))
        model = model_config(run.model.as_dict(), vocab_size=model_vocab(run.tokenizer), seq_len=run.shard.seq_len)
        gpu = gpu_of(run.plan.gpu)
        report = fit_report(model, setting_of(run.train), gpu.fragment, gpu.memory_gib)
        _row(path.stem, report)
    flagship = model_config({"flavour": "llama3.2-1b"}, vocab_size=32768, seq_len=8192)
    base = Setting(micro_batch=6, world=1, parallel="ddp")
    for gpu_name, ac, compiled in [
        ("H100", "none", True),
        ("H100", "selective", True),
        ("H100", "full", True),
        ("H100", "none", False),
        ("H200", "none", True),
        ("H200 NVL", "none", False),
    ]:
        gpu = gpu_of(gpu_name)
        report = fit_report(
            flagship, replace(base, activation_checkpointing=ac, compiled=compiled), gpu.fragment, gpu.memory_gib
        )
        _row("llama3.2-1b flagship", report)


def _row(run: str, report: dict) -> None:
    change = "; ".join(f"{c['set']}: {c['gib_per_gpu']:.1f} GiB" for c in report["changes"]) or "-"
    print(
        f"| {run} | {report['gpu']} ({report['gpu_memory_gib']:g} GiB) | {report['assumes']} | "
        f"{report['gib_per_gpu']:.1f} | {'yes' if report['fits'] else 'no'} | {change} |"
    )


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--seeds-only", action="store_true")
    args = parser.parse_args()
    if not args.seeds_only:
        cpu_table(QUICK_ROWS if args.quick else CPU_ROWS)
        print()
    seeds_table()
    print(
        f"\nfits: the estimate within {0.9:.0%} of the GPU's memory (kiln.plan.memory.FIT_FRACTION); 1 GiB = {GIB:,} bytes"
    )


if __name__ == "__main__":
    main()
