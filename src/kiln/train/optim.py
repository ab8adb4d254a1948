"""AdamW with weight decay on matrices only; betas, eps and decay from the train section.

Decay applies to every parameter of 2 or more dimensions: attention and MLP weights, and the
embeddings. Biases and norm gains are left undecayed (decaying a gain pulls it towards 0, not
towards "no effect"), as in GPT-2, nanoGPT and most open recipes.

Embeddings are decayed on purpose. The token table is tied to the output head in every Kiln
flavour, so it is a matrix of the head as much as a lookup table (and the head's gradient reaches
every row at every step), and nanoGPT and torchtitan decay it too. Some recipes (OLMo 2) exempt
embeddings; that matters most for an untied table, whose rare-token rows get few updates to offset
the decay. GPT-2's learned position table is decayed alike.

The update runs fused (one kernel over all parameters) on CUDA and on CPU; on CPU that is ~4x
faster than torch's default per-tensor loop (2.7 vs 11.6 ms a step for the default config's model).

train.optimizer: muon (Keller Jordan's Muon, modded-nanogpt's speedrun optimiser; torch.optim.Muon,
with what kiln.train.muon adds) trains the hidden matrices, the 2-D weights inside the blocks
(attention's and the MLP's projections), with orthogonalised momentum at train.muon_lr; AdamW as
above trains the rest at train.lr: the token table (tied: also the head), GPT-2's positions, norm
gains and biases. That is modded-nanogpt's split (Muon for the 2-D parameters of the transformer
blocks, Adam for embeddings, head and scalars) and torchtitan's (Moonlight's) for its Muon runs.

The loop sees one object, Optimizers (torchtitan's OptimizersContainer, smaller): step, zero_grad,
found_inf (the step's non-finite flag, which every part honours on the device), set_lr. The LR
schedule (kiln.train.schedule) is written in train.lr's units; set_lr scales every group by its own
base LR over train.lr, as modded-nanogpt's LambdaLR multiplies each optimizer's base LR, so AdamW
follows the schedule exactly as before and Muon follows the same curve from train.muon_lr.
Checkpoints hold the parts' state keyed by parameter name (kiln.train.parallel passes `parts` to
torch.distributed.checkpoint's helpers, which take a list of optimizers); with AdamW alone that is the
very dict a single AdamW gave, so older checkpoints resume.
"""

from __future__ import annotations

from typing import Iterable

import torch

from kiln.config.train_sections import TrainSection
from kiln.train.muon import Muon

OPTIMIZERS = ("adamw", "muon")  # train.optimizer


def hidden_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What Muon trains: the trainable 2-D weights inside model.blocks (q/k/v/o or qkv/proj, and the
    MLP's). The token table and head, positions, gains and biases are not in it."""
    return [p for p in model.blocks.parameters() if p.requires_grad and p.dim() == 2]


def build_optimizer(model: torch.nn.Module, train: TrainSection, device_type: str, bf16: bool) -> Optimizers:
    """train.optimizer's optimizers for `model` (before or after kiln.train.parallel readied it),
    as one Optimizers. bf16: the step's precision (kiln.train.device.use_bf16), which Muon's
    Newton-Schulz iteration follows (kiln.train.muon, 5)."""
    if train.optimizer == "adamw":
        return Optimizers([build_adamw(model, train, device_type)], train.lr)
    if train.optimizer != "muon":
        raise ValueError(f"unknown optimizer {train.optimizer!r} (known: {', '.join(OPTIMIZERS)})")
    hidden = hidden_matrices(model)
    muon = Muon(
        hidden,
        lr=train.muon_lr,
        momentum=train.muon_momentum,
        weight_decay=train.muon_weight_decay,
        nesterov=True,
        adjust_lr_fn=train.muon_adjust_lr,
        normuon=bool(train.normuon),
        dtype=torch.bfloat16 if bf16 else torch.float32,
    )
    taken = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    return Optimizers([muon, build_adamw(model, train, device_type, rest)], train.lr)


class Optimizers:
    """Several optimizers over disjoint parameters, stepped as one (module docstring). `parts` are
    torch optimizers; param_groups and state read through to theirs."""

    def __init__(self, parts: list[torch.optim.Optimizer], base_lr: float):
        self.parts = list(parts)
        # Each group's LR as a multiple of train.lr, by position: loading a state dict replaces the
        # group dicts, not their order. AdamW's is exactly 1.0, so its LR is the schedule's, bit for bit.
        self._scales = [[group["lr"] / base_lr for group in part.param_groups] for part in self.parts]

    @property
    def param_groups(self) -> list[dict]:
        return [group for part in self.parts for group in part.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for part in self.parts for p, s in part.state.items()}

    @property
    def found_inf(self) -> torch.Tensor | None:
        return getattr(self.parts[0], "found_inf", None)

    @found_inf.setter
    def found_inf(self, flag: torch.Tensor | None) -> None:
        """Nonzero (a device tensor): the next step applies nothing, moments and step counts included."""
        for part in self.parts:
            part.found_inf = flag

    def set_lr(self, lr: float) -> None:
        """lr: the schedule's value (train.lr's units) for this step; each group gets its share."""
        for part, scales in zip(self.parts, self._scales):
            for group, scale in zip(part.param_groups, scales):
                group["lr"] = lr * scale

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """torch's form (parameters by index, numbered across the parts in order), as one optimizer
        holding every part's groups would give it: a lone AdamW's own. For a process that rebuilds
        the same model; checkpoints use kiln.train.parallel's, keyed by parameter name."""
        state, groups, offset = {}, [], 0
        for part in self.parts:
            own = part.state_dict()
            state |= {offset + i: s for i, s in own["state"].items()}
            groups += [g | {"params": [offset + i for i in g["params"]]} for g in own["param_groups"]]
            offset += sum(len(g["params"]) for g in part.param_groups)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        groups, offset = list(state["param_groups"]), 0
        if len(groups) != len(self.param_groups):
            raise ValueError(f"optimizer state of {len(groups)} parameter groups for {len(self.param_groups)}")
        for part in self.parts:
            own, groups = groups[: len(part.param_groups)], groups[len(part.param_groups) :]
            ids = [i for g in own for i in g["params"]]
            part.load_state_dict(
                {
                    "state": {i - offset: state["state"][i] for i in ids if i in state["state"]},
                    "param_groups": [g | {"params": [i - offset for i in g["params"]]} for g in own],
                }
            )
            offset += len(ids)


def build_adamw(
    model: torch.nn.Module, train: TrainSection, device_type: str, params: Iterable[torch.nn.Parameter] | None = None
) -> torch.optim.AdamW:
    """AdamW over `params` (default: every trainable parameter of model)."""
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=train.lr,
        betas=(train.beta1, train.beta2),
        eps=train.eps,
        fused=device_type in ("cuda", "cpu"),
    )
