"""The eval metrics by name: one `register` line each, at the bottom. The eval suite measures them and
the report shows them in this order (kiln.eval.suite, kiln.report.run).

A metric is one folder, kiln/eval/metrics/<name>/ (docs/extending.md):

    section.py  torch-free: the keys it adds to the eval section (a Section subclass named Fields,
                each field declared with `setting(...)`); optional for a metric with no settings
    compute.py  measure(ctx: kiln.eval.context.Context) -> kiln.eval.metrics.output.EvalOutput: the
                keys it adds to metrics.json and samples.json (torch)
    report.py   torch-free: its part of report.md, any of tables (its ### tables under the report's
                "Evaluation" heading), section (a ## section of its own after them) and examples (in
                the report's closing samples), each (out: EvalOutput, data: the report's inputs) ->
                markdown lines, each part ending in a blank line; optional for a metric the report
                does not show

This module is torch-free and loads nothing at import: kiln.config builds the eval section from the
metrics' section modules (kiln.config.eval_sections), the report stage reads their report modules, and
neither imports torch. A section module belongs to kiln.config's layer, a report module to
kiln.report's (tests/unit/test_layers.py); compute.py is kiln.eval's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

from kiln.errors import KilnError


@dataclass(frozen=True)
class Metric:
    """A registered metric: its name and the package its section.py, compute.py and report.py are in."""

    name: str
    package: str  # "kiln.eval.metrics.heldout"
    about: str  # one line: what it measures
    _loaded: dict[str, ModuleType | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def section(self) -> ModuleType | None:
        """section.py (its Fields), None for a metric with no settings."""
        return self._load("section")

    @property
    def report(self) -> ModuleType | None:
        """report.py, None for a metric the report does not show."""
        return self._load("report")

    @property
    def compute(self) -> str:
        """The dotted name of compute.py (torch), which only kiln.eval.suite imports."""
        return f"{self.package}.compute"

    def _load(self, part: str) -> ModuleType | None:
        if part not in self._loaded:
            name = f"{self.package}.{part}"
            try:
                self._loaded[part] = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name:  # a missing module inside it is a real error
                    raise
                self._loaded[part] = None
        return self._loaded[part]


METRICS: dict[str, Metric] = {}


def register(name: str, package: str, about: str) -> Metric:
    """Add a metric (its folder is `package`); a name registered twice is an error."""
    if name in METRICS:
        raise KilnError(f"eval metric {name!r} is registered twice ({METRICS[name].package}, {package})")
    METRICS[name] = Metric(name, package, about)
    return METRICS[name]


def metrics() -> tuple[Metric, ...]:
    return tuple(METRICS.values())


# One line per metric (docs/extending.md). The order is the eval section's keys', metrics.json's and
# samples.json's, and the report's within each of its parts.
register(
    "heldout",
    "kiln.eval.metrics.heldout",
    "held-out loss, perplexity and bits per byte, per source and per checkpoint, beside a unigram model",
)
register("completions", "kiln.eval.metrics.completions", "eval.prompts completed greedily and sampled")
register(
    "infill", "kiln.eval.metrics.infill", "fill-in-the-middle on held-out documents: exact match and edit similarity"
)
register("lm_eval", "kiln.eval.metrics.lm_eval", "lm-evaluation-harness tasks, local and from the hub")
register("code", "kiln.eval.metrics.code", "HumanEval pass@k and HumanEval-Infilling pass@1, run in the sandbox")
register(
    "contamination", "kiln.eval.metrics.contamination", "13-gram overlap of each eval set with the training tokens"
)
