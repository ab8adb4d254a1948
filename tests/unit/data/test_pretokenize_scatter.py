"""The pretokenize stage as one pretokenize_part job per raw part and a gather: the same bytes as the
one job, whatever the sources, budget, mixture, repository grouping or validation rounds; a part
made under another plan is refused. (The workflow runs it this way: tests/dag/test_pipeline.py and the
Slurm test run the jobs themselves.)"""

from __future__ import annotations

import logging

import pytest
from conftest import download_cfg, write_jsonl
from test_pretokenize import CFG, SEED

from kiln.config.data_sections import PretokenizeSection
from kiln.data import token_plan
from kiln.data.pretokenize import pretokenize, pretokenize_part
from kiln.data.raw import write_raw
from kiln.data.token_plan import plan
from kiln.errors import KilnError

OUTPUTS = ("train.bin", "val.bin", "val_ids.txt", "meta.json")


def one_job(raw, tokenizer_path, out, cfg, seed=SEED):
    out.mkdir(parents=True)
    pretokenize(raw, tokenizer_path, out, seed, PretokenizeSection.of(cfg))
    return {name: (out / name).read_bytes() for name in OUTPUTS}


def encode_parts(raw, tokenizer_path, folder, cfg, seed=SEED) -> list:
    """What the pretokenize_part jobs leave: one folder per raw part."""
    n_parts = len(plan(raw, tokenizer_path, seed, PretokenizeSection.of(cfg)).parts)
    dirs = []
    for index in range(n_parts):
        dirs.append(folder / f"part-{index:05d}")
        dirs[-1].mkdir(parents=True)
        pretokenize_part(raw, tokenizer_path, index, dirs[-1], seed, PretokenizeSection.of(cfg))
    return dirs


def scattered(raw, tokenizer_path, out, cfg, seed=SEED):
    parts = encode_parts(raw, tokenizer_path, out.parent / f"{out.name}.parts", cfg, seed)
    out.mkdir(parents=True)
    pretokenize(raw, tokenizer_path, out, seed, PretokenizeSection.of(cfg), part_dirs=parts)
    return {name: (out / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """Two jsonl sources of small documents, 40 rows a part: 16 parts."""
    base = tmp_path_factory.mktemp("scatter-mix")
    a = write_jsonl(
        base / "a.jsonl", [{"text": f"def alpha_{i}(x):\n    return x * {i} + {i % 7}\n" * 3} for i in range(300)]
    )
    b = write_jsonl(base / "b.jsonl", [{"text": f"Beta number {i} is prose, sentence {i % 11}.\n"} for i in range(300)])
    sources = [{"name": n, "kind": "local", "paths": [str(p)], "text_column": "text"} for n, p in (("a", a), ("b", b))]
    write_raw(download_cfg(sources, rows_per_part=40, near_dup={"enabled": False}), base / "raw")
    return base / "raw"


def test_the_scatter_writes_the_bytes_of_one_job(raw_dir, tokenizer_path, tmp_path):
    assert len(plan(raw_dir, tokenizer_path, SEED, PretokenizeSection.of(CFG)).parts) > 2
    assert scattered(raw_dir, tokenizer_path, tmp_path / "scatter", CFG) == one_job(
        raw_dir, tokenizer_path, tmp_path / "one", CFG
    )


@pytest.mark.parametrize(
    "change",
    [
        {"val_tokens": 400, "train_tokens": 6000, "mixture": {"a": 3, "b": 1}},  # budgets cut inside parts
        {"val_tokens": 400, "train_tokens": 3000, "mixture": {"a": 1}},  # a source left out
        {"val_tokens": 900},  # no budget: every part whole
    ],
    ids=["budget-and-mixture", "one-source", "no-budget"],
)
def test_budgets_and_mixtures_cut_the_gathered_parts_where_one_job_cuts(two_sources, tokenizer_path, tmp_path, change):
    cfg = dict(CFG, **change)
    assert scattered(two_sources, tokenizer_path, tmp_path / "scatter", cfg) == one_job(
        two_sources, tokenizer_path, tmp_path / "one", cfg
    )
    encoded = {p.parent.name: p.stat().st_size for p in (tmp_path / "scatter.parts").glob("*/train.bin")}
    assert len(encoded) == 16
    # The part jobs encoded the train side of exactly the parts the plan expected the budget to reach:
    # all 16 without a budget, fewer under one (b's 8 parts none when the mixture leaves b out)
    reached = plan(two_sources, tokenizer_path, SEED, PretokenizeSection.of(cfg)).train_parts
    assert {name for name, size in encoded.items() if size} == {f"part-{i:05d}" for i in reached}
    if "train_tokens" not in change:
        assert len(reached) == 16
    else:  # of the parts of the sources with a weight (8 each), fewer than all
        assert len(reached) < 8 * len(cfg["mixture"])


def test_parts_the_plan_expected_the_budget_not_to_reach_are_encoded_by_the_gather(
    two_sources, tokenizer_path, tmp_path, monkeypatch, caplog
):
    """An estimate that falls short (a low margin): the part jobs leave most train sides unencoded, the
    gather encodes those the budget reaches, and the bytes are one job's."""
    monkeypatch.setattr(token_plan, "TRAIN_MARGIN", 0.05)
    cfg = dict(CFG, val_tokens=400, train_tokens=6000, mixture={"a": 3, "b": 1})
    assert (
        len(plan(two_sources, tokenizer_path, SEED, PretokenizeSection.of(cfg)).train_parts) == 2
    )  # a's and b's first
    with caplog.at_level(logging.INFO, logger="kiln.pretokenize"):
        gathered = scattered(two_sources, tokenizer_path, tmp_path / "scatter", cfg)
    assert "past the plan's estimate of the budget's reach, encoded here" in caplog.text
    assert gathered == one_job(two_sources, tokenizer_path, tmp_path / "one", cfg)


def test_validation_rounds_the_parts_fell_short_of_run_in_the_gather(
    two_sources, tokenizer_path, tmp_path, monkeypatch, caplog
):
    """A first round that finds too few validation tokens (a low margin): the gather raises the rate
    and encodes the next rounds itself, and picks the samples one job picks."""
    monkeypatch.setattr(token_plan, "VAL_MARGIN", 0.05)
    cfg = dict(CFG, val_tokens=2000)
    with caplog.at_level(logging.INFO, logger="kiln.pretokenize"):
        gathered = scattered(two_sources, tokenizer_path, tmp_path / "scatter", cfg)
    assert "raising it" in caplog.text
    assert gathered == one_job(two_sources, tokenizer_path, tmp_path / "one", cfg)


def test_repositories_stay_whole_across_the_scatter(tmp_path, tokenizer_path):
    rows = [
        {"text": f"# file {r}.{i}\n" + f"value = compute(x, {r})\n" * 8, "path": f"pkg/m{i}.py", "repo": f"org/r{r}"}
        for r in range(40)
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "code.jsonl", rows)
    spec = {"name": "code", "kind": "local", "paths": [str(path)], "text_column": "text"}
    spec |= {"path_column": "path", "repo_column": "repo"}
    write_raw(download_cfg([spec], rows_per_part=9, dedup=False, near_dup={"enabled": False}), tmp_path / "raw")
    cfg = dict(CFG, val_tokens=300, repo_context=True, fim=dict(CFG["fim"], rate=1.0, min_chars=0))
    assert scattered(tmp_path / "raw", tokenizer_path, tmp_path / "scatter", cfg) == one_job(
        tmp_path / "raw", tokenizer_path, tmp_path / "one", cfg
    )


def test_a_part_encoded_under_another_plan_is_refused(two_sources, tokenizer_path, tmp_path):
    parts = encode_parts(two_sources, tokenizer_path, tmp_path / "parts", CFG, seed=SEED + 1)
    (tmp_path / "out").mkdir()
    with pytest.raises(KilnError, match=r"part-00000 was encoded under another plan \(seed differ"):
        pretokenize(two_sources, tokenizer_path, tmp_path / "out", SEED, PretokenizeSection.of(CFG), part_dirs=parts)
    with pytest.raises(KilnError, match=r"16 encoded parts given for 15 raw parts|15 encoded parts given for 16"):
        pretokenize(
            two_sources, tokenizer_path, tmp_path / "out", SEED + 1, PretokenizeSection.of(CFG), part_dirs=parts[:-1]
        )
    with pytest.raises(KilnError, match=r"part 99 asked for; .* has parts 0 to 15"):
        pretokenize_part(two_sources, tokenizer_path, 99, tmp_path / "x", SEED, PretokenizeSection.of(CFG))
