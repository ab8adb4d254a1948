"""kiln.eval.code and the report's Code section: HumanEval and HumanEval-Infilling, every program run
through the sandbox. The scoring (completions -> sandbox outcomes -> pass@k) is checked without a model:
the canonical solutions pass, a wrong completion fails. A real tiny Kiln model scores 0 with an
interval, and the scores are plain JSON."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import typed_section

from kiln.config.models import ModelConfig
from kiln.errors import KilnError
from kiln.eval import code, sandbox, sizes
from kiln.eval.humaneval import GREEDY, load_problems
from kiln.eval.humaneval_infill import single_line_tasks
from kiln.eval.metrics.code.report import code_section
from kiln.model.build import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def problems():
    return load_problems(2)


def test_canonical_solutions_pass_and_a_wrong_completion_fails(problems):
    right = code.score_humaneval(problems, [[p.canonical_solution] for p in problems], GREEDY)
    assert right["pass@1"] == {"value": 1.0, "low": pytest.approx(0.3424, abs=1e-4), "high": 1.0}  # Wilson, 2 of 2
    assert right["reasons"] == {"passed": 2} and right["protocol"] == "greedy, n=1 per task"
    wrong = code.score_humaneval(problems, [["    return None\n"], ["    )(\n"]], GREEDY)
    assert wrong["pass@1"]["value"] == 0.0 and "passed" not in wrong["reasons"]
    assert sum(wrong["reasons"].values()) == 2
    # the infilling path: the canonical middles pass, a middle that does not parse fails
    tasks = single_line_tasks(problems)
    good = code.score_infill(tasks, [t.middle for t in tasks])
    assert good["pass@1"]["value"] == 1.0 and good["exact_match"] == 1.0 and good["reasons"] == {"passed": len(tasks)}
    bad = code.score_infill(tasks, [")(\n"] * len(tasks))
    assert bad["pass@1"]["value"] == 0.0 and bad["exact_match"] == 0.0 and "passed" not in bad["reasons"]


def test_pass_at_k_follows_the_samples_given(problems):
    mixed = code.score_humaneval(problems, [[p.canonical_solution, "    )(\n"] for p in problems], code.samplings(2)[1])
    assert mixed["pass@1"]["value"] == pytest.approx(0.5) and mixed["samples"] == 2
    assert [s.ks for s in code.samplings(0)] == [(1,)]
    assert [(s.temperature, s.ks) for s in code.samplings(20)] == [(0.0, (1,)), (0.2, (1,)), (0.8, (10,))]


def test_a_tiny_model_scores_zero_and_every_program_goes_through_the_sandbox(tokenizer, monkeypatch):
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(family="gpt2", vocab_size=tokenizer.get_vocab_size(), seq_len=64, n_layer=1, n_head=2, d_model=32)
    ).eval()
    cfg = typed_section(
        "eval",
        {
            "humaneval": {"problems": 2, "max_new_tokens": 8},
            "humaneval_infill": {"problems": 1, "modes": ["psm", "spm"], "max_new_tokens": 8, "tasks_per_kind": 2},
        },
    )
    with pytest.raises(KilnError, match=r"eval.humaneval.samples still auto"):
        code.run_code_evals(model, tokenizer, cfg, seed=3)
    cfg = sizes.resolve(cfg, on_gpu=False)
    ran = []
    real = sandbox.run_programs

    def counted(sources, limits, **kwargs):
        ran.extend(sources)
        return real(sources, limits, **kwargs)

    monkeypatch.setattr(sandbox, "run_programs", counted)
    scores, examples = code.run_code_evals(model, tokenizer, cfg, seed=3)
    he, inf = scores["humaneval"], scores["humaneval_infill"]
    assert len(ran) == 2 + 3 * 2 * 2  # each greedy completion, and each kind's 2 middles in both modes
    assert he["problems"] == 2 and he["pass@1"]["value"] == 0.0
    assert 0.0 <= he["pass@1"]["low"] <= he["pass@1"]["high"] <= 1.0
    assert sum(he["reasons"].values()) == 2 and "passed" not in he["reasons"]
    made = {kind: len(build(load_problems(1))) for kind, build in code.KINDS.items()}
    assert list(inf["kinds"]) == ["single_line", "multi_line", "random_span"]  # the default's kinds, each
    assert inf["tasks_per_kind"] == 2
    for kind, modes in inf["kinds"].items():
        assert set(modes) == {"psm", "spm"}
        for row in modes.values():
            assert row["tasks"] == 2 == sum(row["reasons"].values()) and row["made"] == made[kind]
            assert set(row["pass@1"]) == {"value", "low", "high"}
    assert scores["sandbox"] == sandbox.protections()
    assert json.loads(json.dumps(scores)) == scores and json.loads(json.dumps(examples)) == examples
    assert {ex["benchmark"] for ex in examples} >= {"humaneval", "humaneval_infill/random_span/spm"}

    skipped, none = code.run_humaneval_infill(model, tokenizer, cfg.humaneval_infill, "trained without FIM")
    assert skipped == {"not_run": "trained without FIM"} and none == []
    assert code.new_tokens(model, 128) == 32 == he["max_new_tokens"] * 4  # at most half the context
    off = sizes.resolve(
        typed_section("eval", {"humaneval": {"problems": 0}, "humaneval_infill": {"problems": 0}}), False
    )
    scores, examples = code.run_code_evals(model, tokenizer, off, seed=3)
    assert set(scores) == {"humaneval", "humaneval_infill"} and examples == []  # no sandbox probe either
    assert "HumanEval not run: eval.humaneval.problems is 0" in "\n".join(code_section(scores))


def test_where_the_sandbox_has_no_namespaces_the_eval_runs_no_program_and_says_how_to_skip(tokenizer, monkeypatch):
    """Without namespaces the sandbox's fallback leaves the host's files writable (docs/sandbox.md): the
    eval refuses before any program runs, naming the settings that turn the code evals off."""
    fallback = {"filesystem": "the host's, under file permissions only (namespaces unavailable: EPERM)"}
    monkeypatch.setattr(sandbox, "protections", lambda: fallback)
    monkeypatch.setattr(sandbox, "run_programs", lambda *a, **k: pytest.fail("a program ran unconfined"))
    cfg = sizes.resolve(
        typed_section("eval", {"humaneval": {"problems": 1}, "humaneval_infill": {"problems": 0}}), False
    )
    with pytest.raises(KilnError, match=r"cannot confine .*EPERM.*eval.humaneval.problems and eval.humaneval_infill"):
        code.run_code_evals(None, tokenizer, cfg, seed=3)


def infill_row(tasks: int, made: int, interval: dict) -> dict:
    """One kind and mode's scores as run_humaneval_infill writes them, every middle failing."""
    return {
        "tasks": tasks,
        "made": made,
        "pass@1": interval,
        "exact_match": 0.0,
        "edit_similarity": 0.1,
        "reasons": {"failed: NameError": tasks},
    }


def test_the_report_shows_our_scores_beside_the_published_ones():
    interval = {"value": 0.0, "low": 0.0, "high": 0.5}
    scores = {
        "sandbox": {"network": "blocked"},
        "humaneval": {
            "problems": 2,
            "max_new_tokens": 8,
            "pass@1": interval,
            "protocol": "greedy, n=1 per task",
            "reasons": {"failed: SyntaxError": 2},
            "sampled": [],
        },
        "humaneval_infill": {
            "problems": 1,
            "tasks_per_kind": 8,
            "protocol": "greedy, n=1 per task",
            "kinds": {
                kind: {"psm": infill_row(tasks, made, interval)}
                for kind, tasks, made in [("single_line", 7, 7), ("multi_line", 8, 28), ("random_span", 8, 10)]
            },
        },
    }
    text = "\n".join(code_section(scores, [{"benchmark": "humaneval", "task_id": "HumanEval/0", "completion": "x"}]))
    assert (
        "## Code" in text and "| greedy, n=1 per task | pass@1 | 0.0% [0.0%, 50.0%] | failed: SyntaxError x2 |" in text
    )
    assert "first 1 problem(s), at most 8 of each kind (the same ones every run), greedy" in text
    assert "| single_line | psm | 7 | 0.0% [0.0%, 50.0%] | 0.0% | 0.100 | failed: NameError x7 |" in text
    assert "| multi_line | psm | 8 of 28 | 0.0% [0.0%, 50.0%] |" in text
    assert "| random_span | psm | 8 of 10 | 0.0% [0.0%, 50.0%] |" in text
    assert "humaneval-infilling-multi-line:" in text and "humaneval-infilling-random-span:" in text
    assert "scores 0" in text and "Codex-12M's 2.0% pass@1" in text and "100B tokens" in text
    assert "| model | size | pass@1 | pass@10 | pass@100 | source |" in text
    assert (
        "| Codex-12M | 12M | 2.00% | 3.62% | 8.58% | [Table 1" in text and "(https://arxiv.org/abs/2107.03374)" in text
    )
    assert "| StarCoder2-3B | 3B | 31.70% |  |  | [model card" in text
    assert (
        "| FIM paper 6.9B, FIM rate 0.5 (FIM50) | 6.9B | 73.00% |  | [Appendix G, Table 4]" in text
    )  # and exact_match
    assert "| SantaCoder 1.1B | 1.1B |  | 44.00% |" in text  # single-line exact match, not pass@1
    assert "0 solved of 2: the interval's top is what that bounds" in text
    # an eval from before the cap: every task scored, no count of those made; only the kinds that ran
    row = {key: value for key, value in infill_row(3, 3, interval).items() if key != "made"}
    inf = {"problems": 1, "protocol": "greedy, n=1 per task", "kinds": {"single_line": {"psm": row}}}
    before = scores | {"humaneval_infill": inf}
    text = "\n".join(code_section(before))
    assert "first 1 problem(s), greedy" in text and "| single_line | psm | 3 | 0.0% [0.0%, 50.0%] |" in text
    assert "humaneval-infilling-multi-line" not in text
    assert "- network: blocked" in text
    assert code_section(None) == []  # an eval from before the code benchmarks
    skipped = scores | {"humaneval_infill": {"not_run": "trained without FIM"}}
    assert "HumanEval-Infilling not run: trained without FIM" in "\n".join(code_section(skipped))


def test_fim_prompts_use_the_sentinel_ids_and_keep_the_nearest_context(tokenizer, problems):
    task = single_line_tasks(problems)[2]
    whole = code.fim_ids(tokenizer, task, "spm", 10_000)
    text = tokenizer.decode(whole, skip_special_tokens=False)
    assert text == "<fim_suffix>" + task.suffix + "<fim_prefix>" + task.prefix + "<fim_middle>"
    short = code.fim_ids(tokenizer, task, "psm", 40)
    sentinels = [tokenizer.token_to_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")]
    assert len(short) == 40 and [i for i in short if i in sentinels] == sentinels
    prefix, suffix = tokenizer.decode(short, skip_special_tokens=False)[
        len("<fim_prefix>") : -len("<fim_middle>")
    ].split("<fim_suffix>")
    assert task.prefix.endswith(prefix) and task.suffix.startswith(suffix)
