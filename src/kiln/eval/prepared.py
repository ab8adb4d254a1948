"""The eval stage's work on the data alone, done once per run on a CPU beside training (the eval_data
stage), so the GPU job that evaluates the model runs the model and little else.

At seed scale this is most of an eval's wall time and none of its GPU work: the unigram baseline
counts every training token, the contamination scan hashes every 13-gram of the train split
(kiln.eval.contamination), and the held-out documents come from a parse of the whole download.
None of it depends on the weights, so it need not wait for them, nor hold a GPU node while it runs.

What it makes (EvalData, in the stage's folder: kiln.layout.EVAL_DATA and EVAL_TASK_DATA):
- the unigram model's loss on the same validation targets eval measures the model on;
- the infilling problems (or why infilling is not measured for this run: kiln.eval.infill);
- the local lm-eval tasks' data files (kiln.eval.lm_tasks);
- the 13-gram contamination of each of those eval sets against the training tokens.

The problems and the task examples are drawn from the data seed, so the runs of a seed study (which
share their data) are scored on the same problems.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from kiln.config.eval_sections import EvalSection
from kiln.config.train_sections import InitFrom
from kiln.data.loader import ShardRows
from kiln.data.sources import read_documents
from kiln.data.tokenizer import load_tokenizer
from kiln.errors import KilnError
from kiln.eval import contamination
from kiln.eval.infill import InfillProblem, make_problems, not_run_reason
from kiln.eval.lm_tasks import current_names, local_task_texts, write_task_data
from kiln.eval.perplexity import BATCH, unigram_loss
from kiln.eval.stream import TokenFile
from kiln.io import atomic_dir, read_json, write_json
from kiln.layout import EVAL_DATA, EVAL_TASK_DATA

log = logging.getLogger("kiln.eval")


@dataclass(frozen=True)
class DataPaths:
    """The data stages' folders the eval_data stage reads."""

    shards: Path
    tokens: Path
    raw: Path
    tokenizer: Path  # tokenizer.json


@dataclass(frozen=True)
class EvalData:
    """What eval measures a model against, made before the model exists."""

    unigram_val_loss: float  # nats/token on eval's validation targets (the first max_batches batches)
    max_batches: int  # eval.max_batches as this was made: eval measures the model on the same batches
    contamination: dict[str, dict]  # eval set -> kiln.eval.contamination's figures
    val_documents: int  # the held-out documents the sets were drawn from
    infill_problems: tuple[InfillProblem, ...]
    infill_not_run: str | None  # why infilling is not measured for this run; None when it is
    folder: Path  # where it lies; the local tasks' data files in folder / EVAL_TASK_DATA

    @property
    def task_data(self) -> Path:
        return self.folder / EVAL_TASK_DATA

    def write(self) -> None:
        figures = asdict(self)
        del figures["folder"]
        write_json(self.folder / EVAL_DATA, figures)

    @classmethod
    def read(cls, folder: Path, max_batches: int) -> "EvalData":
        """The eval_data stage's output in `folder`, made for eval.max_batches `max_batches`."""
        figures = read_json(folder / EVAL_DATA)
        problems = tuple(InfillProblem(**p) for p in figures.pop("infill_problems"))
        data = cls(**figures, infill_problems=problems, folder=Path(folder))
        if data.max_batches != max_batches:
            raise KilnError(
                f"{folder / EVAL_DATA}: made for eval.max_batches {data.max_batches}, and this eval's is "
                f"{max_batches}: its unigram baseline is not on the same batches; rerun the eval_data stage"
            )
        return data


def prepare(paths: DataPaths, eval_cfg: EvalSection, seed: int, init_from: InitFrom | None, out_dir: Path) -> EvalData:
    """Make and write the run's EvalData into out_dir (the eval_data stage). eval_cfg: the eval
    section; seed: the data seed; init_from: train.init_from (a model that may have seen FIM)."""
    tokenizer = load_tokenizer(paths.tokenizer)
    meta = read_json(paths.tokens / "meta.json")
    train = TokenFile(paths.tokens / "train.bin", meta["dtype"])
    log.info("unigram baseline: counting %d training tokens", len(train))
    val_rows = ShardRows(paths.shards, "val")
    unigram = unigram_loss(train, val_rows, meta["padded_vocab_size"], BATCH, eval_cfg.max_batches)

    log.info("held-out documents from %s", paths.raw)
    val_ids = set((paths.tokens / "val_ids.txt").read_text(encoding="utf-8").split("\n"))
    val_docs = [d for d in read_documents(paths.raw, read_json(paths.raw / "manifest.json")) if d.id in val_ids]
    not_run = not_run_reason(meta, tokenizer, init_from)
    problems = [] if not_run else make_problems(val_docs, eval_cfg.infill_docs, seed)
    log.info("infilling: %s", not_run or f"{len(problems)} problems from {eval_cfg.infill_docs} documents")
    with atomic_dir(out_dir / EVAL_TASK_DATA) as tmp:
        write_task_data(val_docs, tmp, seed, eval_cfg.lm_eval.max_docs, tokenizer)

    log.info("13-gram contamination against %d training tokens", len(train))
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    sets = {"val_documents": [encode(d.text) for d in val_docs]}
    if not not_run:
        sets["infill_problems"] = [encode(p.prefix[-2000:] + p.middle + p.suffix[:2000]) for p in problems]
    tasks = current_names(eval_cfg.lm_eval.tasks)
    for task, texts in local_task_texts(out_dir / EVAL_TASK_DATA).items():
        if task in tasks:
            sets[f"lm_eval {task}"] = [encode(t) for t in texts]
    data = EvalData(
        unigram_val_loss=unigram,
        max_batches=eval_cfg.max_batches,
        contamination=contamination.overlaps(train, sets),
        val_documents=len(val_docs),
        infill_problems=tuple(problems),
        infill_not_run=not_run,
        folder=out_dir,
    )
    data.write()  # last: the stage's figures name task data that is already in place
    return data
