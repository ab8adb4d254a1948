"""The eval stage's batches rehearsed (kiln.rehearse.eval_stage): the whole model on one card, fp32
under bf16 autocast, each batch through the function the stage calls, on fake tensors; a phase for
each batch the run's config turns on."""

import contextlib
import json
from pathlib import Path

import pytest

from kiln import config as kiln_config
from kiln import forecast
from kiln.config import settings
from kiln.config.models import model_config
from kiln.config.run_config import RunConfig
from kiln.errors import KilnError
from kiln.eval import code, infill, lm_tasks
from kiln.plan.memory import FIT_FRACTION, GIB
from kiln.plan.peaks import planned_gpu
from kiln.plan.rehearsal import Rehearsal, check
from kiln.rehearse.eval_stage import EOS_ID, eval_phases, stage_batches
from kiln.rehearse.run import as_on_gpu, gpu_flex

ROOT = Path(__file__).resolve().parents[3]
SEED_000 = ROOT / "config" / "experiments" / "swallow-code-llama-1b.yaml"
PROSE = ROOT / "config" / "experiments" / "fineweb-edu-gpt2-124m.yaml"
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the fake group's timeout note


def _run_and_model(files: list[Path], overrides: dict | None = None):
    """The run as the rehearsal resolves it for its GPU, the model the train stage would save, and the
    eval batches its config turns on as the rehearse rule's params carry them."""
    experiment = kiln_config.resolve_experiment(files, overrides or {})
    cfg = experiment.runs[experiment.name]
    run = RunConfig.of(cfg)
    vocab = forecast.model_of(cfg, run).vocab_size
    run = as_on_gpu(run, vocab, planned_gpu(run.plan.gpu))
    batches_on = json.loads(settings.tracked(cfg, "rehearse"))[settings.DERIVED]["eval_batches_on"]
    return run, model_config(run.model.as_dict(), vocab, run.shard.seq_len, EOS_ID), batches_on


def _eval_phases(files: list[Path], overrides: dict | None = None) -> dict:
    run, model, batches_on = _run_and_model(files, overrides)
    usable = int(FIT_FRACTION * planned_gpu(run.plan.gpu).memory_gib * GIB)
    with gpu_flex():
        return {p.name.split(",")[0].removeprefix("eval: "): p for p in eval_phases(run, model, usable, batches_on)}


def _names(files: list[Path], overrides: dict | None = None) -> list[str]:
    """The eval stage's batches a config turns on, by name (nothing run: stage_batches yields the work)."""
    run, model, batches_on = _run_and_model(files, overrides)
    return [name.split(",")[0] for name, _, _ in stage_batches(run, batches_on, model, contextlib.nullcontext)]


def test_seed_000s_eval_stage_holds_the_whole_model_on_one_card_beside_each_batch():
    phases = _eval_phases([SEED_000])
    assert list(phases) == ["held-out loss", "infilling", "lm-eval", "HumanEval and HumanEval-Infilling decode"]
    _, model, _ = _run_and_model([SEED_000])
    weights = (
        model.num_params(non_embedding=False) * 4 / GIB
    )  # 1.04B parameters in fp32, as load_model reads them: 3.88 GiB
    cast = weights / 2  # autocast's bf16 copy of each weight, held while the autocast region lasts
    peak = {name: p.peak / GIB for name, p in phases.items()}
    largest = {name: (p.largest.shape, p.largest.dtype) for name, p in phases.items()}
    # 16 rows of the context through a checkpoint's model loaded beside the final one (the curve)
    assert largest["held-out loss"] == ((16 * 8192, 8192), "bfloat16")  # an MLP's bf16 activation
    # both models and their casts, and the MLP's three bf16 (16 x 8192, 8192) activations at its product
    assert peak["held-out loss"] > 2 * (weights + cast) + 3 * 2
    # 16 FIM prompts and 16 HumanEval prompts, each decode's key (and value) cache of the whole context
    # (layers, batch, key/value heads, slots, head dim) in bf16, 2 GiB
    cache = ((16, 16, 8, 8191, 64), "bfloat16")
    assert largest["infilling"] == cache and largest["HumanEval and HumanEval-Infilling decode"] == cache
    assert peak["HumanEval and HumanEval-Infilling decode"] > weights + cast + 2 * 2
    # lm-eval's own copy of the model beside the final one, 8 whole-context rows' bf16 logits at once (4 GiB)
    assert largest["lm-eval"] == ((8 * 8192, 32768), "bfloat16")
    assert peak["lm-eval"] > 2 * weights + cast + 4
    assert all(p.fits for p in phases.values()) and max(peak.values()) < 30


def test_only_the_batches_a_config_turns_on_are_rehearsed():
    both = "HumanEval and HumanEval-Infilling decode"
    assert _names([SEED_000]) == ["held-out loss", "infilling", "lm-eval", both]
    no_code = {"eval": "{humaneval: {problems: 0}, humaneval_infill: {problems: 0}}"}
    assert _names([SEED_000], no_code) == ["held-out loss", "infilling", "lm-eval"]
    assert _names([SEED_000], {"eval": "{humaneval: {problems: 0}}"})[-1] == "HumanEval-Infilling decode"
    assert _names([SEED_000], {"eval": "{infill_docs: 0, lm_eval: {tasks: []}}"}) == ["held-out loss", both]
    # prose trained without FIM (pretokenize.fim.rate 0): the stage infills nothing, HumanEval still runs
    assert _names([PROSE]) == ["held-out loss", "lm-eval", "HumanEval decode"]
    # from a checkpoint, which may have seen FIM: the stage measures infilling (kiln.eval.infill.not_run_reason)
    continued = {"train": "{init_from: {checkpoint: results/prose/train/checkpoints/step-0000100}}"}
    assert _names([PROSE], continued) == ["held-out loss", "infilling", "lm-eval", both]


@pytest.mark.parametrize(
    "module, batch, phase",
    [(code, "DECODE_BATCH", "HumanEval and HumanEval-Infilling decode"), (infill, "BATCH", "infilling")],
)
def test_a_decode_phase_runs_the_stages_decode_at_the_stages_batch(monkeypatch, module, batch, phase):
    """Twice the stage's batch, read where its decode reads it: a cache of twice the rows at least."""
    before = _eval_phases([TINY])[phase].peak
    monkeypatch.setattr(module, batch, 2 * getattr(module, batch))
    after = _eval_phases([TINY])[phase].peak
    _, model, _ = _run_and_model([TINY])
    row_cache = 2 * model.n_layer * model.n_kv_head * (model.seq_len - 1) * model.head_dim * 4  # keys, values; fp32
    assert after - before >= getattr(module, batch) // 2 * row_cache


def test_lm_evals_phase_scores_the_adapters_batch(monkeypatch):
    before = _eval_phases([TINY])["lm-eval"].peak
    monkeypatch.setattr(lm_tasks, "BATCH", 2 * lm_tasks.BATCH)
    after = _eval_phases([TINY])["lm-eval"].peak
    _, model, _ = _run_and_model([TINY])
    assert after - before >= lm_tasks.BATCH // 2 * model.seq_len * model.vocab_size * 4  # the added rows' logits


def test_an_eval_batch_over_its_card_names_what_turns_it_off_not_a_training_micro_batch():
    run, model, batches_on = _run_and_model([TINY])
    with gpu_flex():
        phases = eval_phases(run, model, 2**20, batches_on)  # 1 MiB: none fits
    turn_off = {
        "held-out loss": r"kiln\.eval\.perplexity\.BATCH",
        "infilling": r"eval\.infill_docs: 0",
        "lm-eval": r"eval\.lm_eval\.tasks: \[\]",
        "HumanEval and HumanEval-Infilling decode": r"eval\.humaneval\.problems: 0 and eval\.humaneval_infill\.problems: 0",
    }
    assert [p.name.split(",")[0].removeprefix("eval: ") for p in phases] == list(turn_off)
    for phase, helps in zip(phases, turn_off.values()):
        rehearsal = Rehearsal(run.run_name, planned_gpu(run.plan.gpu), "1 rank", [phase], advice="train.micro_batch")
        with pytest.raises(KilnError, match=rf"eval: .* will not fit .*{helps}") as raised:
            check(rehearsal)
        assert "train.micro_batch" not in str(raised.value)
