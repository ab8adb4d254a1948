"""The published throughputs Kiln's figures are held against, each written once, with where it was read
(torch-free: `kiln plan`'s MFU defaults, the GPU check's pass marks and the tests all read them here).

Seed 000 (shared/seeds/000_e98ab3ade9e00ddd.txt, Llama-3.2-1B shapes at seq 8192 under torchtitan's
transformers backend, per-block compile, bf16) gives two figures, from two runs:
- its full run on 4 x H100 (DDP): "per-rank throughput ~55.8k tps (global ~223k), MFU ~42%", and
  "50k steps / 9.83B tokens in ~12.26 hours" (55.7k per rank). This is the run the seed config
  prices and the one a Kiln run on the same node is compared with: SEED_000.
- its smoke test on 2 x H100, one log line at step 100: "tps: 55,314 tflops: 412.06 mfu: 41.66%".
  That line is what checks a FLOP count against torchtitan's (kiln.train.metrics): SEED_000_LOG.
Both are one throughput to a percent; 55.8k is the anchor, the log line a check of the arithmetic.

MFU of an anchor (mfu) is its tokens/s times a model's FLOPs per token, over the card's dense bf16
peak (kiln.plan.peaks), under Kiln's count or torchtitan's transformers-backend count
(kiln.config.models.ModelConfig.flops_per_token and flops_per_token_torchtitan).
"""

from __future__ import annotations

from typing import NamedTuple

from kiln.config.models import ModelConfig
from kiln.plan.peaks import gpu_of


class Anchor(NamedTuple):
    what: str
    tokens_per_s_per_gpu: float
    gpu: str  # a kiln.plan.peaks fragment
    gpus: int
    source: str  # where the figure is written


SEED_000 = Anchor(
    "Llama-3.2-1B at seq 8192, micro-batch 6, torchtitan (transformers backend, compiled per block, DDP), bf16",
    55_800,
    "H100",
    4,
    "shared/seeds/000_e98ab3ade9e00ddd.txt, the full run: 'per-rank throughput ~55.8k tps (global ~223k), MFU ~42%'",
)
SEED_000_LOG = Anchor(
    "the same model and batch, seed 000's smoke test",
    55_314,
    "H100",
    2,
    "shared/seeds/000_e98ab3ade9e00ddd.txt, step 100 of the smoke test: 'tps: 55,314 tflops: 412.06 mfu: 41.66%'",
)
SEED_002 = Anchor(
    "GPT-2 124M at seq 1024 (nanoGPT-style)",
    10e9 / (12 * 3600),
    "H100",
    1,
    "shared/seeds/002_946d704c7f9e6fe8.txt, its cost table: '1xH100, 124M, 10B, ~12 hrs'",
)
LLM_C_GPT2 = Anchor(
    "GPT-2 124M at seq 1024, micro-batch 64, llm.c",
    470_000,
    "H100",
    1,
    "llm.c's GPT-2 (124M) reproduction: ~3.7M tokens/s on 8 H100s, 140 ms per 0.5M-token step",
)


def mfu(anchor: Anchor, model: ModelConfig, count: str = "kiln") -> float:
    """The anchor's MFU for `model` under Kiln's FLOP count ("kiln") or torchtitan's
    transformers-backend count ("torchtitan")."""
    flops = {"kiln": model.flops_per_token, "torchtitan": model.flops_per_token_torchtitan}[count]()
    return anchor.tokens_per_s_per_gpu * flops / (gpu_of(anchor.gpu).tflops * 1e12)
