"""Per-device settings: where train.device puts a run, what compile "auto" means, autocast on and off
(and eval's: bf16 on a GPU only), copies on CPU, the CPU allocator."""

import contextlib
import platform

import pytest
import torch

from kiln.errors import KilnError
from kiln.train import device
from kiln.train.distributed import init_distributed

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


@pytest.fixture
def cuda_visible(monkeypatch):
    """A machine where CUDA sees a GPU, as far as the device choice can tell (nothing touches it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_train_device_cpu_is_the_cpu_even_beside_a_gpu(cuda_visible, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert device.select_device("cpu") == CPU
    assert init_distributed("cpu").device == CPU  # the trainer's device, so smoke and train honour it
    assert device.select_device("auto", local_rank=3) == torch.device("cuda", 3)
    assert device.select_device("cuda", local_rank=1) == torch.device("cuda", 1)


def test_train_device_cuda_without_cuda_is_an_error_naming_the_key(no_cuda, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert device.select_device("auto") == CPU
    with pytest.raises(KilnError, match="train.device is cuda"):
        device.select_device("cuda")
    with pytest.raises(KilnError, match="train.device is cuda"):
        init_distributed("cuda")


def test_several_ranks_of_a_cuda_torch_that_sees_no_gpu_stop_instead_of_training_on_the_cpu(no_cuda, monkeypatch):
    # A GPU node whose driver is too old for the wheel: torch is built for CUDA, CUDA sees nothing.
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(
        KilnError, match=r"train.device is auto and the run has 4 ranks, .*CUDA 12.8.*train.device: cpu"
    ):
        device.select_device("auto", ranks=4)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun starts a rank: the trainer's path says the same
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(KilnError, match="the run has 2 ranks"):
        init_distributed("auto")
    assert device.select_device("auto", ranks=1) == CPU  # one rank: a laptop's default run still runs
    assert device.select_device("cpu", ranks=4) == CPU  # asked for
    monkeypatch.setattr(torch.version, "cuda", None)
    assert device.select_device("auto", ranks=4) == CPU  # a CPU build: the CPU was chosen at install


def test_eval_autocasts_to_bf16_on_a_gpu_only(monkeypatch):
    layer = torch.nn.Linear(4, 4)
    with device.eval_autocast(CPU, "bf16")():  # eval on the CPU stays fp32, whatever train used
        assert layer(torch.randn(2, 4)).dtype == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    gpu = torch.device("cuda", 0)
    assert device.eval_autocast(gpu, "bf16") is not contextlib.nullcontext  # torch.autocast("cuda", bf16)
    assert device.eval_autocast(gpu, "fp32") is contextlib.nullcontext
