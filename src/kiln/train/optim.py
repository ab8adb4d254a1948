"""AdamW with weight decay on matrices only.

Decay applies to every parameter of 2 or more dimensions (attention and MLP weights, and the token
embedding, which is tied to the output head and so acts as a matrix of the head); biases and norm
gains are left undecayed, as in GPT-2, nanoGPT and most open recipes.
"""

from __future__ import annotations

import torch


def build_adamw(model: torch.nn.Module, train: dict, device_type: str) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=train["lr"],
        betas=(train["beta1"], train["beta2"]),
        fused=device_type == "cuda",
    )
