"""Muon for the hidden matrices (train.optimizer: muon): torch.optim.Muon's update, plus the three things
a Kiln step needs that torch's step lacks. kiln.train.optim decides which parameters it gets.

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
   matmul. Here the momentum stays sharded (it is elementwise), and only the Nesterov update travels,
   in bf16, which is what Newton-Schulz casts it to first (so the same bits as sending it in fp32, at
   half the traffic).
3. Each matrix's Newton-Schulz runs on one rank. It is 5 iterations of 3 matmuls on the matrix and
   its Gram matrix, about 8% of a 1B model's step when every rank repeats it for every matrix (the
   gradients, hence the updates, are the same on every rank under DDP; under FSDP2 every rank would
   gather every matrix). `owners` shares the matrices out by that cost, the same on every rank, as
   Moonlight (torchtitan's DistMuon) and modded-nanogpt's speedrun do, so a step's Newton-Schulz
   costs each rank about 1/world of it. Under DDP the owner broadcasts its bf16 result. Under FSDP2
   (on each replica's shard group under HSDP) an all_to_all sends each matrix's row blocks to its
   owner, which orthogonalises the whole matrix, and a second sends each rank back its rows; the
   matrices go in rounds (each rank's k-th matrix in round k), so on a GPU the iteration of one round
   overlaps the next round's transfer. Cost per step: under DDP a bf16 broadcast of every hidden
   matrix, and a bf16 copy of them all held until the step applies them; under FSDP2 two bf16
   all_to_alls each moving about 1/world of the hidden matrices per rank (the all-gather this
   replaces moved all of them), beside FSDP's own 8 to 12 bytes an element (the weights gathered for
   forward and again for backward, the gradients reduce-scattered). kiln.plan.memory counts the
   results held in flight.
   With one rank nothing is sent, and same-shaped matrices are orthogonalised in stacks (up to
   STACK_ELEMENTS), one batched iteration for each: a small model's 28 matrices are 3 stacks, and half
   the iteration's time on a CPU. A large matrix is orthogonalised alone.

4. NorMuon (train.normuon, arXiv:2510.05491, as modded-nanogpt runs it), off by default: each
   orthogonalised update is divided row-wise (column-wise for a wide matrix) by the root of an
   exponential average (NORMUON_BETA2) of its mean square, then rescaled to the update's own norm, so
   that every neuron moves alike without the step's size changing. It runs where the whole matrix is
   (one rank; under DDP on every rank alike after the broadcast, so every rank's state is the same);
   FSDP2's row blocks are refused.
5. The iteration's precision is the run's (kiln.train.optim takes it from the trainer's precision
   decision). torch's Muon always iterates in bf16; so does this one, and sends bf16, where the step
   runs under bf16 autocast (a GPU; a CPU with fast bf16). Where the run's precision is fp32 (a CPU
   without AVX-512 BF16 or AMX, where a bf16 matmul is emulated) the updates, the iteration and
   what travels are fp32: on such a 2-core CPU one iteration on a (4, 128, 512) stack took 62.6 ms
   in bf16 and 1.9 ms in fp32, and Muon's bf16 iteration had halved the default's train step.
   Under DDP or FSDP2 in fp32 the transfers and the results held in flight double (kiln.plan.memory).

The arithmetic is torch's own (its Newton-Schulz, batched over a stack with the same operations in the
same order, its learning-rate adjustment, the same lerp forms), so on a CPU an unflagged step in bf16
equals torch.optim.Muon's bit for bit, and so do DDP's and FSDP's on the same gradients
(tests/unit/train/test_optimizers.py). A GPU's batched matmul may take other kernels than its single
one, so a stack's results there can differ from torch's in rounding. State and hyperparameters are torch.optim.Muon's
("momentum_buffer" per parameter), so checkpoints hold what torch's Muon would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz
from torch.optim.optimizer import _to_scalar

from kiln.train.distributed import all_to_all_async, broadcast_async

NORMUON_BETA2 = 0.95  # NorMuon's second-moment decay (modded-nanogpt's)
# Elements in one stack of same-shaped matrices orthogonalised together on one rank. A small matrix's
# iteration is a few host-bound ops (the default's 28 matrices of 128 x 128 and 128 x 512 on a CPU: 25 ms
# a step one at a time, 12 ms in stacks); a large one's is not, and is left alone, so that the stack's
# temporaries (its updates, Gram matrices and results) stay small beside a step's gradients.
STACK_ELEMENTS = 1 << 22


class Muon(torch.optim.Muon):
    """torch.optim.Muon that honours `found_inf` (a device tensor, nonzero: apply nothing) and
    orthogonalises each matrix, whole, on one rank; with normuon, NorMuon's normalisation after it.
    `dtype` is the Newton-Schulz iteration's and the updates' in flight: bf16 as torch's (and the
    step's precision on a GPU), or fp32 where the run's precision is (a CPU without fast bf16, where a
    bf16 iteration is ~30x slower: module docstring, 5)."""

    def __init__(self, params, normuon: bool = False, dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.normuon = normuon
        self.dtype = dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        skip = None if found_inf is None else found_inf != 0
        batches: dict[object, list[_Matrix]] = {}  # by layout, in parameter order: the same on every rank
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            bufs: list[Tensor] = []
            self._init_group(group, params, grads, bufs)
            for param, grad, buf in zip(params, grads, bufs):
                key = (param.device_mesh, tuple(param.placements)) if isinstance(param, DTensor) else None
                state = self.state[param] if self.normuon else None
                batches.setdefault(key, []).append(_Matrix(param, grad, buf, group, state))
        for batch in batches.values():
            _step(batch, _Ranks.of(batch[0].param), skip, self.dtype)
        return loss


def ns_cost(shape: tuple[int, ...]) -> int:
    """Multiply-adds of one Newton-Schulz iteration on a matrix of `shape`: with a <= b its sides, the
    Gram matrix (a*a*b), its square (a**3) and their product with the matrix (a*a*b)."""
    a, b = sorted(shape)
    return a * a * (2 * b + a)


def owners(shapes: list[tuple[int, ...]], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: the costliest first, each to the least loaded rank
    (the lowest on a tie). Deterministic, so every rank computes the same list; the most loaded
    rank exceeds the least by at most the cost of the last matrix it took."""
    load = [0] * world
    owner = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -ns_cost(shapes[i])):  # stable: ties by index
        owner[i] = min(range(world), key=load.__getitem__)
        load[owner[i]] += ns_cost(shapes[i])
    return owner


def rounds(owner: list[int], world: int) -> list[list[int | None]]:
    """Round k: each rank's k-th matrix (in index order), None for a rank with fewer."""
    mine = [[i for i, o in enumerate(owner) if o == r] for r in range(world)]
    return [[m[k] if k < len(m) else None for m in mine] for k in range(max(map(len, mine), default=0))]


@dataclass
class _Matrix:
    param: Tensor
    grad: Tensor
    buf: Tensor
    group: dict
    normuon: dict | None = None  # the parameter's optimizer state under NorMuon, which keeps its second moment there


@dataclass
class _Ranks:
    """Who shares a batch's matrices: the default group for plain tensors (with several ranks they
    are DDP's, the same on every rank) or the shard dimension's group of their DTensor mesh."""

    group: dist.ProcessGroup | None
    rank: int
    world: int
    sharded: bool

    @staticmethod
    def of(param: Tensor) -> _Ranks:
        if not isinstance(param, DTensor):
            if dist.is_available() and dist.is_initialized():
                return _Ranks(None, dist.get_rank(), dist.get_world_size(), sharded=False)
            return _Ranks(None, 0, 1, sharded=False)
        shard = [i for i, p in enumerate(param.placements) if not isinstance(p, Replicate)]
        if len(shard) != 1 or param.placements[shard[0]] != Shard(0):
            raise NotImplementedError(f"Muon: parameter placements {param.placements} (known: Shard(0), replicated)")
        mesh = param.device_mesh
        return _Ranks(mesh.get_group(shard[0]), mesh.get_local_rank(shard[0]), mesh.size(shard[0]), sharded=True)


def _local(t: Tensor) -> Tensor:
    """This rank's part of t (the tensor itself when not sharded); writes to it reach t."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _rows(m: int, world: int, rank: int) -> int:
    """Rows of an m-row matrix that Shard(0) (torch.chunk, as FSDP2) gives `rank`: maybe fewer, or none."""
    size = math.ceil(m / world)
    return max(0, min(size, m - rank * size))


def _step(batch: list[_Matrix], ranks: _Ranks, skip: Tensor | None, dtype: torch.dtype) -> None:
    if ranks.world == 1:  # same-shaped matrices together: their updates and results are the temporaries
        for stack in _stacks(batch):
            updates = torch.stack([_momentum(m, skip, True, dtype) for m in stack])  # (n, rows, cols)
            for m, ortho in zip(stack, _stacked_newton_schulz(updates, stack[0].group)):
                _apply(m, ortho, skip)
        return
    owner = owners([tuple(m.param.shape) for m in batch], ranks.world)
    if ranks.sharded and batch[0].normuon is not None:
        raise NotImplementedError("train.normuon: NorMuon needs whole matrices; FSDP2 shards them (train.parallel ddp)")
    keep = [ranks.sharded or o == ranks.rank for o in owner]
    updates = [_momentum(m, skip, k, dtype) for m, k in zip(batch, keep)]
    if ranks.sharded:
        orthos = _sharded(batch, updates, owner, ranks, dtype)
    else:
        orthos = _replicated(batch, updates, owner, ranks, dtype)
    for m, ortho in zip(batch, orthos):
        _apply(m, ortho, skip)


def _momentum(m: _Matrix, skip: Tensor | None, keep: bool, dtype: torch.dtype) -> Tensor | None:
    """Commits the new momentum (on local data); returns the Nesterov update in `dtype` if `keep`."""
    momentum = m.group["momentum"]
    g, b = _local(m.grad), _local(m.buf)
    new_buf = b.lerp(g, 1 - momentum)
    update = (g.lerp(new_buf, momentum) if m.group["nesterov"] else new_buf).to(dtype) if keep else None
    b.copy_(new_buf if skip is None else torch.where(skip, b, new_buf))  # on the device: no host sync
    return update


def _newton_schulz(update: Tensor, group: dict) -> Tensor:
    """One matrix's iteration in its update's dtype: torch's own function in bf16 (which casts to bf16
    whatever it is given), the stacked one's arithmetic on a stack of one in fp32."""
    if update.dtype == torch.bfloat16:
        return _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
    return _stacked_newton_schulz(update[None], group)[0]


def _stacks(batch: list[_Matrix]) -> list[list[_Matrix]]:
    """The batch's matrices in stacks of one shape and parameter group, up to STACK_ELEMENTS elements a
    stack (a matrix larger than that alone), in the order of their first matrix."""
    stacks: dict[tuple, list[list[_Matrix]]] = {}
    for m in batch:
        runs = stacks.setdefault((tuple(m.param.shape), id(m.group)), [[]])
        if runs[-1] and (len(runs[-1]) + 1) * m.param.numel() > STACK_ELEMENTS:
            runs.append([])
        runs[-1].append(m)
    return [stack for runs in stacks.values() for stack in runs]


def _stacked_newton_schulz(updates: Tensor, group: dict) -> Tensor:
    """torch's _zeropower_via_newtonschulz (which takes one 2-D matrix) on each matrix of a stack (n, rows,
    cols), batched: the same operations in the same order (the norm per matrix, then ns_steps of the Gram
    matrix, its update and the product), so each result has torch's bits on a CPU in bf16
    (tests/unit/train/test_optimizers.py; so too with oneDNN capped at AVX2 or AVX-512, and off). In the
    updates' dtype: bf16, or fp32 where the run's precision is fp32."""
    a, b, c = group["ns_coefficients"]
    ortho = updates
    tall = ortho.size(-2) > ortho.size(-1)
    if tall:
        ortho = ortho.mT
    ortho = ortho / ortho.norm(dim=(-2, -1), keepdim=True).clamp(min=group["eps"])  # spectral norms <= 1
    for _ in range(group["ns_steps"]):
        gram = ortho @ ortho.mT
        gram_update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        ortho = torch.baddbmm(ortho, gram_update, ortho, beta=a)
    return ortho.mT if tall else ortho


def _normalised(ortho: Tensor, state: dict, skip: Tensor | None) -> Tensor:
    """NorMuon: the orthogonalised update over the root of its rows' (a wide matrix's columns') averaged
    mean square, rescaled to the update's Frobenius norm (fp32); the average is committed unless `skip`."""
    o = ortho.float()
    dim = -1 if o.size(-2) >= o.size(-1) else -2
    mean_square = o.square().mean(dim=dim, keepdim=True)  # (rows, 1), or (1, columns) for a wide matrix
    buf = state.setdefault("normuon_second_moment", torch.zeros_like(mean_square))
    new_buf = buf.lerp(mean_square, 1 - NORMUON_BETA2)
    buf.copy_(new_buf if skip is None else torch.where(skip, buf, new_buf))
    scaled = o * new_buf.clamp_min(1e-10).rsqrt()
    return scaled * (o.norm() / scaled.norm().clamp_min(1e-10))


def _apply(m: _Matrix, ortho: Tensor, skip: Tensor | None) -> None:
    if m.normuon is not None:
        ortho = _normalised(ortho, m.normuon, skip)
    lr, weight_decay = _to_scalar(m.group["lr"]), m.group["weight_decay"]
    p = _local(m.param)
    adjusted = _adjust_lr(lr, m.group["adjust_lr_fn"], m.param.shape)
    new_p = p.mul(1 - lr * weight_decay).add_(ortho, alpha=-adjusted)
    p.copy_(new_p if skip is None else torch.where(skip, p, new_p))


def _replicated(
    batch: list[_Matrix], updates: list, owner: list[int], ranks: _Ranks, dtype: torch.dtype
) -> list[Tensor]:
    """Every rank holds every matrix: each orthogonalises its own and broadcasts the result. Issued
    in index order on every rank; the owner's iteration runs while others' broadcasts are in flight."""
    orthos, works = [], []
    for m, update, o in zip(batch, updates, owner):
        if o == ranks.rank:
            ortho = _newton_schulz(update, m.group).contiguous()  # tall matrices come back transposed
        else:
            ortho = torch.empty(m.param.shape, dtype=dtype, device=m.param.device)
        works.append(broadcast_async(ortho, src=o, group=ranks.group))
        orthos.append(ortho)
    for work in works:
        work.wait()  # on CUDA: the current stream waits, not the host
    return orthos


def _sharded(batch: list[_Matrix], updates: list, owner: list[int], ranks: _Ranks, dtype: torch.dtype) -> list[Tensor]:
    """Each rank holds a block of rows of every matrix: all_to_all sends the blocks of each round's
    matrices to their owners, each owner orthogonalises its matrix, and a second all_to_all sends
    each rank back its rows. Split sizes are computed alike on every rank from the shapes alone."""
    world, me, device = ranks.world, ranks.rank, batch[0].param.device
    shapes = [tuple(m.param.shape) for m in batch]
    for m, u in zip(batch, updates):
        if u.shape[0] != _rows(m.param.shape[0], world, me):  # FSDP2's row blocks are torch.chunk's
            raise RuntimeError(f"Muon: local rows {u.shape[0]} of a {tuple(m.param.shape)} on rank {me} of {world}")

    def numel(i: int | None, rank: int) -> int:  # matrix i's elements held by `rank`
        return 0 if i is None else _rows(shapes[i][0], world, rank) * shapes[i][1]

    def empty(n: int) -> Tensor:
        return torch.empty(n, dtype=dtype, device=device)

    gathers = []
    for held in rounds(owner, world):  # all issued now: in flight while earlier rounds iterate
        send = torch.cat([updates[i].reshape(-1) for i in held if i is not None] or [empty(0)])
        whole = empty(0 if held[me] is None else math.prod(shapes[held[me]]))
        out_splits = [numel(held[me], r) for r in range(world)]
        in_splits = [numel(i, me) for i in held]
        work = all_to_all_async(whole, send, out_splits, in_splits, group=ranks.group)
        gathers.append((held, whole, work, send))  # send kept alive until the transfer is done
    scatters = []
    for held, whole, work, _ in gathers:
        work.wait()
        mine = held[me]
        ortho = empty(0) if mine is None else _newton_schulz(whole.view(shapes[mine]), batch[mine].group)
        rows = empty(sum(numel(i, me) for i in held))
        out_splits = [numel(i, me) for i in held]
        in_splits = [numel(mine, r) for r in range(world)]
        send = ortho.contiguous().view(-1)  # tall matrices come back transposed
        work = all_to_all_async(rows, send, out_splits, in_splits, group=ranks.group)
        scatters.append((held, rows, work, send))
    orthos: list[Tensor | None] = [None] * len(batch)
    for held, rows, work, _ in scatters:
        work.wait()
        parts = rows.split([numel(i, me) for i in held])
        for i, part in zip(held, parts):
            if i is not None:
                orthos[i] = part.view(-1, shapes[i][1])
    return orthos
