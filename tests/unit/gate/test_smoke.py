"""The smoke gate: a healthy run passes every check; deliberately broken ones (lr 0, labels equal to
the inputs, a mask that sees the future, a model that cannot fit in memory) fail the check that
names the fault; the plan reproduces seed 000's arithmetic; the stage script gates train.

Runs in-process on the synthetic shards of tests/synthetic.py (learnable structure, 64-token vocab).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from seccomp import SYS_UNSHARE, refuse_unshare
from synthetic import REPO, SEQ_LEN, smoke_sections, write_shards

import kiln.train.trainer as trainer_module
from kiln.config.batch import BatchSplit
from kiln.config.run_config import RunConfig
from kiln.errors import KilnError
from kiln.eval import sandbox
from kiln.eval.in_loop import HumanEvalInLoop
from kiln.gate.checks import run_checks
from kiln.plan.anchors import SEED_000
from kiln.plan.steps import full_run_plan
from kiln.plan.tables import render_plan

SMOKE_SCRIPT = REPO / "workflow" / "scripts" / "smoke.py"
PLAN_SCRIPT = REPO / "workflow" / "scripts" / "plan.py"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def by_name(report: dict) -> dict:
    return {c.name: c for c in report["checks"]}


def failed(report: dict) -> set[str]:
    return {c.name for c in report["checks"] if not c.passed}


def test_healthy_tiny_run_passes_every_check(shards, tmp_path):
    report = run_checks(RunConfig.of(smoke_sections()), shards, tmp_path)
    checks = by_name(report)
    assert list(checks) == [
        "preflight",
        "causality",
        "init loss",
        "health",
        "generalisation",
        "data",
        "tokens",
        "overfit",
    ]
    assert failed(report) == set(), [(c.name, c.figure, c.detail) for c in report["checks"]]
    assert report["val_loss_after"] < report["val_loss_init"]
    # the measured peak beside kiln.plan.memory's estimate of the same step
    assert "peak memory" in checks["preflight"].figure and "tensors estimated per device" in checks["preflight"].figure
    assert len(report["losses"]) == len(report["grad_norms"]) == 12
    probe = report["probe"]
    assert probe["measured_steps"] == 10 and probe["tokens_per_s"] > 0 and 0 <= probe["data_wait_fraction"] < 1
    assert probe["mfu"] is None  # no peak FLOP/s is known for a CPU
    # AdamW's two fp32 moments: a checkpoint is about three times the fp32 weights.
    assert 2.9 * report["model_bytes"] < report["checkpoint_bytes"] < 3.1 * report["model_bytes"]
    assert not (tmp_path / "trace.json").exists()


@pytest.mark.parametrize(
    "train",
    [
        {"checkpoint_format": "full"},
        {"checkpoint_format": "sharded"},
        {"checkpoint_format": "sharded", "async_checkpoint": True},
    ],
    ids=["full", "sharded", "sharded-async"],
)
def test_the_checkpoint_timed_is_the_one_train_writes(shards, tmp_path, train):
    """The checkpoint whose writing a budget's step count allows for is the one train writes: its
    Saver and format, with the weights and AdamW's two moments (the probe's steps allocated them),
    so at least three times the fp32 weights on disk. Smoke used to time a state.pt without model
    or optimizer, a few KB whatever the model size (issue 18)."""
    report = run_checks(RunConfig.of(smoke_sections(train=train)), shards, tmp_path)
    assert report["checkpoint_written_bytes"] >= 3 * report["model_bytes"]
    assert report["checkpoint_written_bytes"] >= report["checkpoint_bytes"]
    assert report["times"]["checkpoint_s"] > 0
    # a rank's host memory after the checkpoint: at least this process's weights and moments (issue 29, O2)
    assert report["host_mb_per_rank"] * 2**20 > report["checkpoint_bytes"]
    assert not list(tmp_path.glob(".checkpoint-timing-*"))  # the scratch checkpoint is removed


def test_lr_zero_fails_health_and_overfit(shards, tmp_path, monkeypatch):
    # A schedule bug that never leaves 0 (the "warmup never ends" kind).
    monkeypatch.setattr(trainer_module, "schedule_from_config", lambda train, max_steps: lambda step: 0.0)
    checks = by_name(run_checks(RunConfig.of(smoke_sections()), shards, tmp_path))
    assert {"health", "overfit", "generalisation"} <= {n for n, c in checks.items() if not c.passed}
    assert "did not fall" in checks["health"].detail
    assert "memorise" in checks["overfit"].detail
    assert checks["causality"].passed and checks["init loss"].passed


def test_labels_equal_to_inputs_fail_generalisation(shards, tmp_path, monkeypatch):
    # The classic shift bug: the model is taught to copy its input, which it learns at once.
    monkeypatch.setattr(trainer_module, "_split", lambda batch: (batch[:, :-1], batch[:, :-1]))
    report = run_checks(RunConfig.of(smoke_sections()), shards, tmp_path)
    checks = by_name(report)
    assert not checks["generalisation"].passed
    assert "shifted by one" in checks["generalisation"].detail
    assert report["val_loss_after"] > report["val_loss_init"]  # copying makes next-token prediction worse
    assert checks["health"].passed  # the training loss alone would have looked fine


def test_attention_that_sees_the_future_fails_causality(shards, tmp_path, monkeypatch):
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def unmasked(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        return sdpa(q, k, v, dropout_p=dropout_p, is_causal=False, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", unmasked)
    checks = by_name(run_checks(RunConfig.of(smoke_sections()), shards, tmp_path))
    assert not checks["causality"].passed
    assert "later tokens" in checks["causality"].detail


def test_degenerate_tokens_fail_the_tokens_check(tmp_path):
    # What a tokenizer that maps most text to one id (an unknown-token id, say) leaves in the shards.
    stream = np.full(64 * (SEQ_LEN + 1), 3, dtype=np.uint16)
    stream[::50] = 0
    shards = write_shards(tmp_path / "shards", train_tokens=stream)
    checks = by_name(run_checks(RunConfig.of(smoke_sections()), shards, tmp_path / "smoke"))
    assert not checks["tokens"].passed and "nearly constant" in checks["tokens"].detail
    assert checks["overfit"].passed  # constant rows are trivially memorised: only the tokens check sees it


def test_model_too_big_for_memory_fails_preflight_with_advice(shards, tmp_path):
    # ~200 GB of attention weights: the allocator refuses at once (no swap to thrash).
    huge = {"n_layer": 1, "n_head": 1, "d_model": 2**17}
    report = run_checks(RunConfig.of(smoke_sections(model=huge)), shards, tmp_path)
    assert [(c.name, c.passed) for c in report["checks"]] == [("preflight", False)]
    assert "estimated" in report["checks"][0].figure  # what the step would need, from the shapes
    detail = report["checks"][0].detail
    assert "train.micro_batch: 4" in detail and "activation_checkpointing" in detail and "fsdp" in detail
    assert "probe" not in report


def test_profile_step_writes_a_chrome_trace(shards, tmp_path):
    report = run_checks(RunConfig.of(smoke_sections(profile_step=4)), shards, tmp_path)
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    # 10 timed steps in spans of 2: the traced step's span (steps 3-4) is not timed
    assert report["probe"]["measured_steps"] == 8


def test_plan_reproduces_seed_000():
    # Seed 000: Llama-3.2-1B (1,040,254,976 parameters), local batch 6 on 4 H100s at seq 8192, 50k
    # steps, 55.8k tokens/s per GPU, $12.36/hour for the 4-GPU node ($3.09 per GPU-hour).
    plan = full_run_plan(
        batch=BatchSplit(world=4, micro_batch=6, seq_len=8192, grad_accum=1),
        max_steps=50_000,
        tokens_per_s=4 * SEED_000.tokens_per_s_per_gpu,
        n_params=1_040_254_976,
        train_tokens=10_000_000_000,
        checkpoint_bytes=12 * 1_040_254_976,
        keep_checkpoints=2,
        model_bytes=4 * 1_040_254_976,
        price_per_gpu_hour=12.36 / 4,
    )
    assert plan["total_tokens"] == 9_830_400_000
    assert plan["eta_h"] == pytest.approx(12.2, abs=0.05)
    assert plan["cost"] == pytest.approx(151, abs=1)
    assert plan["tokens_per_param"] == pytest.approx(9.45, abs=0.01)
    assert plan["epochs"] == pytest.approx(0.98304)
    assert plan["disk_bytes"] == (2 * 12 + 2 * 4) * 1_040_254_976
    text = render_plan(plan)
    assert "9,830,400,000" in text and "$151." in text and "0.47x Chinchilla" in text


def test_plan_without_price_has_no_cost():
    plan = full_run_plan(
        batch=BatchSplit(1, 16, 256, 1),
        max_steps=500,
        tokens_per_s=4096.0,
        n_params=10**6,
        train_tokens=10**6,
        checkpoint_bytes=10,
        keep_checkpoints=1,
        model_bytes=4,
    )
    assert plan["cost"] is None and plan["eta_s"] == pytest.approx(500.0)
    assert "no price set" in render_plan(plan) and "the train split repeats" in render_plan(plan)


def test_config_rejects_warmup_not_below_probe_steps():
    with pytest.raises(KilnError, match=r"smoke.warmup_steps: 12 must be below smoke.steps=12"):
        smoke_sections(warmup_steps=12)


# kiln.eval.sandbox's fallback, as Docker's default seccomp profile or Ubuntu 24.04's AppArmor restriction
# leave it: the kernel refuses the namespaces.
REFUSED = {"filesystem": "the host's, under file permissions only (namespaces unavailable: [Errno 1] unshare: EPERM)"}
# The smoke script, on a machine whose sandbox probe (kiln.eval.sandbox.protections) reports REFUSED.
WHERE_REFUSED = (
    "import runpy\n"
    "from kiln.eval import sandbox\n"
    f"sandbox.protections = lambda: {REFUSED!r}\n"
    f"runpy.run_path({str(SMOKE_SCRIPT)!r}, run_name='__main__')\n"
)


def _run_script(
    shards: Path, out: Path, sections: dict, refused: bool = False, preexec_fn=None
) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    return subprocess.run(
        [
            sys.executable,
            *(["-c", WHERE_REFUSED] if refused else [str(SMOKE_SCRIPT)]),
            "--params",
            json.dumps(sections),
            "--shards",
            str(shards),
            "--out",
            str(out),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        preexec_fn=preexec_fn,
    )


def test_script_gate_fails_naming_the_check_and_writes_no_report(shards, tmp_path):
    unreachable = {"rows": 4, "max_steps": 3, "max_loss": 1e-6}
    proc = _run_script(shards, tmp_path / "smoke", smoke_sections(overfit=unreachable))
    assert proc.returncode == 1
    assert "smoke: FAILED: overfit" in proc.stderr
    assert "| overfit | FAIL |" in proc.stdout
    assert not (tmp_path / "smoke" / "report.json").exists()


def test_script_with_gate_off_reports_the_skip_and_the_plan_stage_prices_it(shards, tmp_path):
    unreachable = {"rows": 4, "max_steps": 3, "max_loss": 1e-6}
    sections = smoke_sections(overfit=unreachable, gate=False, price_per_gpu_hour=2.0)
    proc = _run_script(shards, tmp_path / "smoke", sections)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["gate"] == "skipped (smoke.gate is false; failed: overfit)"
    # The plan stage prices what smoke measured (a rule of its own: a new price reruns no smoke)
    smoke = tmp_path / "smoke"
    priced = subprocess.run(
        [sys.executable, str(PLAN_SCRIPT), "--params", json.dumps(sections), "--smoke", str(smoke / "report.json")]
        + ["--plan", str(smoke / "plan.json"), "--markdown", str(smoke / "plan.md")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert priced.returncode == 0, priced.stderr
    plan = json.loads((tmp_path / "smoke" / "plan.json").read_text())
    assert plan["total_tokens"] == 1000 * 8 * SEQ_LEN and plan["cost"] > 0
    assert (tmp_path / "smoke" / "plan.md").read_text().startswith("# Plan for the full run")


QUICK_OVERFIT = {"rows": 4, "max_steps": 2, "max_loss": 100.0}  # passes at its first step


def _in_loop(sections: dict) -> dict:
    """The sections with eval.in_loop on (at the validations' cadence) and an overfit check that passes
    at once: the gate's verdict then turns on the sandbox alone."""
    sections["eval"]["in_loop"]["every"] = sections["train"]["eval_every"]
    sections["smoke"]["overfit"] = QUICK_OVERFIT
    return sections


def test_script_with_the_in_loop_eval_stops_before_its_probe_where_the_sandbox_is_refused(
    shards, tmp_path, monkeypatch
):
    """The train stage's in-loop eval refuses before its first step where namespaces are refused
    (issue 59, defect 6): the smoke stage asks the same before its probe, and fails with train's error."""
    monkeypatch.setattr(sandbox, "protections", lambda: REFUSED)
    with pytest.raises(KilnError) as train_refuses:
        HumanEvalInLoop(tmp_path / "unread-tokenizer.json", RunConfig.of(_in_loop(smoke_sections())).eval)
    refusal = str(train_refuses.value)  # naming eval.in_loop and the fixes (tests/unit/eval/test_in_loop.py)
    proc = _run_script(shards, tmp_path / "smoke", _in_loop(smoke_sections()), refused=True)
    assert proc.returncode == 1 and refusal in proc.stderr
    assert not (tmp_path / "smoke").exists()  # run_checks never started: no model, no probe step


@pytest.mark.skipif(SYS_UNSHARE is None, reason="unshare's syscall number on this machine is not known here")
def test_script_with_the_in_loop_eval_under_dockers_seccomp_profile_stops_naming_eval_in_loop(shards, tmp_path):
    """The real probe, where the kernel refuses unshare as Docker's default seccomp profile does
    (tests/seccomp.py): the stage stops before its probe with the train stage's error, not a traceback
    (as root, the probe's program, run as uid 65534 without the view, may not reach the interpreter)."""
    proc = _run_script(shards, tmp_path / "smoke", _in_loop(smoke_sections()), preexec_fn=refuse_unshare)
    assert proc.returncode == 1, proc.stderr
    refused = "eval.in_loop: the sandbox cannot confine generated programs on this machine (the host's, under "
    refused += "file permissions only (namespaces unavailable: [Errno 1] unshare: Operation not permitted)"
    assert refused in proc.stderr and "seccomp=unconfined" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "smoke").exists()


def test_script_with_the_in_loop_eval_off_asks_nothing_of_the_sandbox(shards, tmp_path):
    sections = smoke_sections(overfit=QUICK_OVERFIT)
    proc = _run_script(shards, tmp_path / "smoke", sections, refused=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    assert report["gate"] == "passed" and "sandbox" not in {c["name"] for c in report["checks"]}


def test_script_with_the_in_loop_eval_reports_this_machines_sandbox(shards, tmp_path):
    """The real probe, on this machine's kernel: where it confines the programs, the gate passes and its
    table and report.json say how."""
    if sandbox.unconfined() is not None:
        pytest.skip(f"this kernel refuses the namespaces: {sandbox.unconfined()}")
    proc = _run_script(shards, tmp_path / "smoke", _in_loop(smoke_sections()))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert report["gate"] == "passed" and checks["sandbox"]["passed"]
    assert checks["sandbox"]["figure"] == sandbox.protections()["filesystem"]
    assert f"| sandbox | pass | {checks['sandbox']['figure']} |" in proc.stdout


def _recording_compile(monkeypatch) -> list[dict]:
    """Make the trainer compile with a backend that records each graph dynamo hands it (the mode it
    was traced in, and whether any input has a symbolic size: dimensions dynamo marked dynamic) and
    runs it as traced. Dynamo's state is reset first: its automatic-dynamic marks live on the
    model's code objects, across models."""
    import kiln.train.parallel as parallel

    graphs: list[dict] = []

    def recorder(gm, example_inputs):
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        dynamic = any(
            isinstance(v, torch.SymInt)
            or (isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape))
            for v in values
        )
        graphs.append(
            {
                "grad": torch.is_grad_enabled(),
                "dynamic": dynamic,
                "shapes": [tuple(v.shape) for v in values if isinstance(v, torch.Tensor) and v.dim() == 2],
            }
        )
        return gm.forward

    torch._dynamo.reset()
    real = parallel.compile_blocks
    monkeypatch.setattr(parallel, "compile_blocks", lambda model: real(model, backend=recorder))
    return graphs


def test_the_probe_compiles_the_graph_train_compiles(shards, tmp_path, monkeypatch):
    """With compile on, the smoke stage's checks at other shapes (causality at 2 rows, validation) run
    eager: the probe's compiled graphs are the train step's, static, as a train run compiles them
    first; through the compiled model they would come first and make dynamo mark batch and length
    dynamic."""
    graphs = _recording_compile(monkeypatch)
    report = run_checks(RunConfig.of(smoke_sections(train={"compile": True})), shards, tmp_path / "smoke")
    assert not failed(report)
    smoke_graphs = list(graphs)
    graphs.clear()
    torch._dynamo.reset()
    trainer = trainer_module.Trainer(RunConfig.of(smoke_sections(train={"compile": True})), shards, max_steps=3)
    for _ in range(3):
        trainer.train_step()
    assert graphs and all(g["grad"] and not g["dynamic"] for g in graphs), graphs
    assert smoke_graphs == graphs
    assert by_name(report)["recompiles"].passed  # none after the warm-up


def test_a_compiled_step_that_recompiles_in_the_timed_steps_fails_the_gate(shards, tmp_path, monkeypatch):
    """From the fifth batch on, one row fewer (what a shape that changes between steps does): dynamo
    compiles the blocks again during the timed steps, and the recompiles check fails, where the same
    run with steady shapes passes it (test above)."""
    _recording_compile(monkeypatch)
    from kiln.data.loader import TrainBatches

    real, calls = TrainBatches.next, []

    def shrinking(self):
        calls.append(1)
        batch = real(self)
        return batch[:-1] if len(calls) > 4 else batch

    monkeypatch.setattr(TrainBatches, "next", shrinking)
    checks = by_name(run_checks(RunConfig.of(smoke_sections(train={"compile": True})), shards, tmp_path / "smoke"))
    assert not checks["recompiles"].passed and "TORCH_LOGS=recompiles" in checks["recompiles"].detail


def test_a_burst_of_load_in_one_span_does_not_move_the_probes_figure(shards, monkeypatch):
    """The median span counts: one step made 50x slower (a neighbour's burst) leaves the probe's step
    time at the others', where a mean over the window would be ~6x theirs. The clock is the test's
    (each step takes 1 s of it, the sixth 50 s), so the figure does not depend on the machine."""
    from kiln.gate import checks, probe

    clock = {"now": 0.0, "steps": 0}
    real = checks.Trainer.train_step

    def train_step(self):
        out = real(self)
        clock["steps"] += 1
        clock["now"] += 50.0 if clock["steps"] == 6 else 1.0  # the sixth: inside the second span
        return out

    trainer = checks.Trainer(RunConfig.of(smoke_sections()), shards, max_steps=12)
    monkeypatch.setattr(checks.Trainer, "train_step", train_step)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock["now"])
    _, _, measured = probe.probe(trainer, steps=12, warmup=2)
    assert measured.measured_steps == 10 and measured.step_time_s == 1.0
