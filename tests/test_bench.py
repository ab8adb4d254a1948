"""Every bench script still runs (issue 19, "benches rot unseen": bench/dataprep.py had failed in its
memory part for a while before anyone ran it). Each entry point in bench/ is run as a user types it,
`python bench/X.py --quick`, from the repository root: tiny input through every part that prints its
table. Its figures mean nothing at that size and are not asserted; it must exit 0 having printed the
lines its table begins with (or, for a script not listed in PRINTS, some markdown table).

Entry points are found, not listed: a bench/*.py with an `if __name__ == "__main__":` block that is
not in HELPERS, so a new script is run here the day it lands, and fails with what to do when it has no
--quick. A module without that block must be listed in HELPERS (a script that forgot its main block
would otherwise be skipped silently).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MAIN_BLOCK = 'if __name__ == "__main__":'

# bench/ modules nobody runs by hand: imported by an entry point or started by one as a worker.
HELPERS = {
    "gpu_check_common.py": "gpu_check's shared context and data",
    "gpu_check_llama.py": "gpu_check's llama checks",
    "gpu_check_procs.py": "gpu_check's process isolation",
    "gpu_check_ranks.py": "the two-rank worker gpu_check starts under torchrun (has a main block for torchrun)",
}
# Entry points whose quick mode another test file runs already.
ELSEWHERE = {"gpu_check.py": "tests/test_gpu_check.py runs its --cpu-dry-run (also spelt --quick)"}

# Lines each quick run must print: its table's header and what closes the run.
PRINTS = {
    "budget.py": ["| arm | budget s | stage s (launcher) | of budget |", "| quiet |"],
    "checkpoint_hash.py": ["| write | s (median of 1) | GiB/s |", "Kiln / hash as written: "],
    "cleaning.py": ["### prose (prose filters)", "| corpus | filters | documents | MB | kept |"],
    "code_eval.py": ["| part | Kiln | s | baseline | s | Kiln is |", "canonical solutions pass@1: 1.00 (ours)"],
    "compile_time.py": ["block, count, 2 layers: first forward and backward"],
    "loss_chunks.py": ["| loss chunks | logits a chunk | chunks a micro-batch |", "| unchunked |"],
    "loss_compile.py": ["| loss | s per forward+backward (median) |", "eager / compiled: "],
    "cpu_allocator.py": ["| allocator | tokens/s (median) | min-max |", "ours / baseline: "],
    "data_scatter.py": [
        "| cores | scatter wall s (snakemake) |",
        "| nodes | part jobs at once | scatter min |",
        "| cores | download scatter wall s (snakemake) |",
        "| nodes | download_part jobs at once | scatter min |",
    ],
    "heldout_overlap.py": [
        "| n-gram | train samples holding a held-out one |",
        "| 50 words |",
        "| heldout_ngram | guard | train documents left out | pretokenize s | with it off s |",
    ],
    "dataprep.py": [
        "| pipeline | wall s | MiB/s | Kiln is |",
        "| Kiln pretokenize + shard |",
        "| pretokenize on | MiB | peak RSS MiB, stage process |",
        "| one 1 MiB document + 20 small |",
    ],
    "eval_memory.py": ["| part | implementation | split | tokens | peak RSS (MB) |", "| contamination | old |"],
    "generate.py": ["| loop | new tokens/s | seconds | same output as baseline |", "cached batched / uncached"],
    "loss_memory.py": ["| case | loss | allocated peak MiB |", "model (V 512): chunked / plain allocated peak"],
    "memory_estimate.py": [
        "| model | tokens | V | precision | AC | measured MiB |",
        "| llama 1x32 |",
        "| run | GPU | setting | estimated GiB per GPU |",
        "| llama3.2-1b flagship |",
    ],
    "quality.py": [
        "| arm | wall s | tokens | tokens/s | bpb held-out stdlib | bpb pip/_internal |",
        "ratio kiln/plain: ",
    ],
    "near_dup.py": ["| near-dup | documents/s | seconds | peak RSS MiB |", "Kiln / datasketch: "],
    "optimizer.py": ["| optimizer | lr (AdamW) | muon_lr |"],
    "rerun_cost.py": [
        "| case | change | jobs | rerun s |",
        "| presentation (train.log_every) | `--config train={log_every: 20}` | none |",
        "| price (smoke.price_per_gpu_hour) | `--config smoke={price_per_gpu_hour: 2.5}` | plan, report |",
    ],
    "resume_memory.py": ["| rank | RSS growth |", "| 1 |"],
    "saved_tensors.py": ["| block | weights | mode | activations / token |", "Seed 000 rebuilt"],
    "shard_verify.py": ["verify pass (sha256 + ids, one read)", "| loader | open s | first batch s |"],
    "stage_times.py": ["| stage | wall s | CPU s | max RSS MiB |", "| report | not run |", "| **total** |"],
    "sweep.py": ["| job | s |", "| download (once) |", "| **sweep wall time** (snakemake start to end) |"],
    "tokenizer_scale.py": ["| train_bytes MB | Kiln s | Kiln peak RSS MiB |", "fit: "],
    "train_throughput.py": ["| loop | tokens/s (median) | min-max | TFLOP/s | MFU |", "ours / baseline: "],
}


def _has_main(path: Path) -> bool:
    return MAIN_BLOCK in path.read_text(encoding="utf-8")


MODULES = sorted(p.name for p in BENCH.glob("*.py"))
ENTRY_POINTS = [name for name in MODULES if name not in HELPERS and _has_main(BENCH / name)]


def test_every_bench_module_is_an_entry_point_or_a_listed_helper():
    unlisted = [name for name in MODULES if name not in HELPERS and not _has_main(BENCH / name)]
    assert not unlisted, f"bench/{unlisted}: no {MAIN_BLOCK!r} block; add one, or list the module in HELPERS"
    assert set(HELPERS) <= set(MODULES), f"HELPERS lists modules bench/ no longer has: {set(HELPERS) - set(MODULES)}"
    assert set(PRINTS) <= set(ENTRY_POINTS), f"PRINTS lists scripts that are gone: {set(PRINTS) - set(ENTRY_POINTS)}"
    for name, why in ELSEWHERE.items():
        assert "--quick" in (BENCH / name).read_text(encoding="utf-8"), f"bench/{name}: no --quick ({why})"


@pytest.mark.parametrize("name", [n for n in ENTRY_POINTS if n not in ELSEWHERE])
def test_quick_run_prints_its_table(name):
    if "--quick" not in (BENCH / name).read_text(encoding="utf-8"):
        pytest.fail(
            f"bench/{name} has no --quick flag: give it one that runs every part that prints its table on tiny "
            f"input in a few seconds (see the other bench scripts), or list it in {Path(__file__).name}'s HELPERS "
            "if it is not run by hand"
        )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        [sys.executable, f"bench/{name}", "--quick"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"python bench/{name} --quick exited {done.returncode}:\n{out[-4000:]}"
    lines = done.stdout.splitlines()
    for want in PRINTS.get(name, []):
        assert any(line.startswith(want) for line in lines), f"bench/{name} --quick printed no {want!r}:\n{out[-4000:]}"
    if name not in PRINTS:  # a new script: some markdown table at least
        assert any(line.startswith("|---") for line in lines), f"bench/{name} --quick printed no table:\n{out[-4000:]}"
