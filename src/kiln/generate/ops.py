"""What decoding asks of the device, counted from the aten ops it dispatches (a TorchDispatchMode, so
on any device, the CPU included): the kernels an eager step launches and the host syncs it makes.

- A kernel: an op that is not a view (a view only relabels a tensor's storage; eager CUDA launches at
  least one kernel for every other op). An op is counted as the device it runs on dispatches it: the
  CPU's RMSNorm is six (pow, mean, add, rsqrt, two muls) where CUDA's build has a fused one; SDPA is
  one op on either.
- A host sync: an op after which the host waits for the device: a scalar read (.item(), bool():
  aten._local_scalar_dense), an output whose size depends on the data (nonzero, unique), a copy to the host.

kiln.plan.decode prices a decode step's launches with the kernels counted here (KERNELS_PER_LAYER and
KERNELS_OUTSIDE_LAYERS: count_step_kernels of COUNTED_MODELS under bf16 autocast, held to the count
by tests/unit/generate/test_ops.py; bench/decode_ops.py prints them).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.config.models import ModelConfig
from kiln.generate.decode import generate
from kiln.model.build import build_model

# A model of each family at a size too small to matter to the count, with seed 000's options where the
# family has them (grouped-query attention, a tied head): what KERNELS_PER_LAYER was counted on.
TINY = {"vocab_size": 128, "seq_len": 80, "n_layer": 1, "n_head": 4, "d_model": 32}
COUNTED_MODELS = {
    "gpt2": ModelConfig(family="gpt2", bias=True, **TINY),
    "llama": ModelConfig(family="llama", n_kv_head=2, tie_embeddings=True, **TINY),
    "starcoder2": ModelConfig(family="starcoder2", n_kv_head=2, **TINY),
}
PADDED_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]  # of two lengths: left-padded, as the eval's batches are

aten = torch.ops.aten
# Not views by their schema, yet they launch nothing: a reshape's alias, a literal lifted into a tensor.
NO_KERNEL = {aten._unsafe_view.default, aten.lift_fresh.default, aten.detach.default, aten.alias.default}
DATA_DEPENDENT = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
}
COPIES = {aten._to_copy.default, aten.copy_.default}


def _to_host(func, args, out) -> bool:
    """A copy whose result is on the host from a tensor that is not."""
    if func not in COPIES or not isinstance(out, torch.Tensor) or out.device.type != "cpu":
        return False
    return any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args)


class OpCount(TorchDispatchMode):
    """Every aten op dispatched while active, by op, with the kernels and host syncs among them."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.kernels = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops[func] += 1
        if func in DATA_DEPENDENT or _to_host(func, args, out):
            self.syncs += 1
        elif not func.is_view and func not in NO_KERNEL:
            self.kernels += 1
        return out


@dataclass(frozen=True)
class StepCounts:
    """Kernels a decode step launches: in each layer, and outside them (embedding, positions, the
    cache's mask, the head, the choice of the next id)."""

    per_layer: float
    outside_layers: float


def count_generate(
    model: torch.nn.Module, prompts: list[list[int]], tokens: int, autocast_bf16: bool = False, **kwargs
) -> OpCount:
    """The ops of generate(model, prompts, tokens, **kwargs) on the model's device, in an autocast
    region of its own when autocast_bf16 (so each call casts the weights once, in its prefill)."""
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_bf16), OpCount() as count:
        generate(model, prompts, tokens, **kwargs)
    return count


def count_step_kernels(cfg: ModelConfig, steps: int = 8, autocast_bf16: bool = False, **sampling) -> StepCounts:
    """The kernels of one decode step of a batch of left-padded prompts with a stop id (as every eval
    batch is; this one never comes), for cfg's family and options (its sizes do not change the count):
    told apart from the prefill's by decoding `steps` and 2 x `steps` tokens, and the layers' from the
    rest by a model of one layer and one of two. autocast_bf16: under bf16 autocast (a GPU eval's),
    which adds casts; sampling: generate()'s temperature, top_k, top_p and generator (none: greedy)."""
    per_step = {}
    for n_layer in (1, 2):
        small = dataclasses.replace(cfg, n_layer=n_layer, seq_len=len(PADDED_PROMPTS[1]) + 2 * steps)
        torch.manual_seed(0)
        model = build_model(small).eval()
        never = {"stop_ids": frozenset({cfg.vocab_size - 1}), "vocab_size": cfg.vocab_size - 1, **sampling}
        short, long = (
            count_generate(model, PADDED_PROMPTS, n, autocast_bf16, **never).kernels for n in (steps, 2 * steps)
        )
        per_step[n_layer] = (long - short) / steps
    return StepCounts(per_layer=per_step[2] - per_step[1], outside_layers=2 * per_step[1] - per_step[2])
