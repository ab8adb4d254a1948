"""bench/gpu_check.py, the GPU check no CPU machine can pass, does not rot: its --cpu-dry-run runs
every check's CPU-capable part at tiny shapes (CUDA hidden) and prints the table a GPU run prints,
each row skipped for want of CUDA, none failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = [
    "flash SDPA", "fused AdamW", "torch.compile gpt2-124m", "MFU gpt2-124m seq 1024",
    "bench/train_throughput.py gpt2-124m", "chunked loss memory, flagship logits", "MFU llama3.2-1b seq 8192",
    "MFU llama3.2-1b, torchtitan's count", "memory estimate llama3.2-1b seq 8192", "smoke memory snapshot",
    "eval on GPU vs CPU", "tiny pipeline, train.device=cuda", "bench/generate.py",
]


def test_cpu_dry_run_prints_every_row_and_fails_none(tmp_path):
    command = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--cpu-dry-run", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert lines[0] == "| check | result | figure | expected |"
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]
    assert [r[0] for r in rows] == ROWS
    for check, result, figure, expected in rows:
        assert result == "skipped: no CUDA", (check, result, figure)
        assert figure.startswith("CPU part: ") and expected, check
    by_check = {r[0]: r[2] for r in rows}
    assert "flash" in by_check["flash SDPA"] and "_fused_adamw_" in by_check["fused AdamW"]
    assert "merged into tiny.yaml's train section" in by_check["tiny pipeline, train.device=cuda"]
    assert "chunked vs" in by_check["chunked loss memory, flagship logits"]
    assert "estimated" in by_check["memory estimate llama3.2-1b seq 8192"]
    assert "torchtitan's count" in by_check["MFU gpt2-124m seq 1024"]
    assert (tmp_path / "snapshot" / "smoke" / "trace.json").exists()  # the smoke probe traced its step
