"""What a decode step costs on a GPU: the one model `kiln plan` and the eval stage price the code evals
with (kiln.eval.sizes), and the GPU check holds Kiln's measured decoding against (bench/gpu_check's
generate-bench row, through bench/generate.py). Torch-free, and free of the eval's packages, so a GPU
node with only the train side's wheels can read it.

The assumptions, until a GPU has timed Kiln's decoding: a step reads the bf16 weights once (blocks and
the head), at DECODE_BANDWIDTH of the card's HBM bandwidth, and launches at least LAUNCH_S_PER_LAYER of
kernels a layer (eager PyTorch: a small model is launch-bound); whichever is more. A measured rate
below decode_tokens_per_s means the eval's price is too low.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.models import ModelConfig
from kiln.plan.peaks import GPU

DECODE_BANDWIDTH = 0.5  # of the HBM bandwidth a decode step's weight read reaches
LAUNCH_S_PER_LAYER = 100e-6  # ~15 eager kernels a layer at ~7 us each: the floor of a decode step


@dataclass(frozen=True)
class Machine:
    """What the price assumes of the GPU: its dense bf16 peak, its HBM bandwidth and the MFU the
    plan assumes for the prompts' forward passes."""

    peak_flops: float
    bandwidth_bytes_s: float
    mfu: float

    @classmethod
    def of(cls, gpu: GPU, mfu: float) -> Machine:
        """A card of kiln.plan.peaks at an assumed (or measured) MFU."""
        return cls(gpu.tflops * 1e12, gpu.bandwidth_tbs * 1e12, mfu)


def decode_step_s(model: ModelConfig, machine: Machine) -> float:
    """Seconds of one decode step of a batch (the batch's size does not enter: the weights are read once)."""
    weights = 2 * model.num_params(non_embedding=True)  # bf16 bytes a step reads: blocks and the head
    return max(weights / (DECODE_BANDWIDTH * machine.bandwidth_bytes_s), model.n_layer * LAUNCH_S_PER_LAYER)


def decode_tokens_per_s(model: ModelConfig, machine: Machine, batch: int) -> float:
    """New tokens a second of `batch` prompts decoded together: the rate the eval's price assumes."""
    return batch / decode_step_s(model, machine)
