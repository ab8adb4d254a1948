"""Dense bf16 peak FLOP/s of the GPUs Kiln knows, by a fragment of the name CUDA reports (torch-free:
`kiln plan` prices a run on a login node, before any GPU is seen).

Datacenter cards: torchtitan's get_peak_flops table (vendor datasheets, dense, no sparsity).
GeForce cards run bf16 tensor ops with fp32 accumulation at half their fp16-accumulate rate; their
figure is SMs x 4 tensor cores x 256 FLOP/clock (Ampere GA10x) or 512 (Ada) x boost clock, which
reproduces the vendor's "FP32 accumulate" row (RTX 3090: 71 TFLOP/s, GA102 whitepaper; RTX 4090:
165.2, Ada whitepaper).
"""

from __future__ import annotations

# First match wins, so a longer name comes before its prefix ("H100 NVL" before "H100").
PEAK_TFLOPS = (
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
    ("L40S", 362.0),
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
    ("RTX 3080 Ti", 68.2),  # 80 SMs x 4 x 256 x 1.665 GHz (seed 003's card)
)


def peak_flops_of(device_name: str) -> float | None:
    """Dense bf16 FLOP/s of a GPU by its (CUDA) name, or None when it is not in PEAK_TFLOPS."""
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in device_name:
            return tflops * 1e12
    return None
