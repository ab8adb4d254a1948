"""kiln rehearse (kiln.rehearse): seed 000's flagship run at its real shapes (1B Llama, 6 x 8,192-token
rows, 4 FSDP ranks, document mask through flex) on fake tensors under a fake process group, through
the train stage's Trainer and the smoke gate's own validation."""

import functools
from pathlib import Path

import pytest

from kiln import config as kiln_config
from kiln import forecast
from kiln.config import settings
from kiln.config.run_config import RunConfig
from kiln.errors import KilnError
from kiln.main import main
from kiln.model import documents
from kiln.plan.peaks import planned_gpu
from kiln.plan.rehearsal import Rehearsal, check
from kiln.rehearse.run import rehearse

SEED_000 = Path(__file__).resolve().parents[3] / "config" / "experiments" / "swallow-code-llama-1b.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # flex's eager-path and the fake group's timeout notes


def _rehearse(overrides: dict | None = None):
    experiment = kiln_config.resolve_experiment([SEED_000], overrides or {})
    cfg = experiment.runs[experiment.name]
    run = RunConfig.of(cfg)
    batches_on = settings.derived(cfg, "rehearse")["eval_batches_on"]
    return rehearse(run, forecast.model_of(cfg, run).vocab_size, planned_gpu(run.plan.gpu), batches_on)


@functools.cache
def _seed_000() -> Rehearsal:
    """Seed 000 as it ships, rehearsed once for the tests that read it (seconds of CPU each time)."""
    return _rehearse()


def test_seed_000_rehearses_on_a_cpu_and_the_smoke_gates_validation_fits(capsys, tmp_path):
    assert main(["rehearse", "--configfile", str(SEED_000)]) == 0
    printed = capsys.readouterr().out
    assert "4 ranks, fsdp on H100" in printed and "smoke gate: eager validation" in printed
    assert "checkpoint save (sharded, DCP)" in printed and "resume load (sharded, DCP)" in printed
    rehearsal = _seed_000()
    assert rehearsal.problems == []  # every parameter sharded, every AdamW moment its shard's shape
    gate = rehearsal.phase("smoke gate")
    assert gate.fits and gate.largest.shape == (8192, 32768)  # a loss chunk's logits, not attention scores
    build = rehearsal.phase("build")
    # the fp32 model built whole on the device (1.04B parameters, 3.88 GiB), then sharded block by block:
    # less than the whole model and this rank's shards of it (0.97 GiB) at once
    assert 3.88 < build.peak / 2**30 < 3.88 + 0.97
    # eval.in_loop's decode (Trainer.sample) of 16 prompts of the whole context: its key cache (or its
    # value cache), (layers, batch, key/value heads, slots, head dim) in bf16, is its largest tensor
    decode = rehearsal.phase("in-loop decode")
    assert decode.fits and decode.largest.shape == (16, 16, 8, 8191, 64) and decode.largest.dtype == "bfloat16"
    # a sharded checkpoint (DCP): the save gathers nothing, its bytes go to the host (rank 0's quarter of
    # the weights and of AdamW's two moments, 2.91 GiB, live); the resume makes the optimizer's state
    # anew as a resuming job does, beside zero gradients: four quarters of the fp32 model (3.88 GiB)
    save, load = rehearsal.phase("checkpoint save (sharded, DCP)"), rehearsal.phase("resume load (sharded, DCP)")
    assert save.largest is None and 2.91 < save.peak / 2**30 < 3.1
    assert 3.88 < load.peak / 2**30 < 3.89 and load.fits
    rehearsal.save(tmp_path / "rehearsal.json")  # what the rehearse stage writes and `kiln plan` reads
    assert Rehearsal.load(tmp_path / "rehearsal.json") == rehearsal


def test_flex_run_eagerly_in_the_smoke_gates_validation_is_named_as_not_fitting(monkeypatch):
    """The defect of main fbcf5de put back: the smoke gate validates under a force_eager stance, which
    turned flex's compile off; flex's eager path materialises (6, 32, 8192, 8192) fp32 scores."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(documents, "compiled_flex", lambda: torch.compile(flex_attention))
    rehearsal = _rehearse()
    gate = rehearsal.phase("smoke gate")
    assert not gate.fits and gate.largest.shape == (6, 32, 8192, 8192)
    with pytest.raises(KilnError, match=r"smoke gate: eager validation will not fit on H100.*\(6, 32, 8192, 8192\)"):
        check(rehearsal)


def test_seed_000_on_two_nodes_rehearses_as_hsdp_at_the_micro_batch_that_keeps_its_batch():
    rehearsal = _rehearse({"train": "{nnodes: 2, micro_batch: 3}"})
    # problems: every rank's DCP save plan too, each node's ranks writing every shard once
    assert rehearsal.layout == "8 ranks, fsdp (HSDP 2 x 4)" and rehearsal.problems == []
    assert rehearsal.phase("resume load (sharded, DCP)").fits
    check(rehearsal)


def test_a_compiled_train_step_is_judged_by_its_eager_count_less_what_compiling_saves():
    """The compiled step runs eagerly here; it is judged by the eager count less kiln.plan.memory's
    eager-to-compiled difference at the step (36 GiB at seed 000's 6 x 8,192 a rank, the difference
    the calibration checked on the H200). Twice the micro-batch, with the batch twice too, does not fit."""
    step = _seed_000().phase("train step")
    assert step.peak > 72 * 2**30 > step.compiled > 50 * 2**30 and step.fits
    doubled = _rehearse({"train": "{micro_batch: 12, batch_tokens: 393216}"})
    assert not doubled.phase("train step").fits
    with pytest.raises(KilnError, match=r"train step: forward, backward, optimizer will not fit on H100: 10\d\.\d GiB"):
        check(doubled)
