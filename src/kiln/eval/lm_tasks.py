"""Local lm-eval tasks built from a run's held-out documents, and the call that runs lm-eval.

The task definitions ship in kiln/eval/tasks/*.yaml; their data files are written per run from the
validation split (which training never sees; the eval_data stage), with the files' folder filled
into the YAML where lm-eval runs (the eval stage), so the
same tasks run offline on any corpus, code or prose; they are named for what they measure:
- kiln_heldout_perplexity: whole held-out documents of the run's own corpus, rolling loglikelihood
  (bits per byte, perplexity);
- kiln_heldout_next_line: context lines -> the next non-blank line, greedy, exact match (the context
  cut at a token boundary of the whole text, see _next_line_example).
They were kiln_code_perplexity and kiln_next_line; a config that still names those gets the new
ones, with a warning (`current_names`).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from kiln.data.sources import Document
from kiln.io import stable_hash

log = logging.getLogger("kiln.eval")
TASKS_DIR = Path(__file__).with_name("tasks")
LOCAL_TASKS = tuple(sorted(p.stem for p in TASKS_DIR.glob("*.yaml")))
RENAMED = {"kiln_code_perplexity": "kiln_heldout_perplexity", "kiln_next_line": "kiln_heldout_next_line"}


def current_names(tasks: Sequence[str]) -> list[str]:
    """eval.lm_eval.tasks with the local tasks' former names replaced by their names now (a warning
    for each), each task once, in the order given."""
    out: list[str] = []
    for task in tasks:
        if task in RENAMED:
            log.warning("eval.lm_eval.tasks: %s is now called %s; running %s", task, RENAMED[task], RENAMED[task])
            task = RENAMED[task]
        if task not in out:
            out.append(task)
    return out


CONTEXT_LINES = 24
# Requests the "kiln" adapter scores (or decodes) together: each a row of up to the model's context
# (kiln.eval.harness; kiln.rehearse.eval_stage rehearses a batch of whole-context rows)
BATCH = 8


def _next_line_example(doc: Document, seed: int, tokenizer: Tokenizer) -> dict | None:
    """Context lines -> the next non-blank line. The context ends where the tokenizer's
    pre-tokenizer starts the piece holding the line's first visible character, not at the newline:
    BPE merges a newline with the indentation after it ("\\n   "), so a context ending in "\\n"
    would end in a lone newline token that training text almost never has there, and every model
    would look worse than it is. BPE never merges across pieces, so the context's tokens are the
    whole text's own."""
    lines = doc.text.splitlines()
    candidates = [i for i, line in enumerate(lines) if line.strip() and i >= 3]
    if not candidates:
        return None
    i = random.Random(stable_hash(seed, "next-line", doc.id)).choice(candidates)
    text = "\n".join(lines[max(0, i - CONTEXT_LINES) : i]) + "\n" + lines[i]
    first_visible = len(text) - len(lines[i].lstrip())
    if tokenizer.pre_tokenizer is not None:
        starts = [start for _, (start, _) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    else:
        starts = [start for start, _ in tokenizer.encode(text, add_special_tokens=False).offsets]
    cut = max(start for start in starts if start <= first_visible)
    return {"id": doc.id, "context": text[:cut], "target": text[cut:]}


def write_task_data(docs: list[Document], out_dir: Path, seed: int, max_docs: int, tokenizer: Tokenizer) -> Path:
    """The local tasks' data files, from up to max_docs of the held-out documents, into out_dir (the
    eval_data stage's: made once, on the CPU). Returns out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = sorted(docs, key=lambda d: stable_hash(seed, "lm-eval", d.id))[:max_docs]
    with open(out_dir / "heldout_documents.jsonl", "w", encoding="utf-8") as f:
        for doc in chosen:
            f.write(json.dumps({"id": doc.id, "text": doc.text}) + "\n")
    with open(out_dir / "next_line.jsonl", "w", encoding="utf-8") as f:
        for doc in chosen:
            if (example := _next_line_example(doc, seed, tokenizer)) is not None:
                f.write(json.dumps(example) + "\n")
    return out_dir


def write_task_configs(data_dir: Path, out_dir: Path) -> Path:
    """The local tasks' YAMLs under out_dir, each naming data_dir's files (written by
    write_task_data) by absolute path, as lm-eval's include_path needs; returns out_dir. Written where
    lm-eval runs, so they name the data where it is now."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in LOCAL_TASKS:
        template = (TASKS_DIR / f"{name}.yaml").read_text(encoding="utf-8")
        (out_dir / f"{name}.yaml").write_text(template.replace("{data_dir}", str(data_dir.resolve())), encoding="utf-8")
    return out_dir


def local_task_texts(data_dir: Path) -> dict[str, list[str]]:
    """The text of every example of each local task written by write_task_data (what the model is
    shown and scored on), for the contamination check."""

    def rows(name: str) -> list[dict]:
        return [json.loads(line) for line in (data_dir / name).read_text(encoding="utf-8").splitlines() if line]

    return {
        "kiln_heldout_perplexity": [r["text"] for r in rows("heldout_documents.jsonl")],
        "kiln_heldout_next_line": [r["context"] + r["target"] for r in rows("next_line.jsonl")],
    }


def run_lm_eval(
    model: str,
    model_args: dict,
    tasks: list[str],
    include_path: Path,
    limit: int | None = None,
    batch_size: int = BATCH,
) -> dict:
    """lm_eval.simple_evaluate on `tasks` (local ones found through include_path); returns
    {task: {metric: value}} with lm-eval's metric names (e.g. 'bits_per_byte,none'). lm-eval's own
    ~15,000 task configs are indexed only when a task is not a local one: that index took 5.9 s a
    call on a 2-core machine, most of the tiny run's eval."""
    import lm_eval
    import lm_eval.models  # noqa: F401  registers lm-eval's own models ("hf", ...)
    from lm_eval.tasks import TaskManager

    import kiln.eval.harness  # noqa: F401  registers the "kiln" model with lm-eval

    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        limit=limit,
        batch_size=batch_size,
        task_manager=TaskManager(include_path=str(include_path), include_defaults=not set(tasks) <= set(LOCAL_TASKS)),
        log_samples=False,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    # lm-eval names metrics "<metric>,<filter>" and adds bookkeeping keys (alias, name, sample_len)
    return {task: {k: v for k, v in metrics.items() if "," in k} for task, metrics in results["results"].items()}
