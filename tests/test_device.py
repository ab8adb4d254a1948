"""Per-device settings: what compile "auto" means, autocast on and off, copies on CPU, the CPU allocator."""

import platform

import torch

from kiln.train import device

CPU = torch.device("cpu")


def test_compile_auto_means_cuda_only():
    assert device.use_compile("auto", torch.device("cuda", 0)) is True
    assert device.use_compile("auto", CPU) is False
    assert device.use_compile(True, CPU) is True and device.use_compile(False, torch.device("cuda", 0)) is False


def test_bf16_autocast_runs_matmuls_in_bf16_over_fp32_weights():
    layer = torch.nn.Linear(4, 4)
    assert device.use_bf16("bf16", CPU) and not device.use_bf16("fp32", CPU)
    with device.autocast(CPU, bf16=True)():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with device.autocast(CPU, bf16=False)():
        assert layer(torch.randn(2, 4)).dtype == torch.float32


def test_cpu_batches_stay_where_they_are():
    batch = torch.arange(6).view(2, 3)
    assert device.to_device(batch, CPU) is batch


def test_cpu_allocator_is_tuned_where_the_c_library_is_glibc():
    # mallopt answers 1 for each setting it took; elsewhere nothing is attempted or changed.
    assert device.tune_cpu_allocator() == (platform.libc_ver()[0] == "glibc")
