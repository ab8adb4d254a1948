"""Everything the eval stage measures on a trained model, in one call.

- held-out loss, perplexity and bits per byte, next to a unigram model of the same data;
- completions of fixed prompts (greedy and sampled);
- FIM infilling (single/multi-line, PSM/SPM): exact match and edit similarity;
- lm-eval tasks through the "kiln" model (local ones built from the held-out split);
- 13-gram contamination of each eval set against the training tokens.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kiln.data.loader import ShardRows
from kiln.data.sources import read_documents
from kiln.data.tokenizer import EOS, load_tokenizer
from kiln.eval import contamination
from kiln.eval.generate import generate
from kiln.eval.infill import make_problems, run_infill
from kiln.eval.lm_tasks import LOCAL_TASKS, run_lm_eval, write_local_tasks
from kiln.eval.perplexity import bits_per_byte, unigram_loss, val_rows_loss
from kiln.io import read_json
from kiln.model.build import load_model

log = logging.getLogger("kiln.eval")
BATCH = 16


@dataclass(frozen=True)
class RunPaths:
    model: Path  # train stage folder (model_config.json, model.safetensors)
    shards: Path
    tokens: Path
    raw: Path
    tokenizer: Path


def completions(model, tokenizer, cfg: dict, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    eos = frozenset({tokenizer.token_to_id(EOS)})
    out = []
    for prompt in cfg["prompts"]:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        row = {"prompt": prompt}
        for name, temperature in (("greedy", 0.0), ("sampled", cfg["temperature"])):
            new = generate(model, ids, cfg["max_new_tokens"], temperature=temperature, top_k=cfg["top_k"],
                           stop_ids=eos, vocab_size=tokenizer.get_vocab_size(), generator=generator)
            row[name] = tokenizer.decode(new, skip_special_tokens=False)
        out.append(row)
    return out


def _lm_eval(paths: RunPaths, cfg: dict, val_docs, tasks_dir: Path, seed: int) -> dict:
    """lm-eval results by task; tasks that cannot be loaded (a hub task offline) are reported, not fatal."""
    write_local_tasks(val_docs, tasks_dir, seed, cfg["max_docs"])
    model_args = {"pretrained": str(paths.model), "tokenizer": str(paths.tokenizer)}
    results = {}
    for task in cfg["tasks"]:
        try:
            results.update(run_lm_eval("kiln", model_args, [task], tasks_dir, limit=cfg["limit"]))
        except Exception as exc:  # lm-eval raises many kinds for a task it cannot fetch or build
            if task in LOCAL_TASKS:
                raise
            log.warning("lm-eval task %s unavailable: %s", task, exc)
            results[task] = {"unavailable": str(exc)[:300]}
    return results


def evaluate(paths: RunPaths, cfg: dict, seed: int, work_dir: Path) -> tuple[dict, dict]:
    """(metrics, samples) for the run; lm-eval's task files go under work_dir."""
    torch.manual_seed(seed)
    model, tokenizer = load_model(paths.model), load_tokenizer(paths.tokenizer)
    meta = read_json(paths.tokens / "meta.json")
    val_rows = ShardRows(paths.shards, "val")
    log.info("held-out loss on up to %d batches", cfg["max_batches"])
    loss, n_tokens = val_rows_loss(model, val_rows, BATCH, cfg["max_batches"])
    train_ids = np.memmap(paths.tokens / "train.bin", dtype=meta["dtype"], mode="r")
    unigram = unigram_loss(train_ids, val_rows, meta["padded_vocab_size"], BATCH, cfg["max_batches"])
    val = meta["splits"]["val"]
    val_ids = set((paths.tokens / "val_ids.txt").read_text(encoding="utf-8").split("\n"))
    val_docs = [d for d in read_documents(paths.raw, read_json(paths.raw / "manifest.json")) if d.id in val_ids]

    log.info("infilling on %d held-out documents", cfg["infill_docs"])
    problems = make_problems(val_docs, cfg["infill_docs"], seed)
    infill = run_infill(model, tokenizer, problems)
    log.info("lm-eval tasks: %s", ", ".join(cfg["lm_eval"]["tasks"]))
    harness = _lm_eval(paths, cfg["lm_eval"], val_docs, work_dir / "lm_eval_tasks", seed)

    log.info("13-gram contamination against %d training tokens", len(train_ids))
    index = contamination.train_index(train_ids)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    contaminated = {
        "val_documents": contamination.overlap(index, [encode(d.text) for d in val_docs]),
        "infill_problems": contamination.overlap(index, [encode(p.prefix[-2000:] + p.middle + p.suffix[:2000])
                                                         for p in problems]),
    }
    metrics = {
        "val_loss": loss, "val_perplexity": math.exp(loss),
        "val_bits_per_byte": bits_per_byte(loss, val["tokens"], val["bytes"]),
        "val_tokens_evaluated": n_tokens,
        "unigram_val_loss": unigram,
        "unigram_bits_per_byte": bits_per_byte(unigram, val["tokens"], val["bytes"]),
        "infill": infill["scores"],
        "lm_eval": harness,
        "contamination": contaminated,
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    samples = {"completions": completions(model, tokenizer, cfg, seed), "infill": infill["examples"]}
    return metrics, samples
