"""What the eval stage hands the report: metrics.json and samples.json in the eval folder, read and
written here only.

metrics.json holds each registered metric's keys (kiln.eval.metrics.registry), in registration order,
then `n_params`, the model's parameters; samples.json holds each metric's samples the same way, then
`train_prompts` (train.samples' prompts completed by the final model, shown with training's samples).
A key is one metric's: two metrics giving the same key is an error. The keys of each metric are listed
in its compute.py; its report.py reads them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.layout import EVAL_METRICS, EVAL_SAMPLES


@dataclass(frozen=True)
class EvalOutput:
    """metrics.json and samples.json, as plain JSON-ready dicts (one metric's part of them, or the whole)."""

    metrics: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)

    def add(self, part: EvalOutput, by: str) -> EvalOutput:
        """This output with `part`'s keys after its own; a key already here is an error naming `by`."""
        for mine, theirs, file in (
            (self.metrics, part.metrics, EVAL_METRICS),
            (self.samples, part.samples, EVAL_SAMPLES),
        ):
            repeated = sorted(set(mine) & set(theirs))
            if repeated:
                raise KilnError(f"eval metric {by} gives {', '.join(repeated)} in {file}, which another metric gave")
        return EvalOutput(self.metrics | part.metrics, self.samples | part.samples)

    def write(self, folder: Path) -> None:
        write_json(Path(folder) / EVAL_SAMPLES, self.samples)
        write_json(Path(folder) / EVAL_METRICS, self.metrics)

    @classmethod
    def read(cls, folder: Path) -> EvalOutput:
        return cls(read_json(Path(folder) / EVAL_METRICS), read_json(Path(folder) / EVAL_SAMPLES))
