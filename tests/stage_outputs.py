"""What a stage wrote, flattened for comparison: {location: value} over its declared outputs
(kiln.layout), with a location per JSON key path, per line of a JSON lines or text file, per tensor
of a safetensors file, and one for any other file's bytes. Two runs of the same config differ in
places (wall times, throughput, peak memory, dates): `noise` finds them by running twice, and
`differences` leaves them out."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from kiln.layout import Layout

SKIPPED = {".snakemake_timestamp"}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
# Declared outputs that are a stage's account of its work rather than its work: train's summary.json
# lists the loss at each log step and validation and the run's speed, so logging and cadence settings
# change it by design; what train makes is the weights, their config and the export.
ACCOUNTS = {"train": {"summary.json"}}
TEXT = {".md", ".txt", ".yaml"}


def _flat_json(value, where: str, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flat_json(item, f"{where}.{key}", out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for item in value:  # a list of named entries (the smoke checks) by name, not position
            _flat_json(item, f"{where}[{item['name']}]", out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _flat_json(item, f"{where}[{index}]", out)
    else:
        out[where] = value


def _flat_file(path: Path, name: str, out: dict) -> None:
    if path.suffix == ".json":
        _flat_json(json.loads(path.read_text(encoding="utf-8")), name, out)
    elif path.suffix == ".jsonl":
        for index, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            _flat_json(json.loads(line), f"{name}:{index + 1}", out)
    elif path.suffix in TEXT:
        for index, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            out[f"{name}:{index + 1}"] = line
    elif path.suffix == ".safetensors":
        for tensor, value in load_file(path).items():
            out[f"{name}[{tensor}]"] = value
    else:
        out[name] = path.read_bytes()


def written(root: Path, cfg: dict, stage: str) -> dict[str, object]:
    """{location: value} over `stage`'s declared outputs in the results folder `root`, for config `cfg`
    (locations relative to the stage's folder, so two data keys' folders compare)."""
    layout = Layout(cfg, root=root)
    folder = layout.folder(stage)
    out: dict[str, object] = {}
    for output in layout.outputs(stage):
        output = Path(output)
        if output.name in ACCOUNTS.get(stage, ()):
            continue
        files = sorted(p for p in output.rglob("*") if p.is_file()) if output.is_dir() else [output]
        for path in files:
            if path.name not in SKIPPED:
                _flat_file(path, str(path.relative_to(folder)), out)
    if not out:
        raise AssertionError(f"{stage}: nothing written under {folder}")
    return out


def _same(a, b, rel: float) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        return torch.equal(a, b) if rel == 0 else torch.allclose(a.float(), b.float(), rtol=rel, atol=rel)
    if rel and isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel)
    if rel and isinstance(a, str) and isinstance(b, str):  # a figure in words: its numbers within rel
        words_a, words_b = NUMBER.split(a), NUMBER.split(b)
        numbers_a, numbers_b = NUMBER.findall(a), NUMBER.findall(b)
        return (
            words_a == words_b
            and len(numbers_a) == len(numbers_b)
            and all(_close_text(x, y, rel) for x, y in zip(numbers_a, numbers_b))
        )
    return type(a) is type(b) and a == b


def _close_text(x: str, y: str, rel: float) -> bool:
    """Two numbers as printed: equal within rel, or within the last digit printed."""
    digits = len(x.split(".")[1]) if "." in x else 0
    return math.isclose(float(x), float(y), rel_tol=rel, abs_tol=max(rel, 10.0**-digits))


def differences(a: dict, b: dict, noise: set[str] = frozenset(), rel: float = 0.0) -> list[str]:
    """The locations where two flattened outputs differ, less `noise`; numbers and tensors within
    `rel` (relative and absolute) count as equal where rel > 0."""
    return sorted(loc for loc in a.keys() | b.keys() if loc not in noise and not _same(a.get(loc), b.get(loc), rel))


# Measurements, which two runs may or may not disagree on: the smoke gate's preflight figure states the
# measured peak memory, its data check the measured share of step time spent waiting, the probe's peak
# memory is the process's (on a CPU its resident set, which moves with the allocator's timing), and the
# host memory a rank held is its peak resident set plus its compile workers' (kiln.train.metrics).
MEASURED_FIGURES = {
    "smoke": {
        "report.json.checks[preflight].figure",
        "report.json.checks[data].figure",
        "report.json.probe.peak_memory_mb",
        "report.json.host_mb_per_rank",
    }
}


# A duration printed to the second or minute (the report's plan table: "0m00s"): two quick runs may
# both print the same, and a third, slowed by a neighbouring test lane, one second more.
DURATION = re.compile(r"\b\d+m\d{2}s\b|\b\d+h\d{2}m\b")


def noise(stage: str, first: dict, second: dict) -> set[str]:
    """The locations two runs of one config disagree on, and those that measure (MEASURED_FIGURES, and
    text that prints a duration): not the config's doing."""
    timed = {
        place
        for run in (first, second)
        for place, value in run.items()
        if isinstance(value, str) and DURATION.search(value)
    }
    return set(differences(first, second)) | MEASURED_FIGURES.get(stage, set()) | timed
