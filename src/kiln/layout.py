"""Where everything lands under results/: the one owner of the run layout.

Data stages are shared by content. Their folders sit under results/data/, each named by its stage
and a key, the hash of every config section that shapes it and everything upstream of it
(kiln.config.settings.data_key: the sections each stage reads, its retry settings held at their defaults):

    results/data/raw-<key>/                 download      key of: download
    results/data/tokenizer-<key>/           tokenizer     ... + seed, tokenizer
    results/data/tokens-<key>/              pretokenize   ... + pretokenize
    results/data/shards-<key>/              shard         ... + shard
    results/data/tokens-<key>.plan.json           pretokenize_plan: how many raw parts, so part jobs
    results/data/tokens-<key>.parts/part-NNNNN/   pretokenize_part, one per raw part (temporary)
    results/data/logs/<stage>-<key>.log, results/data/benchmarks/<stage>-<key>.tsv
    (a scatter job's: <job>-<key>-NNNNN.log, .tsv)

so runs (and sweep arms) with equal data sections use one copy, built once, and a run whose data
settings differ gets its own folders: nothing built for one setting is ever handed to another.
The stages that belong to one run sit under its folder:

    results/<run>/smoke/  train/  eval_data/  eval/  report.md  loss.png  logs/  benchmarks/
    results/<run>/layout.json               where this run's data stages are (for kiln status)

A sweep's arms are runs named <sweep>-<arm>; the sweep's overlay report is results/<sweep>/sweep.md
(with sweep.png and sweep.json), and results/<sweep>/layout.json lists the arms.

The rules (workflow/rules/*.smk), the stage scripts, `kiln status` and the report read their paths
from here; nothing else spells them.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from kiln.config import settings
from kiln.errors import ConfigError, KilnError
from kiln.io import read_json, write_json

RESULTS = "results"
DATA = "data"  # results/data/: the shared stages; no run may be called this
LAYOUT_FILE = "layout.json"
PARTS = ".parts"  # <stage folder>.parts/: a scattered stage's per-part folders
KEY_CHARS = 12  # hex digits of sha256, 48 bits: a collision would take millions of distinct data settings


# The eval_data stage's outputs (kiln.eval.prepared reads and writes them): its figures, and the
# local lm-eval tasks' data files.
EVAL_DATA, EVAL_TASK_DATA = "eval_data.json", "lm_eval_tasks"
# The eval stage's output, which the report reads (kiln.eval.metrics.output owns what is in them).
EVAL_METRICS, EVAL_SAMPLES = "metrics.json", "samples.json"
# The rehearse stage's output, which smoke waits for and `kiln plan` reads (kiln.plan.rehearsal owns it).
REHEARSAL = "rehearsal.json"


@dataclass(frozen=True)
class Stage:
    name: str
    folder: str  # the stage's folder name ("" for the report: its files sit in the run folder)
    outputs: tuple[str, ...]  # declared outputs inside the folder; () when the folder itself is the output
    shared: bool  # built once per data key under results/data/, or per run
    needs: tuple[str, ...] | None = None  # the stages whose outputs it reads; None: every stage before it


STAGES = (
    Stage("download", "raw", (), True),
    Stage("tokenizer", "tokenizer", ("tokenizer.json", "stats.json"), True),
    Stage("pretokenize", "tokens", (), True),
    Stage("shard", "shards", (), True),
    # the GPU step's memory on fake tensors (kiln.rehearse): from the config alone, before the data
    Stage("rehearse", "rehearse", (REHEARSAL,), False, needs=()),
    Stage("smoke", "smoke", ("report.json",), False),
    Stage("plan", "smoke", ("plan.json", "plan.md"), False),  # the smoke measurements priced, beside them
    # train reads the smoke report (its gate, its measurements), never the plan's prices
    Stage(
        "train",
        "train",
        ("model.safetensors", "model_config.json", "summary.json", "hf"),
        False,
        needs=("download", "tokenizer", "pretokenize", "shard", "smoke"),
    ),
    # eval's work on the data alone: it needs only the data stages, so it runs beside smoke and train
    Stage(
        "eval_data",
        "eval_data",
        (EVAL_DATA, EVAL_TASK_DATA),
        False,
        needs=("download", "tokenizer", "pretokenize", "shard"),
    ),
    Stage(
        "eval",
        "eval",
        (EVAL_METRICS, EVAL_SAMPLES),
        False,
        needs=("download", "tokenizer", "pretokenize", "shard", "smoke", "train", "eval_data"),
    ),
    Stage("report", "", ("report.md", "loss.png"), False),
)
BY_NAME = {stage.name: stage for stage in STAGES}
# A scattered stage's other jobs (workflow/rules/<stage>.smk), each a rule and script of its own: a plan
# (a Snakemake checkpoint that counts the part jobs) and the part jobs; the stage's own job gathers
# the parts. download: one part job per share of the input files; pretokenize: one per raw part.
SCATTER_JOBS = {
    "download": ("download_plan", "download_part"),
    "pretokenize": ("pretokenize_plan", "pretokenize_part"),
}
STAGE_OF_JOB = {job: stage for stage, jobs in SCATTER_JOBS.items() for job in jobs}
DATA_STAGES = tuple(stage.name for stage in STAGES if stage.shared)
RUN_STAGES = tuple(stage.name for stage in STAGES if not stage.shared)
assert tuple(stage.name for stage in STAGES) == settings.STAGES, "kiln.config.settings.STAGES names these, in order"
# The train folder's files that belong to one training trajectory, set aside together when a rerun
# starts the trajectory over (kiln.train.trainer); the checkpoints last, so a kill part-way leaves
# them where the next attempt finds them and sets them aside again.
METRICS, SAMPLES, CHECKPOINTS = "metrics.jsonl", "samples.jsonl", "checkpoints"
# wandb/ is wandb's own folder (offline runs); WANDB_ID inside it keeps the run's W&B id, so a
# resumed job continues the same W&B run and a trajectory set aside takes its id with it.
# MIRROR_LOG: one line per copy of a checkpoint to train.checkpoint_mirror (kiln.train.mirror).
WANDB, WANDB_ID, MIRROR_LOG = "wandb", "run_id", "mirror.jsonl"
# BUDGET_LOG: one line per decision of a budgeted run's re-planning (kiln.train.budget), which a resumed
# run replays.
BUDGET_LOG = "budget.jsonl"
# FINAL_SUMMARY: train's summary.json as the run that trained it wrote it. Snakemake deletes a job's
# declared outputs before it runs it, so a train job that finds its trajectory already finished (it
# reran because an input was rewritten, not because anything it trains on changed) writes the run's
# summary from here, not from a job that trained 0 steps.
FINAL_SUMMARY = "final-summary.json"
TRAJECTORY = (METRICS, SAMPLES, WANDB, MIRROR_LOG, BUDGET_LOG, FINAL_SUMMARY, CHECKPOINTS)
# RETRAIN: written by the Snakefile's onstart for a train job Snakemake was told to force (--forcerun
# train, -F, -f on its output), taken by that job: a finished run there trains again from step 0. Any
# other rerun of train keeps a finished run whose fingerprint matches (kiln.train.resume).
RETRAIN = "retrain-requested"
# One line per train job that kiln.train.launch ran (its Snakemake attempt and exit code), read by
# the next attempt to tell a resubmission after a preemption from one after a real error.
TRAIN_JOBS = "jobs.jsonl"
SUPERSEDED = "superseded"
# checkpoints/LATEST names the newest checkpoint folder (step-NNNNNNN). kiln.train.checkpoint writes it
# (and owns what is inside a checkpoint); a resume does not trust it, kiln status reads it (latest_step).
LATEST = "LATEST"


@dataclass(frozen=True)
class ScatterPlan:
    """What a scattered stage's plan job tells Snakemake and the part jobs before any part runs: one
    stamp per part job, what it must be made from (download: kiln.data.raw_scatter.download_plan;
    pretokenize: one per raw part, kiln.data.token_plan.Plan.stamp). A Snakemake checkpoint's output:
    the workflow learns the scatter's width from it, and the gather checks each part's stamp. `gather`:
    shares no part job makes, which the gather makes itself if it needs them (download: those past a
    budget's expected reach)."""

    stamps: list[dict]
    gather: list[dict] = field(default_factory=list)

    @property
    def parts(self) -> int:
        return len(self.stamps)

    def save(self, path: Path) -> None:
        write_json(
            path, {"parts": self.parts, "stamps": self.stamps} | ({"gather": self.gather} if self.gather else {})
        )

    @classmethod
    def load(cls, path: Path) -> "ScatterPlan":
        saved = read_json(path)
        return cls(saved["stamps"], saved.get("gather", []))


def data_key(cfg: dict, stage: str) -> str:
    return settings.data_key(cfg, stage, KEY_CHARS)


class Layout:
    """The paths of one run: `Layout(cfg)` for a validated config, under `root` (results/).
    `run` may be a Snakemake wildcard ("{run}") to build a rule's patterns; `keys` then holds
    "{key}" for every data stage unless a config is given."""

    def __init__(
        self,
        cfg: dict | None = None,
        *,
        run: str | None = None,
        root: str | Path = RESULTS,
        keys: dict[str, str] | None = None,
        legacy: bool = False,
    ):
        self.root = Path(root)
        self.run = run if run is not None else cfg["run_name"]
        if cfg is not None:
            check_run_name(self.run)
        self.keys = keys if keys is not None else {stage: data_key(cfg, stage) for stage in DATA_STAGES}
        self.legacy = legacy  # a run folder of an older Kiln, its data stages inside it (read, never written)

    @classmethod
    def pattern(cls, root: str | Path = RESULTS) -> "Layout":
        """Every path with Snakemake wildcards: {run} for the run, {key} for a data stage's key."""
        return cls(run="{run}", root=root, keys={stage: "{key}" for stage in DATA_STAGES})

    @property
    def run_dir(self) -> Path:
        return self.root / self.run

    @property
    def data_dir(self) -> Path:
        return self.root / DATA

    def folder(self, stage: str) -> Path:
        spec = BY_NAME[stage]
        if spec.shared and not self.legacy:
            return self.data_dir / f"{spec.folder}-{self.keys[stage]}"
        return self.run_dir / spec.folder if spec.folder else self.run_dir

    def output(self, stage: str, name: str | None = None) -> str:
        """A declared output of `stage` (the folder itself when the stage declares none, or `name`)."""
        spec = BY_NAME[stage]
        if not spec.outputs:
            return str(self.folder(stage))
        name = name or spec.outputs[0]
        if name not in spec.outputs:
            raise KeyError(f"{stage} declares no output {name!r} (it declares {', '.join(spec.outputs)})")
        return str(self.folder(stage) / name)

    def outputs(self, stage: str) -> list[str]:
        spec = BY_NAME[stage]
        return [self.output(stage, name) for name in spec.outputs] or [self.output(stage)]

    def part(self, stage: str, index: int | str) -> str:
        """The folder of a shared stage's scatter job for raw part `index` (a wildcard such as
        "{part}" in a pattern), beside the stage's folder: the gather (the stage's own job) reads it."""
        name = f"part-{index:05d}" if isinstance(index, int) else f"part-{index}"
        return str(self.folder(stage).with_name(f"{self.folder(stage).name}{PARTS}") / name)

    def scatter_plan(self, stage: str) -> str:
        """What a scattered stage's plan job writes beside the stage's folder: how many part jobs
        there are (ScatterPlan). Kept: the workflow reads it on every run."""
        return f"{self.folder(stage)}.plan.json"

    def scatter_outputs(self, stage: str) -> list[str]:
        """What a scattered stage's plan and part jobs write (SCATTER_JOBS): the plan, then the part
        folders it counts, once it exists; nothing for another stage."""
        if stage not in SCATTER_JOBS:
            return []
        plan = self.scatter_plan(stage)
        parts = ScatterPlan.load(Path(plan)).parts if Path(plan).is_file() else 0
        return [plan, *(self.part(stage, index) for index in range(parts))]

    def log(self, stage: str, job: str | None = None, part: int | str | None = None) -> str:
        """The log of `stage`'s job (or of another job, `job`, on the same folder, e.g. verify, or a
        scatter job's for raw part `part`)."""
        return str(self._aux("logs", stage, job or stage, "log", part))

    def benchmark(self, stage: str, job: str | None = None, part: int | str | None = None) -> str:
        return str(self._aux("benchmarks", stage, job or stage, "tsv", part))

    def benchmarks(self, stage: str) -> list[Path]:
        """The benchmark files of every job of `stage` there are: a scattered stage's plan and part
        jobs' (SCATTER_JOBS), then its own."""
        jobs = SCATTER_JOBS.get(stage, ())
        found = [Path(self.benchmark(stage, job)) for job in jobs[:1]]
        for job in jobs[1:]:
            pattern = Path(self.benchmark(stage, job, part="*"))
            found += sorted(pattern.parent.glob(pattern.name))
        return [p for p in [*found, Path(self.benchmark(stage))] if p.exists()]

    def _aux(self, kind: str, stage: str, job: str, ext: str, part: int | str | None = None) -> Path:
        suffix = "" if part is None else "-" + (f"{part:05d}" if isinstance(part, int) else part)
        if BY_NAME[stage].shared and not self.legacy:
            return self.data_dir / kind / f"{job}-{self.keys[stage]}{suffix}.{ext}"
        return self.run_dir / kind / f"{job}{suffix}.{ext}"

    def verified(self) -> str:
        """The on-demand shard check's report, beside the shard folder it checks."""
        return f"{self.folder('shard')}.verified.json"

    def to_json(self) -> dict:
        return {
            "run": self.run,
            "data": {stage: str(self.folder(stage).relative_to(self.root)) for stage in DATA_STAGES},
            "keys": self.keys,
        }

    def write(self) -> None:
        """results/<run>/layout.json: where this run's data stages are, for `kiln status`."""
        write_json(self.run_dir / LAYOUT_FILE, self.to_json())

    @classmethod
    def read(cls, run_dir: Path) -> "Layout":
        """The layout a run folder records (results/<run>/layout.json). A folder of an older Kiln,
        its data stages inside it, reads as it was laid out (`legacy`); a folder no snakemake has
        started jobs for yet is an error."""
        run_dir = Path(run_dir)
        path = run_dir / LAYOUT_FILE
        if path.is_file():
            saved = read_json(path)
            if "keys" in saved:
                return cls(run=saved["run"], root=run_dir.parent, keys=saved["keys"])
        if legacy_data(run_dir):
            return cls(run=run_dir.name, root=run_dir.parent, keys={}, legacy=True)
        raise KilnError(
            f"{run_dir}: no {LAYOUT_FILE}: no snakemake has started jobs for this run yet "
            "(it is written when snakemake starts)"
        )


def init_folder(spec: dict, root: str | Path = RESULTS) -> Path:
    """What train.init_from reads: {run: NAME} is results/NAME/train; {checkpoint: F} and {hf: F}
    are the folder F."""
    if "run" in spec:
        return Layout(run=spec["run"], root=root, keys={}).folder("train")
    return Path(spec["checkpoint"] if "checkpoint" in spec else spec["hf"])


def init_input(spec: dict | None, root: str | Path = RESULTS) -> list[str]:
    """The train rule's input for train.init_from (another run's final weights, or the folder), so
    the run waits for it and reruns when it changes; none for a random init."""
    if not spec:
        return []
    if "run" in spec:
        return [Layout(run=spec["run"], root=root, keys={}).output("train", "model.safetensors")]
    return [str(init_folder(spec, root))]


def set_aside(train_dir: Path) -> Path | None:
    """Move a superseded trajectory's files (TRAJECTORY) to train/superseded/<UTC time>/, each with
    one rename; None when there were none."""
    train_dir = Path(train_dir)
    present = [train_dir / name for name in TRAJECTORY if (train_dir / name).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = train_dir / SUPERSEDED / stamp
    n = 1
    while dest.exists():
        dest, n = train_dir / SUPERSEDED / f"{stamp}-{n}", n + 1
    dest.mkdir(parents=True)
    for path in present:
        os.replace(path, dest / path.name)
    return dest


def request_retrain(train_dir: Path) -> None:
    """Ask the next train job in train_dir to train again from step 0 (RETRAIN)."""
    Path(train_dir).mkdir(parents=True, exist_ok=True)
    (Path(train_dir) / RETRAIN).write_text("asked for by snakemake --forcerun train (or -F, -f)\n", encoding="utf-8")


def take_retrain_request(train_dir: Path) -> bool:
    """Whether a retrain was asked for (RETRAIN), removing the request: it holds for one job."""
    path = Path(train_dir) / RETRAIN
    if not path.is_file():
        return False
    path.unlink()
    return True


def sweep_outputs(name: str, root: str | Path = RESULTS) -> dict[str, str]:
    """The overlay report of the sweep `name` (its arms are runs of their own): results/<name>/."""
    folder = Path(root) / name
    return {"report": str(folder / "sweep.md"), "plot": str(folder / "sweep.png"), "table": str(folder / "sweep.json")}


def write_sweep_index(name: str, runs: list[str], root: str | Path = RESULTS) -> None:
    """results/<sweep>/layout.json: the sweep's arms, for `kiln status results/<sweep>`."""
    write_json(Path(root) / name / LAYOUT_FILE, {"sweep": name, "arms": list(runs)})


def read_sweep_index(folder: Path) -> list[str] | None:
    """The arms of the sweep whose folder this is, or None when it is not a sweep's."""
    path = Path(folder) / LAYOUT_FILE
    saved = read_json(path) if path.is_file() else {}
    return saved.get("arms") if "sweep" in saved else None


def legacy_data(run_dir: Path) -> list[str]:
    """The data-stage folders an older Kiln kept inside the run folder."""
    return [BY_NAME[s].folder for s in DATA_STAGES if (Path(run_dir) / BY_NAME[s].folder).exists()]


def legacy_message(run_dir: Path, found: list[str], layout: Layout | None = None) -> str:
    moves = [
        f"mv {run_dir / BY_NAME[s].folder} {layout.folder(s)}"
        for s in DATA_STAGES
        if layout is not None and BY_NAME[s].folder in found
    ]
    where = (
        (
            f"; if they were made with the data settings of this config, move them instead of rebuilding: "
            f"mkdir -p {layout.data_dir}; " + "; ".join(moves)
        )
        if moves
        else ""
    )
    return (
        f"{run_dir}: {', '.join(f + '/' for f in found)} are data stages from an older Kiln, which kept them "
        f"in each run's folder; they are no longer read: data stages now live in {Path(run_dir).parent / DATA}/, "
        f"shared by every run with the same data settings, and are rebuilt there{where}. "
        f"Delete the old folders once you no longer need them"
    )


def check_run_name(run: str) -> None:
    """A ConfigError for a run name whose folder would be the shared data stages'."""
    if run == DATA:
        raise ConfigError(f"run_name: {DATA!r} is reserved: {RESULTS}/{DATA}/ holds the data stages that runs share")


def latest_step(train_dir: Path) -> int | None:
    """The step checkpoints/LATEST points at in a train folder, None without one: a torch-free read
    for kiln status (a resume finds the newest complete checkpoint itself, kiln.train.checkpoint)."""
    marker = Path(train_dir) / CHECKPOINTS / LATEST
    found = re.search(r"\d+", marker.read_text()) if marker.exists() else None
    return int(found.group()) if found else None
