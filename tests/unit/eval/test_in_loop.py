"""eval.in_loop (kiln.eval.in_loop): a run with it logs HumanEval pass@1 at its steps, from programs run
in the sandbox, and trains the weights a run without it trains; its every must meet a validation."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from synthetic import train_sections, write_shards

from kiln import config as kiln_config
from kiln import layout
from kiln.config.run_config import RunConfig
from kiln.data.tokenizer import padded_vocab_size
from kiln.errors import KilnError
from kiln.eval import sandbox
from kiln.eval.in_loop import HumanEvalInLoop
from kiln.train.callbacks import default_callbacks
from kiln.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


@pytest.fixture(scope="module")
def wide_shards(tmp_path_factory, tokenizer):
    """The synthetic shards with an embedding as wide as the test tokenizer, which the eval decodes with."""
    return write_shards(
        tmp_path_factory.mktemp("wide") / "shards", padded_vocab=padded_vocab_size(tokenizer.get_vocab_size())
    )


def _train(shards, out, callbacks) -> list[dict]:
    sections = train_sections(max_steps=10, log_every=2, eval_every=2, checkpoint_every=10)
    sections["eval"]["in_loop"] = {"every": 4, "problems": 3, "max_new_tokens": 4}
    config = RunConfig.of(sections)
    Trainer(config, shards).fit(out, callbacks=callbacks(config))
    return [json.loads(line) for line in (out / layout.METRICS).read_text().splitlines()]


def test_the_in_loop_eval_logs_pass_at_1_at_its_steps_and_leaves_the_weights_alone(
    wide_shards, tokenizer_path, tmp_path, monkeypatch
):
    ran = []
    real = sandbox.run_programs
    monkeypatch.setattr(
        sandbox, "run_programs", lambda programs, *a, **k: ran.extend(programs) or real(programs, *a, **k)
    )
    with_eval = _train(
        wide_shards,
        tmp_path / "with",
        lambda config: default_callbacks(evaluators=[HumanEvalInLoop(tokenizer_path, config.eval)]),
    )
    at = {r["step"]: r for r in with_eval}
    assert [s for s, r in at.items() if "humaneval_pass@1" in r] == [4, 8, 10]  # every 4, and the last
    for step in (4, 8, 10):
        assert 0.0 <= at[step]["humaneval_pass@1"] <= 1.0 and at[step]["in_loop_eval_s"] > 0
    assert len(ran) == 3 * 3 and all("def " in p and "check(" in p for p in ran)  # 3 problems, 3 times

    without = _train(wide_shards, tmp_path / "without", lambda config: default_callbacks())
    assert [r["loss"] for r in without] == [r["loss"] for r in with_eval]
    assert [r.get("val_loss") for r in without] == [r.get("val_loss") for r in with_eval]
    trained = load_file(tmp_path / "with" / "model.safetensors")
    plain = load_file(tmp_path / "without" / "model.safetensors")
    assert trained.keys() == plain.keys() and all(trained[k].equal(plain[k]) for k in trained)


def test_where_the_sandbox_is_refused_the_in_loop_eval_stops_before_the_first_step_naming_itself(tmp_path, monkeypatch):
    """Docker's default seccomp profile and Ubuntu 24.04's AppArmor restriction refuse the namespaces: the
    error names eval.in_loop, how to allow them and how to turn the eval off (not the eval stage's
    settings, which leave it on), before the tokenizer or the problems are read."""
    refused = {"filesystem": "the host's, under file permissions only (namespaces unavailable: [Errno 1] EPERM)"}
    monkeypatch.setattr(sandbox, "protections", lambda: refused)
    sections = train_sections()
    sections["eval"]["in_loop"] = {"every": sections["train"]["eval_every"]}
    with pytest.raises(KilnError) as refusal:
        HumanEvalInLoop(tmp_path / "unread-tokenizer.json", RunConfig.of(sections).eval)
    message = str(refusal.value)
    assert message.startswith("eval.in_loop: the sandbox cannot confine") and "EPERM" in message
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in message and "seccomp=unconfined" in message
    assert message.endswith("set eval.in_loop.every to 0.")


def test_the_in_loop_every_must_be_a_multiple_of_the_validations():
    # as the user types it: snakemake --config eval='{in_loop: {every: 150}}' on the default (eval_every 100)
    with pytest.raises(KilnError, match=r"eval.in_loop.every: 150 must be a multiple of train.eval_every=100"):
        kiln_config.resolve([], {"eval": "{in_loop: {every: 150}}"})
    assert kiln_config.resolve([], {"eval": "{in_loop: {every: 200}}"})["eval"]["in_loop"]["every"] == 200
