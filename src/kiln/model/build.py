"""Build a model from a ModelConfig (kiln.config.models): its family's module (kiln.model.registry);
save and load a trained one.

A saved model is a folder with model_config.json (the full ModelConfig) and model.safetensors;
Hugging Face's format is kiln.hf.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kiln.config.models import ModelConfig
from kiln.errors import KilnError
from kiln.io import atomic_file, write_json
from kiln.model import registry
from kiln.model.documents import require_eos

CONFIG_FILE, WEIGHTS_FILE = "model_config.json", "model.safetensors"


def model_class(family: str) -> type[torch.nn.Module]:
    """The nn.Module class of a registered family: its module.py, imported here (torch) and not by the
    torch-free registry."""
    found = registry.get(family)
    return getattr(importlib.import_module(found.module), found.model)


def build_model(cfg: ModelConfig) -> torch.nn.Module:
    require_eos(cfg)  # model.document_mask: its documents' end-of-text id, before any weight is made
    return model_class(cfg.family)(cfg)


def save_model(cfg: ModelConfig, state: dict[str, torch.Tensor], out_dir: Path) -> None:
    """model_config.json and model.safetensors (written atomically) from a model's state dict; a
    head tied to the embedding is stored once."""
    weights = {
        k: v.detach().cpu().contiguous() for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")
    }
    write_json(out_dir / CONFIG_FILE, cfg.to_dict())
    with atomic_file(out_dir / WEIGHTS_FILE) as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})


def load_model(model_dir: Path, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The model save_model wrote into model_dir, in eval mode."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise KilnError(f"{path}: not found; is {model_dir} a train stage output folder?")
    cfg = ModelConfig(**json.loads(path.read_text(encoding="utf-8")))
    state = load_file(str(Path(model_dir) / WEIGHTS_FILE))
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["wte.weight"]
    model = build_model(cfg)
    model.load_state_dict(state)
    return model.to(device).eval()
