"""lm-eval through the "kiln" model on the local tasks, offline, on a tiny checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kiln.config.models import ModelConfig
from kiln.data.sources import Document, read_documents
from kiln.eval.harness import KilnLM
from kiln.eval.lm_tasks import LOCAL_TASKS, run_lm_eval, write_task_configs, write_task_data
from kiln.io import read_json
from kiln.model.build import build_model, save_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(family="gpt2", vocab_size=512, seq_len=32, n_layer=1, n_head=2, d_model=32)
    out = tmp_path_factory.mktemp("ckpt")
    save_model(cfg, build_model(cfg).state_dict(), out)
    return out


@pytest.fixture(scope="module")
def docs(raw_dir) -> list[Document]:
    return list(read_documents(raw_dir, read_json(raw_dir / "manifest.json")))[:6]


@pytest.fixture(scope="module")
def lm(checkpoint, tokenizer_path) -> KilnLM:
    return KilnLM(pretrained=str(checkpoint), tokenizer=str(tokenizer_path), batch_size=3)


def _request(*args):
    class Request:  # lm-eval's Instance exposes .args; nothing else is read
        pass

    r = Request()
    r.args = args
    return r


def test_scores_match_a_direct_forward(lm):
    ctx, cont = lm.tok_encode("def f(x):\n"), lm.tok_encode("    return x\n")
    [(score, _)] = lm._loglikelihood_tokens([(("", ""), ctx, cont)])
    ids = torch.tensor([ctx + cont])
    logits, _ = lm.model(ids[:, :-1])
    expected = torch.log_softmax(logits.float(), -1)[0, len(ctx) - 1 :].gather(1, ids[0, len(ctx) :, None]).sum()
    assert score == pytest.approx(expected.item(), abs=1e-4)


def test_batching_does_not_change_scores(lm):
    pairs = [(("", ""), lm.tok_encode("x" * n), lm.tok_encode(" = 1\n")) for n in range(1, 8)]
    batched = lm._loglikelihood_tokens(pairs)
    one_by_one = [lm._loglikelihood_tokens([p])[0] for p in pairs]
    assert [s for s, _ in batched] == pytest.approx([s for s, _ in one_by_one], abs=1e-4)


def test_rolling_loglikelihood_covers_every_token_once(lm):
    text = "import os\n" * 30  # longer than the 32-token context: several windows
    n_tokens = len(lm.tok_encode(text))
    assert n_tokens > lm.max_length
    [total] = lm.loglikelihood_rolling([_request(text)])
    # a random model spreads mass roughly uniformly: about ln(V) nats per predicted token
    assert total < 0 and abs(-total / n_tokens - math.log(512)) < 1.5


def test_generate_until_stops_at_the_stop_string(lm):
    [out] = lm.generate_until([_request("x = 1\n", {"until": ["\n"], "max_gen_toks": 10})])
    assert "\n" not in out


def test_next_line_context_ends_at_a_token_boundary(docs, tokenizer, tmp_path):
    data_dir = write_task_data(docs, tmp_path / "tasks", seed=1, max_docs=len(docs), tokenizer=tokenizer)
    rows = [json.loads(line) for line in (data_dir / "next_line.jsonl").read_text().splitlines()]
    assert rows and all(r["target"].strip() and "\n" not in r["target"] for r in rows)
    for r in rows:
        whole = tokenizer.encode(r["context"] + r["target"], add_special_tokens=False).ids
        context = tokenizer.encode(r["context"], add_special_tokens=False).ids
        assert whole[: len(context)] == context  # the context's tokens are the text's own
        # and the target starts at the piece holding the line's first visible character
        assert len(r["target"]) - len(r["target"].lstrip()) <= 1
    # indented lines: the newline and indentation go with the target's first token, not the context
    assert any(not r["context"].endswith("\n") for r in rows)


def test_local_tasks_run_through_simple_evaluate(docs, checkpoint, tokenizer, tokenizer_path, tmp_path):
    """The data written in one folder (the eval_data stage's), the task YAMLs in another (eval's)."""
    data_dir = write_task_data(docs, tmp_path / "eval_data" / "lm_eval_tasks", seed=1, max_docs=4, tokenizer=tokenizer)
    tasks_dir = write_task_configs(data_dir, tmp_path / "eval" / "lm_eval_tasks")
    assert not list(tasks_dir.glob("*.jsonl"))
    results = run_lm_eval(
        "kiln", {"pretrained": str(checkpoint), "tokenizer": str(tokenizer_path)}, list(LOCAL_TASKS), tasks_dir, limit=2
    )
    assert set(results) == {"kiln_heldout_perplexity", "kiln_heldout_next_line"}
    bpb = results["kiln_heldout_perplexity"]["bits_per_byte,none"]
    assert 0 < bpb < 20
    assert results["kiln_heldout_next_line"]["exact_match,none"] == 0.0  # an untrained model


@pytest.mark.slow
def test_the_metric_runs_the_local_tasks_together_and_reports_a_hub_task_it_cannot_load(
    docs, checkpoint, tokenizer, tokenizer_path, tmp_path
):
    """The eval stage's lm_eval metric: the local tasks in one call, a hub task alone (lm-eval's own
    task index is read for it); one the harness cannot fetch (the Hub is off here) is marked
    unavailable, and the local tasks keep their figures."""
    from types import SimpleNamespace

    from kiln.eval.metrics.lm_eval.compute import measure

    tasks = ["kiln_heldout_perplexity", "hellaswag", "kiln_heldout_next_line"]
    ctx = SimpleNamespace(
        cfg=SimpleNamespace(lm_eval=SimpleNamespace(tasks=tasks, limit=2)),
        paths=SimpleNamespace(model=checkpoint, tokenizer=tokenizer_path),
        work_dir=tmp_path / "eval",
        data=SimpleNamespace(task_data=write_task_data(docs, tmp_path / "eval_data", 1, 3, tokenizer)),
        device=torch.device("cpu"),
        precision="fp32",
    )
    results = measure(ctx).metrics["lm_eval"]
    assert set(results) == set(tasks)
    assert list(results["hellaswag"]) == ["unavailable"] and results["hellaswag"]["unavailable"]
    assert 0 < results["kiln_heldout_perplexity"]["bits_per_byte,none"] < 20
    assert "exact_match,none" in results["kiln_heldout_next_line"]


@pytest.mark.slow
def test_hf_export_through_lm_eval_hf_agrees(docs, checkpoint, tokenizer, tokenizer_path, tmp_path):
    """The same weights scored by lm-eval's own `hf` model (transformers) and by `kiln` agree."""
    from kiln.hf import export
    from kiln.model.build import load_model

    hf_dir = tmp_path / "hf"
    export(load_model(checkpoint), hf_dir, tokenizer_path)
    tasks_dir = write_task_configs(write_task_data(docs, tmp_path / "data", 1, 3, tokenizer), tmp_path / "tasks")
    task = ["kiln_heldout_perplexity"]
    ours = run_lm_eval("kiln", {"pretrained": str(checkpoint), "tokenizer": str(tokenizer_path)}, task, tasks_dir)
    theirs = run_lm_eval("hf", {"pretrained": str(hf_dir), "dtype": "float32", "device": "cpu"}, task, tasks_dir)
    metric = "bits_per_byte,none"
    assert ours[task[0]][metric] == pytest.approx(theirs[task[0]][metric], rel=1e-4)
