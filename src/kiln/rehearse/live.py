"""Live device bytes of a step run on fake tensors: what the caching allocator would hold, its peak,
and the largest tensor with the module that made it.

A TorchDispatchMode above torch's FakeTensorMode sees every op's outputs: a tensor with storage not
seen before is an allocation of its storage's bytes, rounded up to the 512-byte blocks of CUDA's
caching allocator, freed when the storage's last reference goes (a weakref finalizer), as the
allocator frees a block back to its pool. Views share their base's storage and cost nothing. A
DTensor (FSDP2's parameters, gradients and optimizer state) costs its local shard, not its global
size; a storage resized in place (FSDP2 frees a block's gathered parameters so and gathers them into
it again) costs its new size from then on.
Fragmentation, the CUDA context and NCCL's buffers are not counted: kiln.plan.memory.FIT_FRACTION
leaves them their share of the card.

flex attention is a higher-order op: its fake kernel returns the output and log-sum-exp, which is what
the GPU's compiled kernel allocates. Called under a force_eager stance it would take flex's eager path
on the GPU, which materialises the scores, at least two (B, H, Tq, Tkv) fp32 tensors at once (the
scores and the masked scores, torch._higher_order_ops.flex_attention.math_attention): those are
charged for the call's length and named as its largest tensor. The rehearsal runs with dynamo off,
so the stance a caller set is the one flex sees (kiln.model.documents.compiled_flex sets its own).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Iterator

import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from kiln.plan.rehearsal import Tensor

BLOCK = 512  # bytes: the CUDA caching allocator's rounding of every block


def allocated(nbytes: int) -> int:
    return BLOCK * math.ceil(nbytes / BLOCK)


class LiveBytes(TorchDispatchMode):
    """Enter inside a FakeTensorMode (and with a ModTracker entered, which names the module). `live`
    and `peak` are bytes; `reset_peak` starts a phase at what is live."""

    supports_higher_order_operators = True

    def __init__(self, modules: ModTracker):
        super().__init__()
        self.modules = modules
        self.live = self.peak = 0
        self.largest: Tensor | None = None
        self._counted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage -> [bytes counted]
        self._resize = None  # torch's UntypedStorage.resize_, while this mode is entered

    def __enter__(self):
        # FSDP2 frees a block's gathered parameters by resizing their storage to 0 bytes and gathers
        # into the same storage resized back (torch.distributed.fsdp._fully_shard._fsdp_param's
        # free_storage / alloc_storage): a storage method, not an op this mode sees
        self._resize = resize = torch.UntypedStorage.resize_

        def counted_resize(storage, nbytes):
            out = resize(storage, nbytes)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = counted_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def reset_peak(self) -> None:
        self.peak, self.largest = self.live, None

    def _where(self) -> str:
        parents = [p for p in self.modules.parents if p != "Global"]
        where = max(parents, key=len) if parents else "outside any module"
        return where + (" (backward)" if self.modules.is_bw else "")

    def _add(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # a DTensor (FSDP2's parameters, gradients, optimizer state):
            # its own storage has its global size; this rank holds its local shard, an inner tensor
            names, _ = t.__tensor_flatten__()  # DTensor's: its local tensor, and its device mesh
            for inner in (getattr(t, name) for name in names):
                if isinstance(inner, torch.Tensor):
                    self._add(inner)
            return
        storage = t.untyped_storage()
        if storage in self._counted:
            return
        nbytes = allocated(storage.nbytes())
        self._counted[storage] = counted = [nbytes]
        self.live += nbytes
        weakref.finalize(storage, self._free, counted)
        self._note(Tensor(tuple(t.shape), str(t.dtype).removeprefix("torch."), nbytes, self._where()))

    def _resized(self, storage) -> None:
        counted = self._counted.get(storage)
        if counted is None:  # made before this mode: not counted, nor its resizes
            return
        nbytes = allocated(storage.nbytes())
        self.live += nbytes - counted[0]
        counted[0] = nbytes
        self.peak = max(self.peak, self.live)

    def _note(self, made: Tensor, transient: int = 0) -> None:
        self.peak = max(self.peak, self.live + transient)
        if self.largest is None or made.nbytes > self.largest.nbytes:
            self.largest = made

    def _free(self, counted: list[int]) -> None:
        self.live -= counted[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is flex_attention_hop and torch._dynamo.eval_frame._stance.stance == "force_eager":
            q, k = args[0], args[1]
            B, H, Tq, _ = q.shape
            scores = B * H * Tq * k.size(-2) * 4  # fp32
            self._note(
                Tensor((B, H, Tq, k.size(-2)), "float32", scores, "flex_attention's eager path (scores)"), 2 * scores
            )
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


@contextlib.contextmanager
def counting() -> Iterator[LiveBytes]:
    """LiveBytes counting what is made from here on, on fake tensors, with dynamo off (compiled code
    does not run in a rehearsal: kiln.rehearse.run's docstring) and reset after: what dynamo noted of
    frames it met while off (code it marked as not to trace) is forgotten, so a later compile in this
    process (a test's, a stage's) starts as it would have without this."""
    try:
        with (
            torch._dynamo.config.patch(disable=True),
            FakeTensorMode(allow_non_fake_inputs=True),
            ModTracker() as modules,
            LiveBytes(modules) as live,
        ):
            yield live
    finally:
        torch._dynamo.reset()
