"""The smoke gate's verdict (kiln.plan.verdict.SmokeReport): it round-trips through report.json,
a missing, torn or foreign report is a KilnError naming the file, require_passed names the failed
checks, the train script refuses a failed gate, and the report stage reads it without torch.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from synthetic import REPO

from kiln.config.batch import BatchSplit
from kiln.errors import KilnError
from kiln.plan.steps import StageTimes
from kiln.plan.verdict import VERSION, Check, Gate, Measurements, Probe, SmokeReport
from kiln.report.run import _smoke_section

TRAIN_SCRIPT = REPO / "workflow" / "scripts" / "train.py"
MEASURED = Measurements(
    probe=Probe(
        tokens_per_s=4096.0,
        step_time_s=0.5,
        data_wait_fraction=0.01,
        peak_memory_mb=100.0,
        mfu=0.25,
        tflops=1.5,
        measured_steps=10,
    ),
    losses=(4.1, 3.0),
    grad_norms=(1.0, 0.5),
    val_loss_init=4.1,
    val_loss_after=3.2,
    n_params=10**6,
    checkpoint_bytes=12 * 10**6,
    model_bytes=4 * 10**6,
    train_tokens=10**6,
    batch=BatchSplit(1, 16, 256, 1),
    device="cpu",
    world=1,
    times=StageTimes(step_s=0.5, startup_s=9.0, validation_s=1.5, checkpoint_s=0.25),
    precision="bf16",
    precision_tokens_per_s={"bf16": 4096.0, "fp32": 2048.0},
)


def checks(*failing: str) -> list[Check]:
    names = ["preflight", "causality", "health", "overfit"]
    return [Check(n, n not in failing, "figure", "threshold", "detail" if n in failing else "") for n in names]


def test_judge_and_round_trip(tmp_path):
    for failing, enforce, gate in [
        ((), True, Gate.PASSED),
        (("overfit",), False, Gate.SKIPPED),
        (("health", "overfit"), True, Gate.FAILED),
    ]:
        report = SmokeReport.judge(checks(*failing), MEASURED, enforce=enforce)
        assert report.gate is gate and report.failed == failing
        report.save(tmp_path / "report.json")
        assert SmokeReport.load(tmp_path / "report.json") == report


def test_on_disk_shape_keeps_gate_words_and_measurements_at_the_top(tmp_path):
    SmokeReport.judge(checks("overfit"), MEASURED, enforce=False).save(tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["gate"] == "skipped (smoke.gate is false; failed: overfit)"
    assert [c["name"] for c in data["checks"] if c["passed"]] == ["preflight", "causality", "health"]
    assert data["probe"]["tokens_per_s"] == 4096.0 and data["batch"]["micro_batch"] == 16


def test_report_without_measurements_round_trips(tmp_path):
    # Out of memory in preflight: the probe never ran, smoke.gate false let it through.
    report = SmokeReport.judge([Check("preflight", False, "out of memory", "fits in memory")], None, enforce=False)
    report.save(tmp_path / "report.json")
    assert SmokeReport.load(tmp_path / "report.json").measurements is None


def test_require_passed_names_the_failed_checks():
    SmokeReport.judge(checks(), MEASURED, enforce=True).require_passed()
    SmokeReport.judge(checks("overfit"), MEASURED, enforce=False).require_passed()  # smoke.gate: false
    with pytest.raises(KilnError, match=r"smoke: FAILED: health, overfit \("):
        SmokeReport.judge(checks("health", "overfit"), MEASURED, enforce=True).require_passed()


def test_a_gate_that_contradicts_its_checks_is_refused():
    with pytest.raises(ValueError, match="does not match the failed checks"):
        SmokeReport(tuple(checks("overfit")), Gate.PASSED, MEASURED)


def test_load_of_a_missing_report_names_the_file(tmp_path):
    with pytest.raises(
        KilnError, match=re.escape(f"{tmp_path / 'report.json'}: no smoke report there; run the smoke stage")
    ):
        SmokeReport.load(tmp_path / "report.json")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda text: text[: len(text) // 2], "not a complete smoke report"),  # a torn copy
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "version"}),
            f"a smoke report from another version of kiln .format version none, this kiln reads {VERSION}.",
        ),  # written before the version field
        (
            lambda text: json.dumps({**json.loads(text), "version": 99}),
            "a smoke report from another version of kiln .format version 99",
        ),
        (lambda text: json.dumps({**json.loads(text), "gate": "maybe"}), "not a valid smoke report"),
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "n_params"}),
            "not a valid smoke report",
        ),
    ],
    ids=["torn", "no version", "another version", "unknown gate", "missing figure"],
)
def test_load_of_a_bad_report_names_the_file_and_the_fault(tmp_path, edit, message):
    path = tmp_path / "report.json"
    SmokeReport.judge(checks(), MEASURED, enforce=True).save(path)
    path.write_text(edit(path.read_text()))
    with pytest.raises(KilnError, match=rf"^{re.escape(str(path))}: {message}.*rerun the smoke stage"):
        SmokeReport.load(path)


def test_train_refuses_a_report_whose_gate_failed(tmp_path):
    smoke = tmp_path / "report.json"
    SmokeReport.judge(checks("overfit"), MEASURED, enforce=True).save(smoke)
    proc = subprocess.run(
        [
            sys.executable,
            str(TRAIN_SCRIPT),
            "--params",
            "{}",
            "--shards",
            str(tmp_path / "shards"),
            "--smoke",
            str(smoke),
            "--tokenizer",
            str(tmp_path / "tokenizer.json"),
            "--out",
            str(tmp_path / "train"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "smoke: FAILED: overfit" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "train").exists()


def test_report_shows_the_gate_and_its_checks():
    plan = {"eta_s": 7200.0, "total_tokens": 10**6, "tokens_per_s": 4096.0, "tokens_per_param": 1.0, "cost": None}
    train = {"tokens_seen": 10**6, "tokens_per_s": 4000.0, "mfu": 0.2, "mfu_torchtitan": 0.16, "wall_s": 7300.0}
    text = "\n".join(_smoke_section(SmokeReport.judge(checks("overfit"), MEASURED, enforce=False), plan, train))
    assert "Gate: **skipped (smoke.gate is false; failed: overfit)**" in text
    assert "| overfit | FAIL | figure | threshold | detail |" in text
    assert "| MFU, Kiln's FLOP count (6N + 12·L·H·Q·T) | 25.0% | 20.0% |" in text and "| time | 2h00m | 2h01m" in text
    # both conventions side by side; a report.json written before the second one reads n/a
    assert "| MFU, torchtitan transformers-backend count (6(N - embeddings) + 6·L·H·Q·T) | n/a | 16.0% |" in text


def test_report_names_sdpas_kernel_and_kilns_own_attention_apart():
    """smoke/report.json's attention_kernel in report.md: SDPA's backends by name, Kiln's own paths
    (a CPU's compiled step: blockwise_causal; a document mask: flex_attention) not as SDPA's."""
    for kernel, line in [
        ("FLASH_ATTENTION", "Attention: SDPA's FLASH_ATTENTION kernel (kiln.model.sdpa)."),
        (
            "blockwise_causal",
            "Attention: blockwise_causal, causal attention written out for inductor (kiln.model.sdpa).",
        ),
        ("flex_attention", "Attention: flex_attention, within each document (kiln.model.sdpa)."),
    ]:
        measured = replace(MEASURED, attention_kernel=kernel)
        text = "\n".join(_smoke_section(SmokeReport.judge(checks(), measured, enforce=True), {}, {}))
        assert line in text, kernel


def test_the_report_stage_does_not_import_torch():
    code = (
        "import sys; import kiln.report.run, kiln.plan.verdict, kiln.plan.tables; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_train_job_asks_each_node_for_its_ranks_measured_host_memory_with_headroom():
    """Issue 29, O2: the train rule's mem_mb (workflow/rules/common.smk, train_memory_mb) from the smoke
    stage's figure per rank (compile workers included), so eight ranks' inductor workers are asked for."""
    from kiln.plan.verdict import HOST_MEMORY_HEADROOM, LAUNCHER_MB

    measured = replace(MEASURED, host_mb_per_rank=3000.0)
    assert measured.node_memory_mb(8) == math.ceil(8 * 3000 * HOST_MEMORY_HEADROOM + LAUNCHER_MB)
    assert measured.node_memory_mb(8) > 8 * 3000 and measured.node_memory_mb(1) < measured.node_memory_mb(2)
    assert MEASURED.node_memory_mb(8) is None  # an older report: the rule falls back to a fixed request
