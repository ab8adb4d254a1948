"""A rehearsal's result (kiln.rehearse runs it), torch-free: each phase's per-rank peak, its largest
tensor and the card's usable memory, and what will not start; the table `kiln rehearse` prints, the
verdict it exits on, and the rehearse stage's rehearsal.json (kiln.layout.REHEARSAL), which smoke
waits for and `kiln plan` shows beside its estimate. This module owns that file's layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.plan.memory import GIB
from kiln.plan.peaks import GPU, gpu_of
from kiln.plan.tables import aligned

# What helps where the model and its optimizer state alone do not fit: no micro-batch does
UNBATCHED_ADVICE = (
    "The weights, gradients and optimizer state alone: shard them over more ranks (train.parallel: fsdp, "
    "train.nproc_per_node / nnodes), a card with more memory (plan.gpu), or a smaller model"
)


@dataclass(frozen=True)
class Tensor:
    """One allocation: its shape, dtype, bytes and the module (or function) that made it."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    made_by: str

    def describe(self) -> str:
        return f"{tuple(self.shape)} {self.dtype}, {in_gib(self.nbytes)}"


def in_gib(nbytes: int) -> str:
    """Bytes as GiB, or MiB below one GiB (a small model's phases would all read 0.00 GiB)."""
    return f"{nbytes / GIB:,.2f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:,.2f} MiB"


@dataclass
class Phase:
    """One phase's per-rank peak (bytes), its largest tensor, and whether it fits the card."""

    name: str
    peak: int
    largest: Tensor | None
    usable: int
    # A compiled run's training step: the eager count less what compiling keeps less, as
    # kiln.plan.memory's eager and compiled estimates differ at this step (kiln.rehearse.run, the
    # calibration in docs/benchmarks.md); None where the phase runs as it is counted
    compiled: int | None = None
    advice: str | None = None  # what helps where it does not fit; None: a training batch's (Rehearsal.advice)

    @property
    def held(self) -> int:
        """Bytes per rank the phase holds at its peak as the run runs it (compiled or not)."""
        return self.peak if self.compiled is None else self.compiled

    @property
    def fits(self) -> bool:
        return self.held <= self.usable

    @property
    def verdict(self) -> str:
        compiled = f" (compiled: {in_gib(self.compiled)}, estimated)" if self.compiled is not None else ""
        return ("fits" if self.fits else "DOES NOT FIT") + compiled


@dataclass
class Rehearsal:
    run: str
    gpu: GPU
    layout: str
    phases: list[Phase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what fails when the job starts, not memory
    advice: str = ""
    # the rehearse stage's settings it was run for (kiln.config.settings.tracked): `kiln plan` shows a
    # rehearsal only beside the config it rehearsed
    settings: str = ""

    def phase(self, start: str) -> Phase:
        """The phase whose name starts with `start`."""
        return next(p for p in self.phases if p.name.startswith(start))

    def save(self, path: Path) -> None:
        write_json(path, {**asdict(self), "gpu": self.gpu.fragment})

    @classmethod
    def load(cls, path: Path) -> Rehearsal:
        data = read_json(path)
        phases = [
            Phase(
                **{
                    **p,
                    "largest": Tensor(**{**p["largest"], "shape": tuple(p["largest"]["shape"])})
                    if p["largest"]
                    else None,
                }
            )
            for p in data["phases"]
        ]
        return cls(**{**data, "gpu": gpu_of(data["gpu"]), "phases": phases})


def render(rehearsal: Rehearsal) -> str:
    """The terminal table `kiln rehearse` prints and the rehearse stage logs."""
    rows = [("phase", "peak / rank", "largest tensor", "made by", "verdict")]
    for p in rehearsal.phases:
        largest = p.largest
        described = (largest.describe(), largest.made_by) if largest else ("", "")
        rows.append((p.name, in_gib(p.peak), *described, p.verdict))
    usable = rehearsal.phases[0].usable / GIB if rehearsal.phases else 0
    head = (
        f"# Rehearsal of {rehearsal.run}: {rehearsal.layout} on {rehearsal.gpu.fragment} "
        f"({usable:.1f} of its {rehearsal.gpu.memory_gib:g} GiB a step may use), fake tensors, rank 0"
    )
    return "\n".join([head, "", *aligned(rows)])


def check(rehearsal: Rehearsal) -> None:
    """A KilnError naming the first phase that will not fit or not start, with the fix."""
    if rehearsal.problems:
        raise KilnError(f"{rehearsal.run}: will not start as set: {'; '.join(rehearsal.problems)}")
    for phase in rehearsal.phases:
        if not phase.fits:
            largest = (
                f"; its largest tensor {phase.largest.describe()} from {phase.largest.made_by}" if phase.largest else ""
            )
            raise KilnError(
                f"{rehearsal.run}: {phase.name} will not fit on {rehearsal.gpu.fragment}: "
                f"{phase.held / GIB:.1f} GiB per rank > the {phase.usable / GIB:.1f} GiB a step may use{largest}. "
                + (rehearsal.advice if phase.advice is None else phase.advice)
            )


def plan_rows(path: Path, settings: str) -> dict | None:
    """What `kiln plan` shows of the rehearsal at `path` for a config whose rehearse settings are
    `settings`: each phase's per-rank peak (GiB); {"stale": why} where it rehearsed other settings;
    None where none was written."""
    if not path.is_file():
        return None
    rehearsal = Rehearsal.load(path)
    if rehearsal.settings != settings:
        return {"stale": f"{path} rehearsed other settings: `kiln rehearse` or the rehearse rule shows these"}
    return {
        "path": str(path),
        "phases": {
            p.name: {"gib": p.held / GIB, "compiled": p.compiled is not None, "fits": p.fits} for p in rehearsal.phases
        },
    }
