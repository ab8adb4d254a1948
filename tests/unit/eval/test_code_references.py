"""The published HumanEval / HumanEval-Infilling registry: structure only, no network."""

from __future__ import annotations

import dataclasses

import pytest

from kiln.eval.code_references import BENCHMARKS, METRICS, PUBLISHED, SOURCE_KINDS, PublishedScore, for_benchmark


def test_every_entry_is_complete_and_in_range():
    assert PUBLISHED
    for s in PUBLISHED:
        assert isinstance(s, PublishedScore)
        assert s.model and s.protocol and s.source and s.where and s.quote, s
        assert s.url.startswith("https://"), s
        assert s.benchmark in BENCHMARKS, s
        assert s.metric in METRICS, s
        assert s.source_kind in SOURCE_KINDS, s
        assert 0.0 < s.percent <= 100.0, s
        assert s.fraction == pytest.approx(s.percent / 100.0)
        assert 0.0 < s.params_b < 1000.0, s


def test_no_duplicate_rows():
    keys = [(s.model, s.benchmark, s.metric) for s in PUBLISHED]
    assert len(keys) == len(set(keys))


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PUBLISHED[0].percent = 1.0  # type: ignore[misc]


def test_required_sources_are_represented():
    models = {s.model for s in PUBLISHED}
    urls = {s.url for s in PUBLISHED}
    assert any(m.startswith("Codex-") for m in models)
    assert any(m.startswith("SantaCoder") for m in models)
    assert "StarCoderBase-1B" in models
    assert "StarCoder2-3B" in models
    assert "https://arxiv.org/abs/2107.03374" in urls  # Codex
    assert "https://arxiv.org/abs/2207.14255" in urls  # FIM paper
    fim = [s for s in PUBLISHED if s.url == "https://arxiv.org/abs/2207.14255"]
    assert {s.benchmark for s in fim} == set(BENCHMARKS) - {"humaneval"}


def test_codex_small_sizes_have_all_three_k():
    for name in ("Codex-12M", "Codex-85M", "Codex-300M", "Codex-679M"):
        metrics = {s.metric for s in PUBLISHED if s.model == name}
        assert metrics == {"pass@1", "pass@10", "pass@100"}, name


def test_pass_at_k_is_monotone_per_model():
    by_model: dict[str, dict[str, float]] = {}
    for s in for_benchmark("humaneval"):
        by_model.setdefault(s.model, {})[s.metric] = s.percent
    for model, m in by_model.items():
        ks = [m[k] for k in ("pass@1", "pass@10", "pass@100") if k in m]
        assert ks == sorted(ks), model


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_for_benchmark_filters_and_sorts(benchmark):
    rows = for_benchmark(benchmark)
    assert rows
    assert all(s.benchmark == benchmark for s in rows)
    sizes = [s.params_b for s in rows]
    assert sizes == sorted(sizes)
    pass1 = for_benchmark(benchmark, "pass@1")
    assert pass1 and all(s.metric == "pass@1" for s in pass1)


def test_for_benchmark_rejects_unknown_names():
    with pytest.raises(ValueError):
        for_benchmark("mbpp")
    with pytest.raises(ValueError):
        for_benchmark("humaneval", "pass@5")
