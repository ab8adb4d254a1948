"""The published throughputs (kiln.plan.anchors) against what their sources say and what the seed
configs and the GPU check derive from them."""

from pathlib import Path

import pytest
import yaml

from kiln.config.models import model_config
from kiln.plan import anchors
from kiln.plan.anchors import LLM_C_GPT2, SEED_000, SEED_000_LOG, SEED_002

ROOT = Path(__file__).resolve().parents[3]
LLAMA_1B = model_config({"flavour": "llama3.2-1b"}, 32768, 8192)  # seed 000's vocabulary, 32k
GPT2 = model_config({"flavour": "gpt2-124m"}, 50304, 1024)  # GPT-2's 50,257 padded


def _plan_mfu(config: str) -> float:
    return yaml.safe_load((ROOT / "config" / "experiments" / config).read_text())["plan"]["mfu"]


def test_the_seeds_log_line_reads_its_printed_mfu_under_torchtitans_count():
    """'tps: 55,314 tflops: 412.06 mfu: 41.66%': the count and the H100's 989 TFLOP/s reproduce it."""
    assert anchors.mfu(SEED_000_LOG, LLAMA_1B, "torchtitan") == pytest.approx(0.4166, abs=0.0005)
    assert SEED_000_LOG.tokens_per_s_per_gpu * LLAMA_1B.flops_per_token_torchtitan() / 1e12 == pytest.approx(
        412.06, rel=0.001
    )


def test_seed_000s_full_run_is_its_anchor_and_its_configs_mfu():
    """55.8k tokens/s per H100 on 4: 'MFU ~42%' under torchtitan's count; 50k steps of 4 x 6 x 8192
    tokens in ~12.26 h; and the seed config's plan.mfu, which kiln plan prices it at."""
    assert anchors.mfu(SEED_000, LLAMA_1B, "torchtitan") == pytest.approx(0.42, abs=0.005)
    hours = 50_000 * 4 * 6 * 8192 / (SEED_000.gpus * SEED_000.tokens_per_s_per_gpu) / 3600
    assert hours == pytest.approx(12.26, rel=0.01)
    assert _plan_mfu("swallow-code-llama-1b.yaml") == pytest.approx(anchors.mfu(SEED_000, LLAMA_1B), abs=0.0005)


def test_seed_002s_config_prices_its_cost_tables_hours():
    assert _plan_mfu("fineweb-edu-gpt2-124m.yaml") == pytest.approx(anchors.mfu(SEED_002, GPT2), abs=0.005)


def test_llm_cs_gpt2_step_is_its_tokens_per_second():
    """140 ms per 0.5M-token (2**19) step on 8 H100s: ~3.7M tokens/s, ~470k a GPU."""
    assert 2**19 / 0.140 / 8 == pytest.approx(LLM_C_GPT2.tokens_per_s_per_gpu, rel=0.005)
