"""HumanEval and HumanEval-Infilling task definitions: problems, stop sequences, programs, pass@k, the
infilling tasks (equal to openai/human-eval-infilling's released files) and their FIM prompts."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from kiln.config.data_sections import Fim
from kiln.data.fim import MIDDLE, fim_pieces
from kiln.eval.humaneval import (
    GREEDY,
    PASS_AT_1,
    PASS_AT_10_100,
    STOP_SEQUENCES,
    load_problems,
    pass_at_k,
    program,
    truncate,
    wilson,
)
from kiln.eval.humaneval_infill import (
    INFILL_SAMPLING,
    KILN_FIM_TOKENS,
    FimTokens,
    InfillTask,
    fim_prompt,
    infill_program,
    match_scores,
    multi_line_tasks,
    random_span_tasks,
    single_line_tasks,
    subset,
)

# sha256 over the released files' tasks, in file order, one json.dumps([task_id, prompt,
# canonical_solution, suffix, entry_point, test]) + "\n" per task; computed from data/HumanEval-
# {SingleLine,MultiLine,RandomSpan}Infilling.jsonl.gz of github.com/openai/human-eval-infilling.
RELEASED = {
    "single-line": (1033, "ececd5be7321dcefd817e05fbd389c90d6faf846dc89321b0383f2e9bff4e9e0"),
    "multi-line": (5815, "d74231b0ac0d01e245f2aa5e037c805b8e90638d3faae479ec95c66b2dbaf5c6"),
    "random-span": (1640, "5c31875ecfe2f948307452cbc969138840aa7c9ce22f26e45f88d2ca32c8f6f6"),
}
BUILDERS = {"single-line": single_line_tasks, "multi-line": multi_line_tasks, "random-span": random_span_tasks}
# The multi-line tasks the default run scores (subset: 8 of the first 2 problems' tasks, SUBSET_SEED)
PINNED_MULTI_LINE = [
    *("HumanEval/0/L0_L2", "HumanEval/0/L2_L3", "HumanEval/0/L2_L7", "HumanEval/0/L4_L4"),
    *("HumanEval/1/L0_L9", "HumanEval/1/L1_L16", "HumanEval/1/L6_L13", "HumanEval/1/L10_L14"),
]


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def tasks(problems):
    return {name: build(problems) for name, build in BUILDERS.items()}


def test_the_164_problems_load_in_task_order(problems):
    assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    assert all(p.prompt and p.canonical_solution and p.test and p.entry_point for p in problems)


def test_limit_takes_the_first_problems(problems):
    assert load_problems(5) == problems[:5]
    assert load_problems(0) == []
    with pytest.raises(ValueError):
        load_problems(-1)


@pytest.mark.parametrize("stop", STOP_SEQUENCES)
def test_truncate_cuts_at_each_stop_sequence(stop):
    body = "    return x + 1\n"
    assert truncate(body + stop + " rest\n    more\n") == body
    assert truncate(stop + "x") == ""


def test_truncate_keeps_text_without_a_stop_and_cuts_at_the_earliest():
    assert STOP_SEQUENCES == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    body = "    if x:\n        return 1  # inline\n    return 2\n"  # indented: no stop sequence
    assert truncate(body) == body
    assert truncate("a\nprint(1)\ndef f():\n") == "a"
    assert truncate("") == ""


def test_program_of_each_canonical_solution_compiles(problems):
    for problem in problems:
        source = program(problem, problem.canonical_solution)
        assert source.endswith(f"\ncheck({problem.entry_point})")
        compile(source, problem.task_id, "exec")


def test_sampling_settings_are_the_papers():
    assert (PASS_AT_1.temperature, PASS_AT_1.top_p, PASS_AT_1.samples, PASS_AT_1.ks) == (0.2, 0.95, 200, (1,))
    assert (PASS_AT_10_100.temperature, PASS_AT_10_100.top_p, PASS_AT_10_100.ks) == (0.8, 0.95, (10, 100))
    assert (GREEDY.temperature, GREEDY.samples) == (0.0, 1)
    assert (INFILL_SAMPLING.temperature, INFILL_SAMPLING.top_p, INFILL_SAMPLING.samples) == (0.2, 0.95, 100)


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k([(10, 3)], [1])["pass@1"].value == pytest.approx(0.3)
    # 1 - C(7, 2) / C(10, 2) = 1 - 21/45
    assert pass_at_k([(10, 3)], [2])["pass@2"].value == pytest.approx(1 - 21 / 45)
    assert pass_at_k([(10, 8)], [5])["pass@5"].value == 1.0  # fewer than k failures: always passes
    scores = pass_at_k([(10, 3), (10, 0), (20, 20)], [1, 10])
    assert scores["pass@1"].value == pytest.approx((0.3 + 0.0 + 1.0) / 3)
    assert scores["pass@10"].value == pytest.approx((1.0 + 0.0 + 1.0) / 3)


def test_pass_at_k_reports_only_k_up_to_every_tasks_n():
    assert set(pass_at_k([(200, 5), (200, 0)], [1, 10, 100])) == {"pass@1", "pass@10", "pass@100"}
    assert set(pass_at_k([(200, 5), (5, 0)], [1, 10, 100])) == {"pass@1"}
    assert pass_at_k([(1, 1)], [10]) == {}


def test_pass_at_k_interval_is_wilsons_at_the_effective_number_of_problems():
    # 0/1 outcomes, one task per problem: Wilson's interval for 3 of 10 (the textbook 0.108-0.603)
    score = pass_at_k([(1, 1)] * 3 + [(1, 0)] * 7, [1])["pass@1"]
    assert score.value == pytest.approx(0.3) and (score.low, score.high) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    # nothing solved: not the normal approximation's [0, 0], but what 0 of 164 bounds (3.84 / 167.84)
    none = pass_at_k([(1, 0)] * 164, [1])["pass@1"]
    assert none.low == 0.0 and none.high == pytest.approx(1.959964**2 / (164 + 1.959964**2))
    # fractional per-task estimates: Wilson at v(1-v)/se^2, narrower than a 0/1 benchmark of 4 problems
    per_task = [0.3, 0.5, 0.1, 0.7]
    sampled = pass_at_k([(10, round(10 * p)) for p in per_task], [1])["pass@1"]
    variance = sum((p - 0.4) ** 2 for p in per_task) / 4**2
    assert (sampled.low, sampled.high) == pytest.approx(wilson(0.4, 0.4 * 0.6 / variance))
    assert sampled.high - sampled.low < (lambda lo, hi: hi - lo)(*wilson(0.4, 4))


@pytest.mark.parametrize(
    "results",
    [[(10, 3)] * 5, [(1, 0)] * 163 + [(1, 1)], [(1, 1)] * 10 + [(1, 0)], [(200, c) for c in range(0, 200, 7)]],
)
def test_pass_at_k_interval_holds_the_point_inside_zero_one(results):
    for score in pass_at_k(results, [1, 10]).values():
        assert 0.0 <= score.low <= score.value <= score.high <= 1.0


def test_clustered_interval_counts_problems_not_tasks():
    results = [(10, 3), (10, 5), (10, 1), (10, 7)]
    alone = pass_at_k(results, [1])["pass@1"]
    twice = results + results
    as_tasks = pass_at_k(twice, [1])["pass@1"]
    as_problems = pass_at_k(twice, [1], clusters=["a", "b", "c", "d"] * 2)["pass@1"]
    assert as_problems.value == alone.value
    assert (as_problems.low, as_problems.high) == pytest.approx((alone.low, alone.high))
    assert as_tasks.high - as_tasks.low < alone.high - alone.low  # copies treated as independent: too narrow
    assert pass_at_k(results, [1], clusters=list("abcd")) == pass_at_k(results, [1])
    single = pass_at_k(results, [1], clusters=["x"] * 4)["pass@1"]
    assert (single.low, single.high) == (0.0, 1.0)


def test_pass_at_k_rejects_bad_counts():
    for bad in ([], [(10, 11)], [(10, -1)], [(0, 0)]):
        with pytest.raises(ValueError):
            pass_at_k(bad, [1])
    with pytest.raises(ValueError):
        pass_at_k([(10, 1)], [1], clusters=["a", "b"])


def _digest(tasks: list[InfillTask]) -> str:
    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps([t.task_id, t.prefix, t.middle, t.suffix, t.entry_point, t.test]).encode() + b"\n")
    return h.hexdigest()


@pytest.mark.parametrize("name", list(RELEASED))
def test_infilling_tasks_equal_the_released_files(tasks, name):
    count, digest = RELEASED[name]
    assert len(tasks[name]) == count  # the paper's 1033 / 5815 / 1640 (Section 2.2)
    assert _digest(tasks[name]) == digest
    assert len({t.task_id for t in tasks[name]}) == count


def test_random_spans_are_ten_per_problem(tasks):
    by_problem = {}
    for t in tasks["random-span"]:
        by_problem.setdefault(t.problem_id, []).append((len(t.prefix), len(t.middle)))
    assert len(by_problem) == 164
    assert all(len(spans) == len(set(spans)) == 10 for spans in by_problem.values())


def test_every_task_puts_the_canonical_program_back(problems, tasks):
    source = {p.task_id: p.prompt + p.canonical_solution for p in problems}
    prompt = {p.task_id: p.prompt for p in problems}
    line_zero = {"single-line": 0, "multi-line": 0}
    for name, built in tasks.items():
        for t in built:
            whole = t.prefix + t.middle + t.suffix
            if whole == source[t.problem_id]:
                continue
            # the released quirk: a line span starting at the solution's line 0 has one more "\n"
            assert t.task_id.rsplit("/", 1)[1].startswith("L0") and t.prefix == prompt[t.problem_id] + "\n"
            assert whole == prompt[t.problem_id] + "\n" + source[t.problem_id][len(prompt[t.problem_id]) :]
            line_zero[name] += 1
    assert line_zero == {"single-line": 160, "multi-line": 989}


def test_building_twice_gives_the_same_tasks(problems, tasks):
    for name, build in BUILDERS.items():
        assert build(problems) == tasks[name]
    assert random_span_tasks(problems, seed=7) != tasks["random-span"]
    assert random_span_tasks(problems[:3]) == tasks["random-span"][:30]  # the first problems' spans stay


def test_a_capped_kind_scores_the_same_few_tasks_spread_over_the_problems(problems):
    """eval.humaneval_infill.tasks_per_kind: the default's 8 tasks of each kind from the first 2
    problems, half from each, in task order, the same in every run (pinned below); no cap, or one
    above the count, keeps every task."""
    first = problems[:2]
    for build in BUILDERS.values():
        made = build(first)
        few = subset(made, 8)
        assert few == subset(made, 8) and len(few) == 8
        assert [t for t in made if t in few] == few
        assert Counter(t.problem_id for t in few) == {"HumanEval/0": 4, "HumanEval/1": 4}
        assert subset(made, None) == made == subset(made, len(made)) == subset(made, len(made) + 1)
    assert [t.task_id.split("/", 1)[1] for t in subset(multi_line_tasks(first), 8)] == PINNED_MULTI_LINE
    assert subset(multi_line_tasks(first), 8, seed=1) != subset(multi_line_tasks(first), 8)
    # a problem with fewer tasks than its share gives them all, and the others make up the count
    lines = single_line_tasks(first)
    short = sum(t.problem_id == "HumanEval/0" for t in lines)
    assert Counter(t.problem_id for t in subset(lines, short + 9)) == {"HumanEval/0": short, "HumanEval/1": 9}
    # three problems share 7 as 3, 2 and 2, the first problems taking the extra one
    assert Counter(t.problem_id for t in subset(random_span_tasks(problems[:3]), 7)) == {
        "HumanEval/0": 3,
        "HumanEval/1": 2,
        "HumanEval/2": 2,
    }


def test_infill_program_with_the_canonical_middle_compiles(tasks):
    for t in [t for built in tasks.values() for t in built]:
        source = infill_program(t, t.middle)
        assert source.startswith(t.prefix + t.middle + t.suffix + "\n")
        assert source.endswith(f"\ncheck({t.entry_point})")
        compile(source, t.task_id, "exec")


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_fim_prompt_lays_out_sentinels_as_kiln_trains(mode, problems):
    """The prompt is the training layout of the same document cut at the same places, up to and
    including the middle sentinel (the model writes the middle next)."""
    text = problems[0].prompt + problems[0].canonical_solution
    always = Fim(rate=1.0, psm=float(mode == "psm"), spm=float(mode == "spm"), middle_only=0.0, min_chars=0)
    checked = 0
    for i in range(20):
        drawn, pieces = fim_pieces(len(text), 0, f"doc{i}", always)
        if drawn != mode or len(pieces) != 6:  # an empty part drops its span: skip those draws
            continue
        lo, hi = pieces[-1]  # the middle comes last
        task = InfillTask("t", "HumanEval/0", text[:lo], text[lo:hi], text[hi:], "f", "")
        trained = [p if isinstance(p, str) else text[p[0] : p[1]] for p in pieces]
        trained = trained[: trained.index(MIDDLE) + 1]
        layout = fim_prompt(task, mode, KILN_FIM_TOKENS)
        assert [piece for pair in layout for piece in pair if piece] == trained
        checked += 1
    assert checked >= 5


def test_fim_prompt_uses_the_given_sentinels():
    task = InfillTask("t", "HumanEval/0", "P", "M", "S", "f", "")
    tokens = FimTokens(prefix="<PRE>", middle="<MID>", suffix="<SUF>")
    assert fim_prompt(task, "psm", tokens) == [("<PRE>", "P"), ("<SUF>", "S"), ("<MID>", "")]
    assert fim_prompt(task, "spm", tokens) == [("<SUF>", "S"), ("<PRE>", "P"), ("<MID>", "")]
    with pytest.raises(ValueError):
        fim_prompt(task, "middle_only", tokens)


def test_match_scores_are_kilns_infill_metrics():
    task = InfillTask("t", "HumanEval/0", "", "    return x\n", "", "f", "")
    assert match_scores(task, "    return x  \n\n") == {"exact_match": True, "edit_similarity": 1.0}
    miss = match_scores(task, "    return y\n")
    assert miss["exact_match"] is False and 0.5 < miss["edit_similarity"] < 1.0
