"""The eval stage's GPU-side work as rehearsal phases (workflow/scripts/eval.py, kiln.eval.suite).

On a GPU the stage holds the whole model on one card (no process group, no FSDP), in fp32 as
kiln.model.build.load_model reads it, and runs every metric inside train.precision's bf16 autocast
(kiln.train.device.eval_autocast), whose cache keeps a bf16 copy of each weight it has cast until
the region ends or kiln.eval.context.release_cast_weights drops them, where the stage does. Its
batches, each a phase, in the suite's order, those the config turns on
(kiln.config.eval_switches.eval_batches_on decides, from the whole config; the rule's params carry
its answer), each through the function the stage calls with the batch it calls it with, at the longest input it lets in (generate crops a prompt to the context less
the new tokens; the harness cuts a row to the context):

- held-out loss: kiln.eval.perplexity.batches_loss of perplexity.BATCH rows of the context, the
  final model's and then a kept checkpoint's, loaded beside it (the heldout metric's curve: every
  run keeps checkpoints);
- infilling: kiln.eval.infill.write_middles of its BATCH FIM prompts (eval.infill_docs above 0, for
  a run that trains with FIM: pretokenize.fim.rate above 0, or from a checkpoint, which may have);
- lm-eval: the harness adapter's scoring (kiln.eval.harness.KilnLM._score) of kiln.eval.lm_tasks.BATCH
  rolling windows of the whole context, each scored whole (the local perplexity task's), its (B, T, V)
  logits at once, with lm-eval's own copy of the model loaded beside the final one (eval.lm_eval.tasks
  not empty);
- the code evals' decode: kiln.eval.code.decode_batches of DECODE_BATCH prompts, a key/value cache of
  the whole context (HumanEval, or HumanEval-Infilling for a run that trains with FIM, at the larger
  max_new_tokens of those on). Token ids stand in for prompts: the tokenizer is not made yet.

Not rehearsed: eval.prompts' completions (a few prompts in one batch), and lm-eval's generate_until
(kiln_heldout_next_line; it needs the tokenizer: lm_tasks.BATCH prompts through kiln.generate.decode
beside lm-eval's model, by a reading about the lm-eval phase's bytes, not counted).

A decode is stopped when its prefill returns (prefill_only); the held-out loss and lm-eval's scoring
end where they read the device from the host (the loss's and the scores' item()), which a fake
tensor cannot answer: by then every tensor they hold is made.

The model is built fresh on fake tensors (build_model of the train stage's model config, in eval
mode, as load_model builds it, without reading model.safetensors, which no run has yet), not taken
from the Trainer: that one holds this rank's FSDP shards in the train stage's process, and the eval
stage's is every weight on one card in a process of its own. Its own LiveBytes counts it: none of
training's tensors are on that card.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

from kiln.config.eval_switches import HUMANEVAL, HUMANEVAL_INFILL, INFILLING, LM_EVAL
from kiln.config.models import ModelConfig
from kiln.config.run_config import RunConfig
from kiln.eval import code, infill, lm_tasks, perplexity
from kiln.eval.context import release_cast_weights
from kiln.model.build import build_model
from kiln.plan.rehearsal import Phase
from kiln.rehearse.live import counting
from kiln.train.device import autocast, use_bf16

CPU = torch.device("cpu")
EOS_ID, TOKEN = 0, 1  # a stop id, and the id every prompt and row is made of (any id below the vocabulary)
CARD = "a card with more memory (plan.gpu)"
# (phase name, its work on the final model, what helps where it does not fit)
Batch = tuple[str, Callable[[torch.nn.Module], None], str]


def eval_phases(run: RunConfig, model: ModelConfig, usable: int, batches_on: Sequence[str]) -> list[Phase]:
    """The eval stage's phases for `run` (train.precision resolved as on its GPU:
    kiln.rehearse.run.as_on_gpu) and its model's config, one for each of `batches_on` (the run's
    config's kiln.config.eval_switches.eval_batches_on), each peak the card's whole use: the model, its
    cast weights and the batch. Run inside kiln.rehearse.run.gpu_flex (the document mask as a GPU runs it)."""
    cast = autocast(CPU, use_bf16(run.train.precision, CPU))  # eval_autocast's GPU branch
    phases = []
    with counting() as live, cast():
        final = eval_model(model)
        for name, work, advice in stage_batches(run, batches_on, model, cast):
            live.reset_peak()
            work(final)
            phases.append(Phase(f"eval: {name}", live.peak, live.largest, usable, advice=advice))
    return phases


def eval_model(cfg: ModelConfig) -> torch.nn.Module:
    """The model as kiln.model.build.load_model places it, its weights not read (module docstring)."""
    return build_model(cfg).eval()


class Prefilled(Exception):
    """A decode's first forward has returned (prefill_only)."""


def until_read(work: Callable, *args, **kwargs) -> None:
    """`work` run until it reads the device from the host (module docstring), or its prefill is done."""
    with contextlib.suppress(DataDependentOutputException, Prefilled):
        work(*args, **kwargs)


@contextlib.contextmanager
def prefill_only(model: torch.nn.Module):
    """A decode of `model` stopped when its first forward returns: the prefill of the whole batch, with
    the key/value cache made at its full length (kiln.model.kv_cache), is its peak; each token after
    it is one position's forward over the same cache, and 15 of them (the stop check's period) cost a
    fake-tensor rehearsal several CPU seconds for no byte more."""

    def stop(module, args, output):
        raise Prefilled

    hook = model.register_forward_hook(stop)
    try:
        yield
    finally:
        hook.remove()


def prefilled(work: Callable, model: torch.nn.Module, *args, **kwargs) -> None:
    """until_read of a decode `work(model, ...)`, stopped after its prefill (prefill_only)."""
    with prefill_only(model):
        until_read(work, model, *args, **kwargs)


def stage_batches(run: RunConfig, batches_on: Sequence[str], model: ModelConfig, cast) -> Iterator[Batch]:
    """The eval stage's batches named in `batches_on` (kiln.config.eval_switches: those `run`'s config
    turns on; nothing else decides), in the suite's order; `cast`: its autocast. Each drops the cast
    weights where the stage does (release_cast_weights). The code evals' decode is one batch for
    HumanEval and HumanEval-Infilling, at the larger of their max_new_tokens (run.eval) of those on."""
    context = model.seq_len
    longest = [TOKEN] * context  # cropped by each function as the stage's own prompts would be
    stop = frozenset({EOS_ID})

    def held_out(final) -> None:
        rows = torch.full((perplexity.BATCH, context + 1), TOKEN)  # (B, T + 1): inputs and targets
        until_read(perplexity.batches_loss, final, [rows])
        checkpoint = eval_model(model)  # the curve's: loaded while the final model is held
        until_read(perplexity.batches_loss, checkpoint, [rows])
        del checkpoint
        release_cast_weights()

    yield (
        f"held-out loss, {perplexity.BATCH} rows of {context:,}, a checkpoint's model beside",
        held_out,
        f"The held-out loss's batch (kiln.eval.perplexity.BATCH rows of the context): a smaller BATCH, or {CARD}",
    )
    if INFILLING in batches_on:
        yield (
            f"infilling, {infill.BATCH} prompts + {infill.MAX_MIDDLE_TOKENS} new",
            lambda final: prefilled(infill.write_middles, final, [longest] * infill.BATCH, stop),
            f"eval.infill_docs: 0 turns the held-out infilling off; or a smaller kiln.eval.infill.BATCH, or {CARD}",
        )
    if LM_EVAL in batches_on:

        def lm_eval(final) -> None:
            from kiln.rehearse.lm_eval_batch import ModelGiven  # lm-eval's package: only where a run asks for it

            release_cast_weights()  # the final model's, before the harness loads its own copy
            adapter = ModelGiven(eval_model(model), lm_tasks.BATCH, cast)
            # rolling windows: the BOS (here EOS) as context, the whole context scored
            until_read(adapter._score, [([EOS_ID], longest)] * adapter.batch_size)
            del adapter
            release_cast_weights()

        yield (
            f"lm-eval, {lm_tasks.BATCH} rows of {context:,}, its own model beside",
            lm_eval,
            f"eval.lm_eval.tasks: [] turns lm-eval off; or a smaller kiln.eval.lm_tasks.BATCH, or {CARD}",
        )
    code_evals = [
        (name, section.max_new_tokens)
        for key, name, section in (
            (HUMANEVAL, "HumanEval", run.eval.humaneval),
            (HUMANEVAL_INFILL, "HumanEval-Infilling", run.eval.humaneval_infill),
        )
        if key in batches_on
    ]
    if code_evals:
        new = max(wanted for _, wanted in code_evals)  # the prompt cropped to leave them: a cache of the context
        yield (
            f"{' and '.join(name for name, _ in code_evals)} decode, {code.DECODE_BATCH} prompts",
            lambda final: prefilled(
                code.decode_batches, final, [longest] * code.DECODE_BATCH, code.new_tokens(final, new), stop_ids=stop
            ),
            "eval.humaneval.problems: 0 and eval.humaneval_infill.problems: 0 turn the code evals off; or a "
            f"smaller kiln.eval.sizes.DECODE_BATCH, or {CARD}",
        )
