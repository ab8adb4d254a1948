"""Dense bf16 peak FLOP/s and memory of the GPUs Kiln knows, by a fragment of the name CUDA reports
(torch-free: `kiln plan` prices a run and checks that it fits on a login node, before any GPU is seen).

Sources (dense figures: the datasheets' bf16 "with sparsity" numbers halved):
- B200, H100 SXM/PCIe, A100, L40S: torchtitan's get_peak_flops table (vendor datasheets).
- H200 SXM 989 TFLOP/s; H200 NVL 835 (1,671 with sparsity), a lower-clocked 600 W PCIe card: NVIDIA's
  H200 datasheet gives both columns. H100 NVL 835 (H100 datasheet, NVL column), 94 GB.
- L40 181 (L40 datasheet), L4 121 (L4 datasheet), A10 125 (A10 datasheet), A40 149.7 (A40 datasheet);
  RTX A6000 154.8 and RTX 6000 Ada 364.2 (datasheets; workstation cards run bf16 with fp32
  accumulation at full rate).
- GeForce cards run bf16 tensor ops with fp32 accumulation at half their fp16-accumulate rate: SMs x
  4 tensor cores x 128 FLOP/clock (Ampere GA10x and Ada alike) x boost clock, which reproduces the
  whitepapers' "FP16 Tensor TFLOPS with FP32 Accumulate" rows (RTX 3090: 82 x 512 x 1.695 GHz = 71,
  GA102 whitepaper; RTX 4090: 165.2, Ada whitepaper); RTX 5090: 209.5, the RTX Blackwell whitepaper's
  row (measured mma peak 370 with f16 accumulate, main-horse.github.io/posts/5090-mm-perf).
Bandwidth is each datasheet's memory bandwidth (HBM or GDDR), TB/s (10^12 bytes/s): what prices
decoding, which reads every weight once a step (kiln.eval.sizes).
Memory is each card's nominal size in GiB (an "80 GB" H100 has 80 GiB of HBM3, of which CUDA shows
79.2 GiB; an RTX 5090, 31.4 of 32): what kiln.plan.memory's estimate is held against.
"""

from __future__ import annotations

from typing import NamedTuple

from kiln.errors import KilnError


class GPU(NamedTuple):
    fragment: str  # a piece of the name torch.cuda.get_device_name reports
    tflops: float  # dense bf16, per device
    memory_gib: float
    bandwidth_tbs: float  # memory bandwidth, TB/s: what a decode step's weight read is bound by


# First match wins, so a longer name comes before its prefix ("H100 NVL" before "H100", "A100" before "A10").
GPUS = (
    GPU("B200", 2250.0, 180, 8.0),
    GPU("H200 NVL", 835.0, 141, 4.8),
    GPU("H200", 989.0, 141, 4.8),  # SXM
    GPU("H100 NVL", 835.0, 94, 3.9),
    GPU("H100 PCIe", 756.0, 80, 2.0),
    GPU("H100", 989.0, 80, 3.35),  # SXM
    GPU("A100-SXM4-40GB", 312.0, 40, 1.555),
    GPU("A100-PCIE-40GB", 312.0, 40, 1.555),
    GPU("A100", 312.0, 80, 2.039),
    GPU("L40S", 362.0, 48, 0.864),
    GPU("L40", 181.0, 48, 0.864),
    GPU("L4", 121.0, 24, 0.3),
    GPU("A10", 125.0, 24, 0.6),
    GPU("A40", 149.7, 48, 0.696),
    GPU("RTX 6000 Ada", 364.2, 48, 0.96),
    GPU("RTX A6000", 154.8, 48, 0.768),
    GPU("RTX 5090", 209.5, 32, 1.792),
    GPU("RTX 4090", 165.2, 24, 1.008),
    GPU("RTX 4080", 97.5, 16, 0.717),  # 76 SMs x 512 x 2.505 GHz
    GPU("RTX 3090 Ti", 80.0, 24, 1.008),  # 84 SMs x 512 x 1.86 GHz
    GPU("RTX 3090", 71.0, 24, 0.936),
    GPU("RTX 3080 Ti", 68.2, 12, 0.912),  # 80 SMs x 512 x 1.665 GHz (seed 003's card)
    GPU("RTX 3080", 59.5, 10, 0.76),  # 68 SMs x 512 x 1.71 GHz
)


def gpu_of(device_name: str) -> GPU | None:
    """The table's entry for a GPU by its (CUDA) name, or None when it is not in GPUS."""
    for gpu in GPUS:
        if gpu.fragment in device_name:
            return gpu
    return None


def planned_gpu(name: str) -> GPU:
    """plan.gpu's card: the run priced and rehearsed before any GPU is taken."""
    gpu = gpu_of(name)
    if gpu is None:
        raise KilnError(f"plan.gpu: {name!r} is not a known GPU (known: {', '.join(g.fragment for g in GPUS)})")
    return gpu


def peak_flops_of(device_name: str) -> float | None:
    """Dense bf16 FLOP/s of a GPU by its (CUDA) name, or None when it is not in GPUS."""
    gpu = gpu_of(device_name)
    return gpu.tflops * 1e12 if gpu else None
