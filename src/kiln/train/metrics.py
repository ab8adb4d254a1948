"""Throughput accounting and the metrics sink shared by console, metrics.jsonl and wandb.

FLOPs per token (PaLM appendix B, as nanoGPT and torchtitan use): 6N + 12*L*H*Q*T, where N is the
non-embedding parameter count, L layers, H heads, Q head dim, T sequence length; the second term is
the attention score and value matmuls that 6N leaves out. MFU divides achieved FLOP/s by the device's
dense bf16 peak; CPUs have no entry, so MFU is reported only on known GPUs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from kiln.model.gpt import GPT

log = logging.getLogger("kiln.train")

# Dense bf16 peak TFLOP/s by device-name fragment (torchtitan's table; first match wins).
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 125.0),
)


def flops_per_token(model: GPT) -> float:
    cfg = model.cfg
    return 6 * model.num_params(non_embedding=True) + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops * 1e12
    return None


class MetricsSink:
    """One JSON object per line in metrics.jsonl, mirrored to wandb when enabled (rank 0 only)."""

    def __init__(self, path: Path, wandb_cfg: dict, run_config: dict, enabled: bool = True,
                 resume_step: int = 0):
        self.enabled = enabled
        self.file = self._open(path, resume_step) if enabled else None
        self.wandb = None
        if enabled and wandb_cfg["mode"] != "disabled":
            import wandb  # the mode is decided before init: online without network stalls ~90 s

            self.wandb = wandb.init(
                project=wandb_cfg["project"], mode=wandb_cfg["mode"], dir=str(path.parent),
                config=run_config,
            )

    @staticmethod
    def _open(path: Path, resume_step: int):
        """Open for appending, first dropping records past the step a resumed run restarts from
        (a run killed after its last checkpoint logged steps that will now be redone)."""
        kept = []
        if resume_step and path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= resume_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        return open(path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()
