"""Completions during training (kiln.train.samples) and in the report: sampled at train.samples'
temperature and top-p from a generator seeded with the run's seed (the same run, the same samples),
without a draw from torch's global generator (training's stream: the run must not change), and each
shown completion labelled "greedy" or "sampled (temperature T, top-p P)"."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import typed_section
from synthetic import SEQ_LEN, TINY_MODEL, _stream, train_sections
from train_stage import run

from kiln.config.models import ModelConfig
from kiln.config.run_config import RunConfig
from kiln.data.shards import shard_split
from kiln.data.tokenizer import load_tokenizer
from kiln.eval.metrics.completions.compute import decoding
from kiln.eval.metrics.completions.report import examples as completion_examples
from kiln.eval.metrics.output import EvalOutput
from kiln.io import write_json
from kiln.model.build import build_model, load_model
from kiln.report.run import _training_samples
from kiln.train import fingerprint
from kiln.train.samples import make_sampler

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)

PROMPTS = ["import json\n", "def "]
SAMPLED = "sampled (temperature 1, top-p 0.95)"


def _padded(tokenizer_path: Path) -> tuple[int, int]:
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    return vocab, -(-vocab // 64) * 64


@pytest.fixture(scope="module")
def model(tokenizer_path):
    """A random tiny GPT over the test tokenizer's vocabulary (its draws are far from one-hot)."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="gpt2", vocab_size=_padded(tokenizer_path)[1], seq_len=32, **TINY_MODEL)
    return build_model(cfg).eval()


def test_same_seed_gives_the_same_samples_and_each_row_says_how_it_was_decoded(tokenizer_path, model):
    sampler = make_sampler(tokenizer_path, PROMPTS, 8, temperature=1.0, top_p=0.95, seed=3)
    first = sampler(model)
    assert [r["decoding"] for r in first] == [SAMPLED, SAMPLED] and [r["prompt"] for r in first] == PROMPTS
    # reseeded at every call (a resumed run logs what an uninterrupted one did), and per sampler
    assert sampler(model) == first
    assert make_sampler(tokenizer_path, PROMPTS, 8, temperature=1.0, top_p=0.95, seed=3)(model) == first
    other = make_sampler(tokenizer_path, PROMPTS, 8, temperature=1.0, top_p=0.95, seed=4)(model)
    assert [r["completion"] for r in other] != [r["completion"] for r in first]
    greedy = make_sampler(tokenizer_path, PROMPTS, 8, temperature=0.0, seed=3)(model)
    assert [r["decoding"] for r in greedy] == ["greedy", "greedy"]
    assert [r["completion"] for r in greedy] != [r["completion"] for r in first]


def test_train_samples_are_sampled_by_default_and_do_not_change_the_trajectory():
    train = train_sections()["train"]
    assert (train["samples"]["temperature"], train["samples"]["top_p"]) == (0.8, 0.95)
    greedy = train | {"samples": train["samples"] | {"temperature": 0.0}}
    assert fingerprint.trajectory(greedy, 20) == fingerprint.trajectory(train, 20)  # a finished run resumes


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tokenizer_path) -> Path:
    """tests/synthetic.py's learnable stream, in a shard folder over the test tokenizer's vocabulary
    (so that a sampler with that tokenizer can decode the model being trained)."""
    out = tmp_path_factory.mktemp("shards")
    vocab, padded = _padded(tokenizer_path)
    row_len = SEQ_LEN + 1
    splits = {
        split: shard_split(_stream(rows * row_len, seed=seed), out, split, row_len, 1000, padded)
        for split, rows, seed in (("train", 64, 1), ("val", 16, 2))
    }
    manifest = {"seq_len": SEQ_LEN, "row_len": row_len, "dtype": "uint16", "vocab_size": vocab}
    write_json(out / "manifest.json", manifest | {"padded_vocab_size": padded, "splits": splits})
    return out


def test_sampling_during_training_leaves_the_global_rng_and_the_run_unchanged(shards, tokenizer_path, tmp_path):
    """Torch's global generator is the run's (seeded once, for weights and anything else drawn from
    it): the sampler must draw from its own, or samples would change what a run trains."""
    sampler = make_sampler(tokenizer_path, PROMPTS, 6, temperature=1.0, top_p=0.95, seed=7)
    unchanged = []

    def watched(m, agree=None):
        before = torch.random.get_rng_state()
        rows = sampler(m, agree=agree)
        unchanged.append(torch.equal(before, torch.random.get_rng_state()))
        return rows

    sections = train_sections(max_steps=20, eval_every=10, log_every=5)
    run(RunConfig.of(sections), shards, tmp_path / "plain")
    run(RunConfig.of(copy.deepcopy(sections)), shards, tmp_path / "sampled", sampler=watched)
    assert unchanged == [True, True]  # steps 10 and 20
    losses = [
        [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("plain", "sampled")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    for key, value in load_model(tmp_path / "plain").state_dict().items():
        assert torch.equal(value, load_model(tmp_path / "sampled").state_dict()[key]), key
    rows = [json.loads(line) for line in (tmp_path / "sampled" / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["decoding"]) for r in rows] == [(10, SAMPLED), (10, SAMPLED), (20, SAMPLED), (20, SAMPLED)]


def test_report_labels_every_completion_it_shows():
    eval_cfg = typed_section("eval", {"temperature": 0.8, "top_k": 50, "top_p": 1.0})
    samples = {
        "completions": [{"prompt": "def ", "greedy": "f():", "sampled": "g(x):"}],
        "decoding": decoding(eval_cfg),
    }
    text = "\n".join(completion_examples(EvalOutput(samples=samples), {}))
    assert "Prompt `'def '`, sampled (temperature 0.8, top-k 50, top-p 1):\n\n```\ndef g(x):\n```" in text
    assert "greedy:\n\n```\ndef f():\n```" in text
    train_rows = [
        {"step": 10, "prompt": "def ", "completion": "x", "decoding": SAMPLED},
        {"step": 20, "prompt": "def ", "completion": "y"},  # samples.jsonl from before the label: greedy
    ]
    table = "\n".join(_training_samples(train_rows, final=[]))
    assert "| step | prompt | decoding | completion |" in table
    assert f"| 10 | `'def '` | {SAMPLED} | `'x'` |" in table and "| 20 | `'def '` | greedy | `'y'` |" in table
    # The eval stage completes the prompts with the final model: shown after the first validation's.
    final = [{"step": 20, "prompt": "def ", "completion": "z", "decoding": SAMPLED}]
    table = "\n".join(_training_samples(train_rows, final=final))
    assert f"| 10 | `'def '` | {SAMPLED} | `'x'` |" in table and f"| final | `'def '` | {SAMPLED} | `'z'` |" in table
    assert "`'y'`" not in table


def test_a_train_samples_temperature_below_zero_is_refused():
    from kiln.errors import KilnError

    with pytest.raises(KilnError, match="temperature"):
        train_sections(samples={"prompts": ["a"], "temperature": -1.0})
