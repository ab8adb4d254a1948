"""Held-out metrics per source and over training: each source's place in val.bin, loss over a token
range in rows like the shards', per-source loss and bits per byte of a model trained on a two-source
mixture, and the curve over the checkpoints a train run kept.

Real data end to end: a raw folder with two sources (predictable code, and letters drawn at random),
pretokenized, sharded, and a tiny model trained on it in-process with checkpoints.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mixture_run import SEED, SEQ_LEN, mixture_run

from kiln.errors import KilnError
from kiln.eval.metrics.heldout.compute import HeldOut, checkpoint_curve, kept_checkpoints, load_checkpoint
from kiln.eval.perplexity import BATCH, range_loss, range_rows, source_ranges
from kiln.io import read_json
from kiln.model.build import load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer_path):
    """raw/, tokens/, shards/ and train/ (checkpoints, final model, summary.json) of a two-source run."""
    return mixture_run(tmp_path_factory.mktemp("mixture-run"), tokenizer_path)


@pytest.fixture(scope="module")
def held_out(run_dir):
    meta = read_json(run_dir / "tokens" / "meta.json")
    return HeldOut.open(run_dir / "shards", run_dir / "tokens", meta, max_batches=100)  # caps nothing here


@pytest.fixture(scope="module")
def final_model(run_dir):
    return load_model(run_dir / "train")


def test_source_ranges_cover_val_bin_exactly_and_sum_to_the_split(run_dir):
    meta = read_json(run_dir / "tokens" / "meta.json")
    val = np.fromfile(run_dir / "tokens" / "val.bin", dtype=meta["dtype"])
    ranges = meta["val_sources"]
    assert list(ranges) == ["code", "noise"]
    at = 0
    for name, r in ranges.items():
        assert r["start"] == at < r["end"]
        at = r["end"]
        assert {k: r[k] for k in ("docs", "tokens", "bytes")} == meta["sources"][name]["val"]
        assert r["tokens"] == r["end"] - r["start"]
        chunk = val[r["start"] : r["end"]]
        assert chunk[-1] == meta["eos_id"] and int((chunk == meta["eos_id"]).sum()) == r["docs"]
    assert at == len(val) == meta["splits"]["val"]["tokens"]
    for key in ("docs", "tokens", "bytes"):
        assert sum(r[key] for r in ranges.values()) == meta["splits"]["val"][key]
    # val_ids.txt lists the documents in val.bin's order: each range holds its own source's documents
    ids = (run_dir / "tokens" / "val_ids.txt").read_text(encoding="utf-8").splitlines()
    n_code = ranges["code"]["docs"]
    assert all(i.startswith("code/") for i in ids[:n_code]) and all(i.startswith("noise/") for i in ids[n_code:])
    assert source_ranges(meta) == ranges
    old_meta = {k: v for k, v in meta.items() if k != "val_sources"}  # a token folder from before val_sources
    assert source_ranges(old_meta) == ranges


def test_range_rows_cut_like_the_shards_and_keep_a_short_tail_within_the_cap():
    tokens = np.arange(100)
    rows = [r.tolist() for r in range_rows(tokens, 10, 60, 17, max_rows=10)]
    assert rows == [list(range(10, 27)), list(range(27, 44)), list(range(44, 60))]  # the tail: 16 tokens
    assert [len(r) for r in range_rows(tokens, 10, 60, 17, max_rows=2)] == [17, 17]  # capped: no tail
    assert [r.tolist() for r in range_rows(tokens, 5, 12, 17, max_rows=4)] == [list(range(5, 12))]  # under a row
    assert list(range_rows(tokens, 5, 6, 17, max_rows=4)) == []  # one token: no target


def test_range_loss_over_the_whole_split_equals_the_shard_rows_loss(held_out, final_model):
    n_rows = len(held_out.rows)
    assert n_rows > 3 * 4
    for max_batches in (1, 3):  # fewer rows than the split has: exactly the shards' first rows
        first = held_out.rows.take(np.arange(4 * max_batches))
        with torch.no_grad():
            _, expected = final_model(first[:, :-1], first[:, 1:])
        got = range_loss(final_model, held_out.tokens, 0, len(held_out.tokens), SEQ_LEN, 4, max_batches)
        assert got[1] == 4 * max_batches * SEQ_LEN
        assert got[0] == pytest.approx(expected.item(), rel=1e-5)
    # uncapped, the range also measures the tokens past the last full row
    _, n = range_loss(final_model, held_out.tokens, 0, len(held_out.tokens), SEQ_LEN, 4, 10_000)
    tail = len(held_out.tokens) - n_rows * (SEQ_LEN + 1)
    assert n == n_rows * SEQ_LEN + max(tail - 1, 0)


def test_loss_and_bits_per_byte_per_source(held_out, final_model):
    by_source = held_out.by_source(final_model, held_out.overall(final_model))
    assert set(by_source) == {"code", "noise"}
    code, noise = by_source["code"], by_source["noise"]
    assert noise["loss"] > code["loss"] + 0.5  # letters at random stay hard; the repeated code is learnt
    for name, m in by_source.items():
        r = held_out.ranges[name]
        assert m["perplexity"] == pytest.approx(math.exp(m["loss"]))
        assert m["bits_per_byte"] == pytest.approx(m["loss"] / math.log(2) * r["tokens"] / r["bytes"])
        assert m["tokens_evaluated"] == r["tokens"] - -(-r["tokens"] // (SEQ_LEN + 1))  # every target, uncapped
    # the token-weighted mean of the sources is the loss over the whole split (up to where rows are cut)
    overall = held_out.overall(final_model)
    mean = sum(m["loss"] * m["tokens_evaluated"] for m in by_source.values()) / sum(
        m["tokens_evaluated"] for m in by_source.values()
    )
    assert mean == pytest.approx(overall["val_loss"], rel=0.02)
    assert min(code["loss"], noise["loss"]) < overall["val_loss"] < max(code["loss"], noise["loss"])
    # bits per byte per source use the source's own tokens/bytes, so they differ from the split's ratio
    split = held_out.split
    assert code["bits_per_byte"] != pytest.approx(code["loss"] / math.log(2) * split["tokens"] / split["bytes"])


def test_per_source_batches_share_max_batches(run_dir, final_model):
    meta = read_json(run_dir / "tokens" / "meta.json")
    capped = HeldOut.open(run_dir / "shards", run_dir / "tokens", meta, max_batches=3)
    by_source = capped.by_source(final_model, capped.overall(final_model))
    assert {m["tokens_evaluated"] for m in by_source.values()} == {2 * BATCH * SEQ_LEN}  # ceil(3 / 2) batches each


def test_checkpoint_curve_has_every_kept_checkpoint_and_the_final_model(run_dir, held_out, final_model):
    kept = kept_checkpoints(run_dir / "train")
    assert [step for step, _ in kept] == [10, 20, 30]
    summary = read_json(run_dir / "train" / "summary.json")
    overall = held_out.overall(final_model)
    final = {
        "step": summary["steps"],
        "tokens": summary["tokens_seen"],
        "val_loss": overall["val_loss"],
        "val_bits_per_byte": overall["val_bits_per_byte"],
        "final": True,
    }
    curve = checkpoint_curve(run_dir / "train", held_out, final)
    assert [e["step"] for e in curve] == [10, 20, 30]  # the checkpoint at step 30 is the final model
    assert [e["final"] for e in curve] == [False, False, True] and curve[-1] is final
    per_step = summary["tokens_seen"] // summary["steps"]
    assert [e["tokens"] for e in curve] == [10 * per_step, 20 * per_step, 30 * per_step]
    assert curve[0]["val_loss"] > curve[-1]["val_loss"]  # training lowered the held-out loss
    assert len({e["val_loss"] for e in curve}) == 3
    for e in curve[:-1]:
        assert set(e["by_source"]) == {"code", "noise"}
        assert e["val_bits_per_byte"] == pytest.approx(
            e["val_loss"] / math.log(2) * held_out.split["tokens"] / held_out.split["bytes"]
        )
    # the last checkpoint holds the final weights: loaded from it, the same loss
    model, at = load_checkpoint(kept[-1][1], run_dir / "train")
    assert at == {"step": 30, "tokens": summary["tokens_seen"]}
    assert held_out.overall(model)["val_loss"] == pytest.approx(overall["val_loss"], rel=1e-6)


def test_checkpoint_curve_without_checkpoints_or_past_latest(run_dir, held_out, tmp_path):
    final = {"step": 30, "tokens": 0, "val_loss": 1.0, "val_bits_per_byte": 1.0, "final": True}
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run_dir / "train" / "model_config.json", bare)
    assert checkpoint_curve(bare, held_out, final) == [final]  # no checkpoints/: the final model alone
    # a folder that is not what its name says (step 20's, copied as step-40) is not one of the run's checkpoints
    shutil.copytree(run_dir / "train" / "checkpoints", bare / "checkpoints")
    shutil.copytree(bare / "checkpoints" / "step-0000020", bare / "checkpoints" / "step-0000040")
    assert [s for s, _ in kept_checkpoints(bare)] == [10, 20, 30]
    # a final model of unknown step (no summary.json) comes last
    unknown = dict(final, step=None)
    assert [e["step"] for e in checkpoint_curve(bare, held_out, unknown)] == [10, 20, 30, None]


def test_eval_of_a_run_trained_without_fim_skips_infilling_and_says_so(run_dir, tokenizer_path, tmp_path):
    """The whole eval stage, and the eval_data stage before it, on the mixture run, whose
    pretokenize.fim.rate is 0: no infilling problem is built or decoded, the metrics and the report
    say why, and the rest is measured as ever."""

    from kiln import config as kiln_config
    from kiln.eval.context import RunPaths
    from kiln.eval.metrics.infill.report import tables as infill_tables
    from kiln.eval.prepared import DataPaths, EvalData, prepare
    from kiln.eval.suite import evaluate

    tiny = {
        k: v
        for k, v in kiln_config.read_yaml(Path(__file__).parents[2] / "configs" / "tiny.yaml").items()
        if k != "eval"
    }
    small = {
        "max_batches": 2,
        "prompts": ["def "],
        "max_new_tokens": 2,
        "infill_docs": 4,
        "lm_eval": {"tasks": [], "max_docs": 2},
    }
    cfg = kiln_config.RunConfig.of(kiln_config.stage_sections("eval", tiny, eval=small)).eval
    data = DataPaths(run_dir / "shards", run_dir / "tokens", run_dir / "raw", tokenizer_path)
    prepare(data, cfg, SEED, None, tmp_path / "eval_data")
    paths = RunPaths(run_dir / "train", run_dir / "shards", run_dir / "tokens", tokenizer_path, tmp_path / "eval_data")
    with pytest.raises(KilnError, match=r"made for eval.max_batches 2, and this eval's is 3"):
        evaluate(paths, cfg.replace(max_batches=3), SEED, tmp_path)
    out = evaluate(paths, cfg, SEED, tmp_path)
    metrics, samples = out.metrics, out.samples
    assert EvalData.read(tmp_path / "eval_data", 2).unigram_val_loss == metrics["unigram_val_loss"]
    assert metrics["infill"] == {
        "not_run": "trained without FIM: none of the "
        f"{read_json(run_dir / 'tokens' / 'meta.json')['splits']['train']['docs']:,} train "
        "documents was FIM-transformed (pretokenize.fim.rate 0)"
    }
    assert samples["infill"] == [] and set(metrics["contamination"]) == {"val_documents"}
    # HumanEval-Infilling follows the same rule; HumanEval itself runs (kiln.eval.code)
    assert metrics["code"]["humaneval_infill"] == metrics["infill"]
    assert metrics["code"]["humaneval"]["problems"] == 4 and "sandbox" in metrics["code"]
    # the report labels each completion with how eval decoded it (the schema's temperature, top-k, top-p)
    assert samples["decoding"] == {"greedy": "greedy", "sampled": "sampled (temperature 0.8, top-k 50, top-p 1)"}
    assert metrics["contamination"]["val_documents"]["items"] > 0 and metrics["unigram_val_loss"] > 0
    assert "not run: trained without FIM" in "\n".join(infill_tables(out, {}))
