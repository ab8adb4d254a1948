"""What a decode step costs on a GPU: the one model `kiln plan` and the eval stage price the code evals
with (kiln.eval.sizes), and the GPU check holds Kiln's measured decoding against (bench/gpu_check's
generate-bench row, through bench/generate.py). Torch-free, and free of the eval's packages, so a GPU
node with only the train side's wheels can read it.

The assumptions, until a GPU has timed Kiln's decoding: a step reads the bf16 weights once (blocks and
the head), at DECODE_BANDWIDTH of the card's HBM bandwidth, or launches its kernels one after another at
LAUNCH_S each (eager PyTorch: a small model is launch-bound); whichever is more. A measured rate below
decode_tokens_per_s means the eval's price is too low.

The kernels are counted, not guessed: KERNELS_PER_LAYER and KERNELS_OUTSIDE_LAYERS are what
kiln.generate.ops counts of a greedy step of a padded batch under bf16 autocast, as the eval stage runs
on a GPU (docs/benchmarks.md, "Decode step: kernels and host syncs"; tests/unit/generate/test_ops.py
holds them to the count). The count is the CPU's dispatch: CUDA fuses RMSNorm's six ops into one, so
a Llama layer may launch ~10 fewer there; the price errs high by that. A sampled step's sampler adds
11 kernels outside the layers, left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.models import ModelConfig
from kiln.plan.peaks import GPU

DECODE_BANDWIDTH = 0.5  # of the HBM bandwidth a decode step's weight read reaches
LAUNCH_S = 7e-6  # an eager kernel's launch from Python: the floor of a decode step is its kernels' launches
# Kernels of one decode step, by model.family: in each layer, and outside them (embedding, positions,
# the cache's mask, final norm, head, the next id); kiln.generate.ops.count_step_kernels counted them.
KERNELS_PER_LAYER = {"gpt2": 17, "llama": 48, "starcoder2": 35}
KERNELS_OUTSIDE_LAYERS = {"gpt2": 20, "llama": 25, "starcoder2": 20}


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
    return max(weights / (DECODE_BANDWIDTH * machine.bandwidth_bytes_s), decode_step_kernels(model) * LAUNCH_S)


def decode_step_kernels(model: ModelConfig) -> int:
    """Kernels an eager decode step of `model` launches (KERNELS_PER_LAYER, KERNELS_OUTSIDE_LAYERS)."""
    return model.n_layer * KERNELS_PER_LAYER[model.family] + KERNELS_OUTSIDE_LAYERS[model.family]


def decode_tokens_per_s(model: ModelConfig, machine: Machine, batch: int) -> float:
    """New tokens a second of `batch` prompts decoded together: the rate the eval's price assumes."""
    return batch / decode_step_s(model, machine)
