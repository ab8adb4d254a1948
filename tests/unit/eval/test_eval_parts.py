"""Infilling problems and prompts, edit similarity, 13-gram contamination, perplexity helpers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from kiln.config.train_sections import InitFrom
from kiln.data.fim import MIDDLE, PREFIX, SUFFIX
from kiln.data.sources import Document
from kiln.eval import contamination
from kiln.eval.infill import _prompt, make_problems, not_run_reason
from kiln.eval.lm_tasks import LOCAL_TASKS, current_names
from kiln.eval.metrics.heldout.section import Reference
from kiln.eval.middles import edit_similarity
from kiln.eval.perplexity import bits_per_byte
from kiln.eval.stream import TokenFile

CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))
DOCS = [Document(f"d/{i}", CODE.replace("x", f"v{i}"), f"{i}.py", "d") for i in range(6)]


def test_problems_are_deterministic_and_rebuild_the_document():
    problems = make_problems(DOCS, 4, seed=3)
    assert problems == make_problems(DOCS, 4, seed=3)
    assert problems != make_problems(DOCS, 4, seed=4)
    assert len(problems) == 8 and {p.span for p in problems} == {"single", "multi"}
    by_id = {d.id: d.text for d in DOCS}
    for p in problems:
        assert p.prefix + p.middle + p.suffix == by_id[p.doc_id]
        assert p.middle.strip() and p.prefix and p.suffix
        n_lines = p.middle.count("\n")
        assert n_lines == 1 if p.span == "single" else 2 <= n_lines <= 4


def test_prompt_layouts(tokenizer):
    problem = make_problems(DOCS, 1, seed=0)[0]
    tid = tokenizer.token_to_id
    psm = _prompt(problem, tokenizer, "psm", budget=10_000)
    spm = _prompt(problem, tokenizer, "spm", budget=10_000)
    assert psm[0] == tid(PREFIX) and psm[-1] == tid(MIDDLE) and tid(SUFFIX) in psm
    assert spm[0] == tid(SUFFIX) and spm[-1] == tid(MIDDLE) and tid(PREFIX) in spm
    assert sorted(psm) == sorted(spm)
    decoded = tokenizer.decode(psm, skip_special_tokens=True)
    assert decoded == problem.prefix + problem.suffix


def test_prompt_keeps_the_nearest_context_when_short(tokenizer):
    problem = make_problems(DOCS, 1, seed=0)[0]
    prompt = _prompt(problem, tokenizer, "psm", budget=23)
    assert len(prompt) <= 23
    cut = prompt.index(tokenizer.token_to_id(SUFFIX))
    kept_prefix = tokenizer.decode(prompt[1:cut])
    assert problem.prefix.endswith(kept_prefix) and kept_prefix


def test_edit_similarity():
    assert edit_similarity("return x", "return x") == 1.0
    assert edit_similarity("", "return x") == 0.0
    assert 0 < edit_similarity("return y", "return x") < 1


def test_ngram_hashes_and_overlap(tmp_path):
    train = np.arange(1000) % 97
    train_file = TokenFile(tmp_path / "train.bin", "uint16")
    train.astype(np.uint16).tofile(train_file.path)
    seen, unseen = list(train[100:140]), [1000 + i for i in range(40)]
    result = contamination.overlaps(train_file, {"set": [seen, unseen, [1, 2]]}, chunk=50)["set"]
    assert result["items"] == 3 and result["contaminated_items"] == 1
    assert result["ngram_overlap"] == pytest.approx(28 / 56)


def test_bits_per_byte():
    # ln 2 nats per token, one token per byte: exactly one bit per byte
    assert bits_per_byte(math.log(2), 100, 100) == pytest.approx(1.0)
    assert bits_per_byte(math.log(2), 100, 400) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "figure, shown",
    [({"bits_per_byte": 1.723}, "bits per byte 1.723"), ({"val_loss": 3.28}, "val loss 3.28")],
    ids=["bits_per_byte", "val_loss"],
)
def test_a_reference_is_shown_with_where_and_when_and_never_subtracted(figure, shown):
    """The held-out tables with eval.reference set: the figure, its source, machine and date, and no
    difference from this run's (1.6952 bits per byte against 1.723 once read "0.028 below it"): the
    plain loop that scored 1.723 on one machine scored 1.98 on another (issue 60)."""
    from kiln.eval.metrics.heldout.report import tables
    from kiln.eval.metrics.output import EvalOutput

    where = {
        "source": "tuned plain loop, bench/quality.py",
        "measured_on": "a 2-core VM with AMX",
        "date": "2026-12-06",
    }
    reference = Reference.of(figure | where)
    metrics = {
        "val_loss": 3.5012,
        "unigram_val_loss": 6.2,
        "val_bits_per_byte": 1.6952,
        "unigram_bits_per_byte": 3.1,
        "val_perplexity": 33.15,
        "val_by_source": {},
        "checkpoints": [],
    }
    config = SimpleNamespace(eval=SimpleNamespace(reference=reference))
    lines = tables(EvalOutput(metrics), {"config": config})
    (line,) = [line for line in lines if "eference" in line]
    assert line == (
        f"Reference, measured elsewhere: {shown} (tuned plain loop, bench/quality.py), on a 2-core VM with AMX, "
        "2026-12-06. Not measured in this run, so not compared with its figures."
    )
    # the run's figures, and their gaps to the reference's in any rounding
    pairs = (("val_bits_per_byte", 1.723), ("val_loss", 3.28))
    gaps = {f"{abs(metrics[key] - value):.{d}f}" for key, value in pairs for d in (2, 3, 4)}
    for said in ("below", "above", "3.5012", "1.6952", *gaps):
        assert said not in line, said


def test_infilling_is_skipped_only_for_a_model_that_never_saw_fim(tokenizer):
    meta = {"splits": {"train": {"docs": 10}}, "fim_modes": {"none": 10, "psm": 0, "spm": 0, "middle_only": 0}}
    assert not_run_reason(meta, tokenizer, None).startswith("trained without FIM: none of the 10 train documents")
    with_fim = {**meta, "fim_modes": {"none": 9, "psm": 0, "spm": 1, "middle_only": 0}}
    assert not_run_reason(with_fim, tokenizer, None) is None
    continued = InitFrom.of({"run": "code-base", "optimizer": False})
    assert not_run_reason(meta, tokenizer, continued) is None  # its start may have seen FIM
    assert not_run_reason({"splits": meta["splits"]}, tokenizer, None) is None  # an older token folder cannot say
    plain = Tokenizer(WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    assert not_run_reason(with_fim, plain, None) == "the tokenizer has no FIM tokens"


def test_local_tasks_are_named_for_what_they_measure_and_the_old_names_still_run(caplog):
    assert LOCAL_TASKS == ("kiln_heldout_next_line", "kiln_heldout_perplexity")
    asked = ["kiln_code_perplexity", "hellaswag", "kiln_heldout_perplexity", "kiln_next_line"]
    assert current_names(asked) == ["kiln_heldout_perplexity", "hellaswag", "kiln_heldout_next_line"]
    assert "kiln_code_perplexity is now called kiln_heldout_perplexity" in caplog.text
