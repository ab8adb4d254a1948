"""config/experiments/continue-smollm2-135m.yaml run as README runs it (`snakemake --configfile`),
on a stand-in for the checkpoint made offline: a small random transformers Llama with a tokenizer
trained by `tokenizers`, saved where the config looks for it, no FIM tokens of its own (as SmolLM2).
Overrides shrink the data, context and steps only; tokenizer kind, source and the model's shape are
the config's."""

from __future__ import annotations

import json
import math
import sysconfig

import numpy as np
from hf_folder import write_hf_folder
from safetensors import safe_open
from tiny import ROOT, snakemake

from kiln import config as kiln_config
from kiln import hf
from kiln.config.special_tokens import FIM_ROLES
from kiln.data.tokenizer import EOS, id_space
from kiln.data.tokenizer_build import hf_tokenizer
from kiln.io import read_json, sha256_file

CONFIG = ROOT / "config" / "experiments" / "continue-smollm2-135m.yaml"
SOURCE = "sources/SmolLM2-135M"
FAST = [
    "download={sources: [{name: stdlib, kind: stdlib, include: ['json/*.py', 'email/*.py', 'collections/*.py']}],"
    " rows_per_part: 20}",
    "tokenizer={heldout_docs: 5}",
    "pretokenize={val_tokens: 20000}",
    "shard={seq_len: 64, rows_per_shard: 2000}",
    "smoke={steps: 12, min_loss_drop: 0.1}",
    "train={micro_batch: 16, batch_tokens: 1024, max_steps: 20, warmup_steps: 2, lr: 0.003, precision: fp32,"
    " log_every: 10, eval_every: 10, eval_batches: 4, samples: {prompts: ['import json\\n'], max_new_tokens: 8}}",
    "eval={max_batches: 10, infill_docs: 0, max_new_tokens: 8, lm_eval: {tasks: []}, humaneval: {problems: 0},"
    " humaneval_infill: {problems: 0}}",
    "wandb={mode: disabled}",
]


def test_the_config_takes_tokenizer_and_weights_from_one_folder():
    written = kiln_config.read_yaml(CONFIG)
    assert written["tokenizer"]["kind"] == "hf" and written["tokenizer"]["path"] == SOURCE
    assert written["train"]["init_from"] == {"hf": SOURCE}
    assert "model" not in written  # the checkpoint's config.json is the shape


def test_continuing_a_stock_checkpoint_on_its_own_tokenizer(tmp_path):
    source = write_hf_folder(tmp_path / SOURCE, eos="<|endoftext|>")
    result = snakemake(tmp_path, "--configfile", str(CONFIG), "--config", *FAST, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = tmp_path / "results"
    (stats_path,) = results.glob("data/tokenizer-*/stats.json")
    stats = read_json(stats_path)
    n = json.loads((source / "config.json").read_text())["vocab_size"]
    # The source's end of text at its id; the FIM roles the run uses appended after its ids (it has none),
    # and no repository roles: the run has no repository context.
    assert stats["special_tokens"][EOS] == "<|endoftext|>" and stats["special_token_ids"][EOS] == 1
    assert stats["added_tokens"] == list(FIM_ROLES) and list(stats["special_tokens"]) == [EOS, *FIM_ROLES]
    assert stats["vocab_size"] == n + 4
    (manifest,) = results.glob("data/shards-*/manifest.json")
    assert read_json(manifest)["source_tokenizer_sha256"] == sha256_file(source / "tokenizer.json")
    run = results / "smollm2-135m-stdlib"
    log = "".join(p.read_text() for p in run.glob("**/train*.log"))
    assert f"has {n} rows, this run {stats['padded_vocab_size']}: rows {n}.. start at the mean row" in log
    metrics = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 0 and "val_loss" in metrics[0]  # the source's own held-out loss
    assert metrics[-1]["step"] == 20
    report = (run / "report.md").read_text()
    assert "appended: " + ", ".join(f"`{t}`" for t in FIM_ROLES) + ")" in report
    assert "| initial weights | hf " in report
    # The export keeps the source's rows and the appended ones, not Kiln's padding.
    assert read_json(run / "train" / "hf" / "config.json")["vocab_size"] == n + 4 < stats["padded_vocab_size"]
    assert f"| source | 0 | {metrics[0]['val_loss']:.4f} | {metrics[0]['val_bpb']:.4f} |" in report
    last = [r for r in metrics if "val_loss" in r][-1]
    assert f"| continued | {last['step']} | {last['val_loss']:.4f} |" in report


def test_a_continuation_with_fim_off_is_a_drop_in_replacement_for_its_source(tmp_path):
    """The issue's case: a transformers-built Llama (its own BPE, untied head, GQA, rows not a multiple of
    64) continued with FIM off and no repository context hands back its source's tokenizer.json byte for
    byte and exactly its vocab_size rows, embedding and head; the report names nothing appended, and the
    export loads back as a model of those rows (what a continuation of it starts from)."""
    source = write_hf_folder(tmp_path / SOURCE, eos="<|endoftext|>", vocab_size=300, tie=False)  # 300 rows, padded 320
    fim_off = "pretokenize={val_tokens: 20000, fim: {rate: 0}}"
    overrides = [o for o in FAST if not o.startswith("pretokenize=")] + [fim_off]
    result = snakemake(tmp_path, "--configfile", str(CONFIG), "--config", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = tmp_path / "results"
    n = read_json(source / "config.json")["vocab_size"]
    (stats_path,) = results.glob("data/tokenizer-*/stats.json")
    stats = read_json(stats_path)
    assert stats["added_tokens"] == [] and stats["special_tokens"] == {EOS: "<|endoftext|>"}
    assert stats["vocab_size"] == n < stats["padded_vocab_size"]  # Kiln trained at padded rows
    assert stats_path.with_name("tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    run = results / "smollm2-135m-stdlib"
    export = run / "train" / "hf"
    assert (export / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    config = read_json(export / "config.json")
    assert config["vocab_size"] == n and config["tie_word_embeddings"] is False
    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_shape()[0] for k in ("model.embed_tokens.weight", "lm_head.weight")} == {n}
    assert hf.load(export).config.vocab_size == n
    # Continuing the export the same way again: its tokenizer, read as a source, needs nothing appended.
    again, roles = hf_tokenizer(export, [EOS])
    assert roles == stats["special_tokens"] and id_space(again) == n
    report = (run / "report.md").read_text()
    assert f"Tokenizer: {n:,} tokens (padded to {stats['padded_vocab_size']:,}), " in report
    assert read_json(run / "eval" / "metrics.json")["infill"]["not_run"] == "the tokenizer has no FIM tokens"


def test_a_replay_share_is_a_second_source_weighted_in_the_mixture(tmp_path):
    """docs/experiments.md's replay recipe as typed: the replay data a second download source (here the English
    docs that installed packages ship), both weighted by tokens in pretokenize.mixture with a
    train_tokens budget. The continuation trains on 90/10 and is judged on each source apart."""
    write_hf_folder(tmp_path / SOURCE, eos="<|endoftext|>")
    replay = f"{sysconfig.get_paths()['purelib']}/**/*.md"
    sources = (
        "download={sources: [{name: stdlib, kind: stdlib, include: ['json/*.py', 'email/*.py', 'collections/*.py']},"
        f" {{name: replay, kind: local, paths: ['{replay}'], max_rows: 150}}], rows_per_part: 20}}"
    )
    mixture = "pretokenize={val_tokens: 20000, train_tokens: 60000, mixture: {stdlib: 0.9, replay: 0.1}}"
    overrides = [o for o in FAST if not o.startswith(("download=", "pretokenize="))] + [sources, mixture]
    result = snakemake(tmp_path, "--configfile", str(CONFIG), "--config", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = tmp_path / "results"
    (meta_path,) = results.glob("data/tokens-*/meta.json")
    meta = read_json(meta_path)
    for name, share in (("stdlib", 0.9), ("replay", 0.1)):
        src = meta["sources"][name]
        assert src["share"] == share and src["train_target_tokens"] == round(60000 * share)
        assert src["train"]["tokens"] >= src["train_target_tokens"]  # the first documents reaching it
        assert src["unused_docs"] > 0  # cut at the budget, not at the end of the source
        assert src["val"]["tokens"] >= src["val_target_tokens"] == math.ceil(20000 * share)
    run = results / "smollm2-135m-stdlib"
    metrics = read_json(run / "eval" / "metrics.json")
    assert set(metrics["val_by_source"]) == {"stdlib", "replay"}
    report = (run / "report.md").read_text()
    assert "| replay | " in report and "| stdlib | " in report


def test_a_source_that_starts_documents_with_a_bos_keeps_that_layout_end_to_end(tmp_path):
    """The example run on a Llama-2-style stand-in (TinyLlama's layout: its tokenizer puts <s> before
    every text): every sample in the tokens is <s> text </s>, so the shards' rows have <s> after each
    </s>, and the run's export names <s> as its BOS."""
    source = write_hf_folder(tmp_path / SOURCE, eos="</s>", bos=True)
    result = snakemake(tmp_path, "--configfile", str(CONFIG), "--config", *FAST, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = tmp_path / "results"
    (stats_path,) = results.glob("data/tokenizer-*/stats.json")
    bos, eos = read_json(stats_path)["bos_token_id"], read_json(stats_path)["special_token_ids"][EOS]
    assert read_json(stats_path)["bos_token"] == "<s>" and bos != eos
    (tokens,) = [p for p in results.glob("data/tokens-*") if p.is_dir()]
    meta = read_json(tokens / "meta.json")
    for split in ("train", "val"):
        ids = np.fromfile(tokens / f"{split}.bin", dtype=meta["dtype"])
        ends = np.flatnonzero(ids == eos)
        assert ids[0] == bos and np.array_equal(np.flatnonzero(ids == bos), np.concatenate([[0], ends[:-1] + 1]))
        assert len(ends) == meta["splits"][split]["docs"]
    (shard_manifest,) = results.glob("data/shards-*/manifest.json")
    assert read_json(shard_manifest)["source_tokenizer_sha256"] == sha256_file(source / "tokenizer.json")
    export = results / "smollm2-135m-stdlib" / "train" / "hf"
    assert read_json(export / "config.json")["bos_token_id"] == bos
    assert read_json(export / "tokenizer_config.json")["bos_token"] == "<s>"
