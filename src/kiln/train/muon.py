"""Muon for the hidden matrices (train.optimizer: muon): torch.optim.Muon's update, plus the two things a
Kiln step needs that torch's step lacks. kiln.train.optim decides which parameters it gets.

1. A flagged step is never applied, decided on the device. The trainer hands every optimizer the
   step's non-finite flag, agreed by every rank, as `found_inf`; fused AdamW then skips its whole
   update (the GradScaler mechanism). torch's Muon has no such input, and reading the flag on the host
   would wait for each step's backward (the trainer keeps the host a step ahead of the device). So
   the new momentum and the new weights are computed out of place and written back through
   torch.where(flag, old, new): on a flagged step both keep their bits. Cost: one matrix's new
   momentum and new weights as temporaries at a time, and two selects per matrix.
2. FSDP2. Newton-Schulz orthogonalises a whole matrix, while under FSDP2 each rank holds a block of
   rows (a DTensor, Shard(0); HSDP: replicated across nodes) of every weight, gradient and momentum.
   torch's Muon would hand the sharded DTensor to the iteration and let DTensor redistribute at each
   matmul. Here the momentum stays sharded (it is elementwise); the Nesterov update is all-gathered
   once, in bf16, which is what Newton-Schulz casts it to first (so the same bits as gathering it in
   fp32, at half the traffic); every rank orthogonalises the whole matrix and keeps its own rows. Cost
   per step: one bf16 all-gather of every hidden matrix, 2 bytes an element, beside FSDP's own 8 to 12
   (the weights gathered for forward and again for backward, the gradients reduce-scattered), and
   every rank repeating every matrix's Newton-Schulz
   (5 iterations of 3 matmuls on the matrix and its Gram matrix; modded-nanogpt and torchtitan's
   DistMuon instead share the matrices out across ranks and gather the results, which pays off once
   the iteration is a noticeable part of the step, on models far larger than Kiln's defaults).

The arithmetic is torch's own (its Newton-Schulz and learning-rate adjustment, the same lerp forms), so
an unflagged step equals torch.optim.Muon's bit for bit, and so does FSDP's on the same gradients
(tests/test_optimizers.py). State and hyperparameters are torch.optim.Muon's ("momentum_buffer" per
parameter), so checkpoints hold what torch's Muon would.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz
from torch.optim.optimizer import _to_scalar


class Muon(torch.optim.Muon):
    """torch.optim.Muon that honours `found_inf` (a device tensor, nonzero: apply nothing) and
    orthogonalises FSDP2-sharded matrices whole."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        skip = None if found_inf is None else found_inf != 0
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            bufs: list[Tensor] = []
            self._init_group(group, params, grads, bufs)
            for param, grad, buf in zip(params, grads, bufs):
                _update(param, grad, buf, group, skip)
        return loss


def _local(t: Tensor) -> Tensor:
    """This rank's part of t (the tensor itself when not sharded); writes to it reach t."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _update(param: Tensor, grad: Tensor, buf: Tensor, group: dict, skip: Tensor | None) -> None:
    lr, momentum, weight_decay = _to_scalar(group["lr"]), group["momentum"], group["weight_decay"]
    p, g, b = _local(param), _local(grad), _local(buf)
    new_buf = b.lerp(g, 1 - momentum)
    update = g.lerp(new_buf, momentum) if group["nesterov"] else new_buf
    if isinstance(param, DTensor):
        update = _whole(update.bfloat16(), param)
    ortho = _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
    if isinstance(param, DTensor):
        ortho = _own_rows(ortho, param)
    new_p = p.mul(1 - lr * weight_decay).add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
    if skip is None:
        b.copy_(new_buf)
        p.copy_(new_p)
    else:  # on the device: no host sync
        b.copy_(torch.where(skip, b, new_buf))
        p.copy_(torch.where(skip, p, new_p))


def _whole(local: Tensor, like: DTensor) -> Tensor:
    """The whole matrix of which `local` is this rank's part, laid out as `like` (an all-gather)."""
    return DTensor.from_local(
        local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride()
    ).full_tensor()


def _own_rows(whole: Tensor, like: DTensor) -> Tensor:
    """This rank's part of `whole` as `like` lays it out (a local slice: no communication)."""
    mesh = like.device_mesh
    part = DTensor.from_local(whole, mesh, [Replicate()] * mesh.ndim).redistribute(mesh, like.placements).to_local()
    if part.shape != like._local_tensor.shape:  # FSDP2's row blocks are torch.chunk's, as DTensor's Shard(0)
        raise RuntimeError(f"Muon: shard of shape {tuple(part.shape)} for a local {tuple(like._local_tensor.shape)}")
    return part
