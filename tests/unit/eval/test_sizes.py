"""kiln.eval.sizes: the `auto` sizes of the code evals for a CPU and a GPU, their price, and the
sampled n a GPU eval affords within its share of the train stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import typed_section

from kiln.config.models import model_config
from kiln.errors import KilnError
from kiln.eval import sizes
from kiln.eval.code import run_code_evals
from kiln.plan.anchors import SEED_000
from kiln.plan.decode import Machine
from kiln.plan.peaks import gpu_of

LLAMA_1B = model_config({"flavour": "llama3.2-1b"}, vocab_size=32768, seq_len=8192)
H100 = gpu_of("NVIDIA H100 80GB HBM3")
MACHINE = Machine.of(H100, 0.4)


def test_auto_is_a_few_problems_on_a_cpu_and_the_published_sizes_on_a_gpu_and_a_set_size_stays():
    cfg = typed_section("eval", {})
    cpu, gpu = sizes.resolve(cfg, on_gpu=False), sizes.resolve(cfg, on_gpu=True, samples=20)
    assert (cpu.humaneval.problems, cpu.humaneval.samples) == (4, 0)
    assert (cpu.humaneval_infill.problems, cpu.humaneval_infill.tasks_per_kind) == (2, 8)
    assert (gpu.humaneval.problems, gpu.humaneval.samples) == (164, 20)
    assert (gpu.humaneval_infill.problems, gpu.humaneval_infill.tasks_per_kind) == (164, None)
    set_here = typed_section("eval", {"humaneval": {"problems": 10, "samples": 0}, "humaneval_infill": {"problems": 3}})
    kept = sizes.resolve(set_here, on_gpu=True, samples=200)
    assert (kept.humaneval.problems, kept.humaneval.samples, kept.humaneval_infill.problems) == (10, 0, 3)
    with pytest.raises(KilnError, match="eval.humaneval.problems, eval.humaneval.samples, .*still auto"):
        run_code_evals(None, None, cfg, seed=0)


def test_the_gpu_workload_is_every_published_task_and_the_codex_draws():
    work = sizes.workload(sizes.resolve(typed_section("eval", {}), on_gpu=True, samples=20))
    assert work["humaneval"]["prompts"] == 164 * (1 + 20 + 20)  # greedy, n at T=0.2, n at T=0.8
    assert work["humaneval_infill"]["prompts"] == (1033 + 5815 + 1640) * 2  # the released files, PSM and SPM
    assert sizes.workload(sizes.resolve(typed_section("eval", {}), on_gpu=True, samples=5))["humaneval"]["prompts"] == (
        164 * 6  # below 10 samples, no T=0.8 set (pass@10 needs n >= 10)
    )


def test_the_price_grows_with_the_draws_and_the_samples_are_the_most_the_share_allows():
    cfg = typed_section("eval", {})
    priced = {n: sizes.price(sizes.resolve(cfg, True, n), LLAMA_1B, MACHINE)["s"] for n in (0, *sizes.SAMPLE_LADDER)}
    assert priced[0] < priced[10] < priced[20] < priced[50] < priced[100] < priced[200]
    share = cfg.humaneval.samples_share
    assert sizes.samples_within(cfg, LLAMA_1B, MACHINE, train_s=priced[200] / share * 1.01) == 200  # / x rounds
    assert sizes.samples_within(cfg, LLAMA_1B, MACHINE, train_s=priced[50] / share * 1.01) == 50
    assert sizes.samples_within(cfg, LLAMA_1B, MACHINE, train_s=priced[10] / share * 0.99) == 0
    explicit = typed_section("eval", {"humaneval": {"samples": 7}})
    assert sizes.samples_within(explicit, LLAMA_1B, MACHINE, train_s=1.0) == 7


def test_the_eval_stage_prices_samples_against_the_train_stage_on_its_own_card():
    cfg = typed_section("eval", {})
    tokens_per_s = 4 * SEED_000.tokens_per_s_per_gpu
    summary = {"steps": 50_000, "tokens_per_step": 196_608, "tokens_per_s": tokens_per_s, "mfu": 0.4}  # seed 000
    assert sizes.train_seconds(summary) == pytest.approx(50_000 * 196_608 / tokens_per_s)
    assert sizes.train_seconds({"spent_s": 420.0, "steps": 9, "tokens_per_s": 1.0}) == 420.0  # a budgeted stage
    on_cpu = sizes.for_run(cfg, LLAMA_1B, None, summary)
    assert (on_cpu.humaneval.problems, on_cpu.humaneval.samples) == (4, 0)
    on_h100 = sizes.for_run(cfg, LLAMA_1B, "NVIDIA H100 80GB HBM3", summary)
    # n=50: the largest of SAMPLE_LADDER within the share at the counted kernels a decode step (kiln.plan.decode)
    assert (on_h100.humaneval.problems, on_h100.humaneval.samples) == (164, 50)
    short = summary | {"steps": 50}  # a short run cannot afford the samples: greedy only
    assert sizes.for_run(cfg, LLAMA_1B, "NVIDIA H100 80GB HBM3", short).humaneval.samples == 0
    assert sizes.for_run(cfg, LLAMA_1B, "Some Future GPU", summary).humaneval.samples == 0  # not priced


def test_kiln_plan_prices_the_eval_without_importing_torch():
    """`kiln plan` runs on a login node in a fraction of a second: pricing the eval counts HumanEval's
    and HumanEval-Infilling's tasks torch-free (kiln.eval.middles, not kiln.eval.infill)."""
    seed = Path(__file__).resolve().parents[3] / "config" / "experiments" / "swallow-code-llama-1b.yaml"
    code = (
        "import sys; from kiln.main import main; "
        f"assert main(['plan', '--configfile', {str(seed)!r}, '--json']) == 0; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["eval"]["humaneval"]["problems"] == 164
