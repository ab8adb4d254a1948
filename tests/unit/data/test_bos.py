"""A source whose tokenizer starts every document with a BOS (a Llama's <s>), continued on its own
tokenizer (tokenizer kind hf): the tokenizer stage records the BOS, pretokenize lays out every sample
as <s> text </s> (one job and scatter alike), and everything that feeds the model a text from its
start (lm-eval's adapter, the code and infill prompts, completions) and the export start with it.

The source is a byte-level BPE trained here with `tokenizers` (not by Kiln), its post-processor
TemplateProcessing(single="<s> $A") as Llama 2's, saved with transformers (tests/hf_folder.py):
"<s>" is id 0 and "</s>" id 1 in it."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from conftest import download_cfg, typed_section, write_jsonl
from hf_folder import write_hf_folder
from test_pretokenize import CFG
from test_pretokenize_scatter import encode_parts, one_job, scattered

from kiln import hf
from kiln.config.data_sections import PretokenizeSection
from kiln.config.models import ModelConfig
from kiln.data import token_parts
from kiln.data.pretokenize import pretokenize
from kiln.data.raw import write_raw
from kiln.data.tokenizer import bos_id, bos_token, load_tokenizer
from kiln.data.tokenizer_build import build_tokenizer
from kiln.errors import KilnError
from kiln.eval import code, infill
from kiln.eval.harness import KilnLM
from kiln.eval.humaneval import GREEDY, load_problems
from kiln.eval.humaneval_infill import single_line_tasks
from kiln.generate.healing import complete
from kiln.io import read_json, write_json
from kiln.model.build import build_model, save_model

pytestmark = pytest.mark.usefixtures("one_thread")
BOS, EOS = 0, 1  # <s>, </s> in hf_folder's tokenizer
TEXT = "def add(a, b):\n    return a + b\n"


def hf_cfg(folder):
    return typed_section("tokenizer", {"kind": "hf", "path": str(folder), "heldout_docs": 3})


def stage(raw_dir, folder, out):
    """The tokenizer stage's two files for source `folder`, in out; returns tokenizer.json's path."""
    tokenizer, stats = build_tokenizer(raw_dir, hf_cfg(folder), seed=7)
    out.mkdir(parents=True)
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "stats.json", stats)
    return out / "tokenizer.json"


def set_add_bos_token(folder, value, **more):
    config = read_json(folder / "tokenizer_config.json")
    write_json(folder / "tokenizer_config.json", config | {"add_bos_token": value} | more)
    return folder


@pytest.fixture(scope="module")
def llama(raw_dir, tmp_path_factory):
    """(source folder, the stage's tokenizer.json) of a Llama-style source."""
    base = tmp_path_factory.mktemp("llama")
    folder = write_hf_folder(base / "source", bos=True, model=False)
    return folder, stage(raw_dir, folder, base / "tokenizer")


@pytest.fixture(scope="module")
def no_bos(raw_dir, tmp_path_factory):
    """The stage's tokenizer.json for the same source with add_bos_token: false in its config."""
    base = tmp_path_factory.mktemp("no-bos")
    folder = set_add_bos_token(write_hf_folder(base / "source", bos=True, model=False), False)
    return stage(raw_dir, folder, base / "tokenizer")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny GPT over the Llama-style tokenizer's padded vocabulary (326 ids -> 384 rows)."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="gpt2", vocab_size=384, seq_len=64, n_layer=1, n_head=2, d_model=32)
    out = tmp_path_factory.mktemp("model")
    save_model(cfg, build_model(cfg).state_dict(), out)
    return out


# (a) the tokenizer stage


def test_the_stage_records_the_bos_the_source_adds(llama, raw_dir, caplog):
    from transformers import AutoTokenizer

    folder, path = llama
    assert AutoTokenizer.from_pretrained(folder)("x = 1")["input_ids"][0] == BOS  # transformers adds it too
    assert "add_bos_token" not in read_json(folder / "tokenizer_config.json")  # said by the post-processor alone
    stats = read_json(path.with_name("stats.json"))
    assert stats["bos_token"] == "<s>" and stats["bos_token_id"] == BOS
    assert bos_token(path) == "<s>" and bos_id(load_tokenizer(path)) == BOS
    with caplog.at_level(logging.INFO, logger="kiln.tokenizer"):
        build_tokenizer(raw_dir, hf_cfg(folder), seed=7)
    assert "the source starts every document with <s>" in caplog.text


def test_an_hf_stage_output_from_before_the_bos_was_recorded_is_refused(llama, tmp_path):
    """Not read as "no BOS": that would lay a Llama continuation out without the source's BOS."""
    _, path = llama
    old = tmp_path / "tokenizer.json"
    shutil.copy(path, old)
    stats = read_json(path.with_name("stats.json"))
    del stats["bos_token"]
    write_json(old.with_name("stats.json"), stats)
    with pytest.raises(KilnError, match=r"predates Kiln's record of the source's BOS .* --forcerun tokenizer"):
        load_tokenizer(old)


def test_add_bos_token_in_the_config_decides_over_the_post_processor(no_bos, raw_dir, tmp_path):
    assert read_json(no_bos.with_name("stats.json"))["bos_token"] is None and bos_token(no_bos) is None
    # A tokenizer.json that adds nothing, with add_bos_token: true (its bos_token an AddedToken's fields)
    folder = write_hf_folder(tmp_path / "config-says", model=False)
    set_add_bos_token(folder, True, bos_token={"content": "<s>", "special": True})
    assert build_tokenizer(raw_dir, hf_cfg(folder), seed=7)[1]["bos_token"] == "<s>"
    set_add_bos_token(folder, True, bos_token="<bos>")
    with pytest.raises(KilnError, match=r"tokenizer_config.json says add_bos_token: true with bos_token '<bos>'"):
        build_tokenizer(raw_dir, hf_cfg(folder), seed=7)
    config = read_json(folder / "tokenizer_config.json")
    del config["bos_token"]
    write_json(folder / "tokenizer_config.json", config)
    with pytest.raises(KilnError, match=r"tokenizer_config.json says add_bos_token: true and names no bos_token"):
        build_tokenizer(raw_dir, hf_cfg(folder), seed=7)


def test_a_source_adding_nothing_and_kilns_own_routes_record_none(raw_dir, tmp_path, trained):
    """GPT-2-like: a bos_token named in the config but never added (no post-processor adds it)."""
    folder = write_hf_folder(tmp_path / "gpt2-like", model=False)
    assert read_json(folder / "tokenizer_config.json")["bos_token"] == "<s>"
    assert build_tokenizer(raw_dir, hf_cfg(folder), seed=7)[1]["bos_token"] is None
    assert trained[1]["bos_token"] is None  # a BPE Kiln trains


# (b) the layout


def framed(stream: np.ndarray, bos: int, eos: int) -> int:
    """The number of samples of a split's stream, each asserted to be <bos> ... <eos> with neither
    id anywhere else."""
    ends = np.flatnonzero(stream == eos)
    assert len(stream) > 0 and stream[-1] == eos
    assert np.flatnonzero(stream == bos).tolist() == [0, *(ends[:-1] + 1).tolist()]
    return len(ends)


def test_every_sample_starts_with_the_bos_and_ends_with_the_eos(llama, raw_dir, tmp_path):
    _, path = llama
    cfg = dict(CFG, val_tokens=2_000, fim=dict(CFG["fim"], rate=0.5, min_chars=10))
    meta = pretokenize(raw_dir, path, tmp_path, 7, PretokenizeSection.of(cfg))
    assert meta["bos_id"] == BOS and meta["eos_id"] == EOS
    fim_ids = {load_tokenizer(path).token_to_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")}
    for split in ("train", "val"):
        stream = np.fromfile(tmp_path / f"{split}.bin", dtype=meta["dtype"])
        assert framed(stream, BOS, EOS) == meta["splits"][split]["docs"]  # one document a sample
        after_bos = set(stream[np.flatnonzero(stream == BOS) + 1].tolist())
        assert bool(after_bos & fim_ids) == (split == "train")  # FIM samples start <s> <fim_...>


@pytest.fixture(scope="module")
def repos_raw(tmp_path_factory):
    """Files of repositories (repository context) and prose that quotes <s> and </s>, 9 rows a part."""
    base = tmp_path_factory.mktemp("repos")
    code_rows = [
        {"text": f"# file {r}.{i}\n" + f"value = compute(x, {r})\n" * 6, "path": f"pkg/m{i}.py", "repo": f"org/r{r}"}
        for r in range(16)
        for i in range(3)
    ]
    prose = [{"text": f"Prose {i} quotes <s> and </s> as plain text.\n" * 3} for i in range(30)]
    spec = {"kind": "local", "text_column": "text"}
    sources = [
        spec
        | {"name": "code", "paths": [str(write_jsonl(base / "code.jsonl", code_rows))]}
        | {"path_column": "path", "repo_column": "repo"},
        spec | {"name": "prose", "paths": [str(write_jsonl(base / "prose.jsonl", prose))]},
    ]
    write_raw(download_cfg(sources, rows_per_part=9, dedup=False, near_dup={"enabled": False}), base / "raw")
    return base / "raw"


REPO_CFG = dict(CFG, val_tokens=600, repo_context=True, fim=dict(CFG["fim"], rate=0.5, min_chars=0))


def test_the_scatter_writes_the_bytes_of_one_job_with_a_bos(llama, repos_raw, tmp_path):
    """(c) and the parts' own samples: each starts with <s>, then <repo_name> for a repository."""
    _, path = llama
    gathered = scattered(repos_raw, path, tmp_path / "scatter", REPO_CFG)
    assert gathered == one_job(repos_raw, path, tmp_path / "one", REPO_CFG)
    meta = json.loads(gathered["meta.json"])
    repo_name = read_json(path.with_name("stats.json"))["special_token_ids"]["<repo_name>"]
    seconds = []
    for folder in sorted((tmp_path / "scatter.parts").iterdir()):
        saved = read_json(folder / token_parts.STAMP)
        assert saved["stamp"]["bos"] is True  # the plan's layout names it
        counts = np.load(folder / token_parts.SAMPLES)[:, 1:]
        files = [(folder / token_parts.TRAIN, token_parts.sample_offsets(counts), counts[:, 0])]
        if saved["candidates"]:
            cands = saved["candidates"]
            files.append((folder / token_parts.VAL, [c["offset"] for c in cands], [c["tokens"] for c in cands]))
        for file, offsets, lengths in files:
            ids = np.fromfile(file, dtype=meta["dtype"])
            assert len(offsets) and sum(lengths) == len(ids)
            for at, n in zip(offsets, lengths):
                assert ids[at] == BOS and ids[at + n - 1] == EOS and BOS not in ids[at + 1 : at + n].tolist()
                seconds.append(int(ids[at + 1]))
    fim = {load_tokenizer(path).token_to_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")}
    assert repo_name in seconds and fim & set(seconds)  # <s> <repo_name> ..., and <s> <fim_...> for prose
    for split in ("train", "val"):
        stream = np.frombuffer(gathered[f"{split}.bin"], dtype=meta["dtype"])
        assert framed(stream, BOS, EOS) > 0


def test_a_run_without_a_bos_has_none_anywhere(no_bos, repos_raw, tmp_path):
    parts = encode_parts(repos_raw, no_bos, tmp_path / "parts", REPO_CFG)
    assert "bos" not in read_json(parts[0] / token_parts.STAMP)["stamp"]  # the stamp as before BOS layouts
    written = one_job(repos_raw, no_bos, tmp_path / "one", REPO_CFG)
    meta = json.loads(written["meta.json"])
    assert meta["bos_id"] is None
    for split in ("train", "val"):
        stream = np.frombuffer(written[f"{split}.bin"], dtype=meta["dtype"])
        assert BOS not in stream.tolist() and stream[-1] == EOS
        assert meta["splits"][split]["tokens"] == len(stream)


# (d) what the model reads from a text's start


def request(*args):
    class Request:  # lm-eval's Instance exposes .args; nothing else is read
        pass

    r = Request()
    r.args = args
    return r


def log_probs(model, ids: list[int], first: int) -> float:
    """The sum of log p(ids[i] | ids[:i]) for i >= first, by one forward."""
    logits, _ = model(torch.tensor([ids[:-1]]))
    scores = torch.log_softmax(logits.float(), -1)[0, first - 1 :]
    return scores.gather(1, torch.tensor(ids[first:])[:, None]).sum().item()


def test_lm_eval_reads_every_text_after_the_bos_and_never_scores_it(llama, model_dir):
    _, path = llama
    lm = KilnLM(pretrained=str(model_dir), tokenizer=str(path), batch_size=2)
    plain = lm.tok_encode(TEXT, add_special_tokens=False)
    assert lm.prefix_token_id == BOS and lm.eot_token_id == EOS
    assert lm.tok_encode(TEXT) == [BOS, *plain] and BOS not in plain
    # Rolling (bits per byte): the BOS is the first window's context, every text token scored once.
    [rolling] = lm.loglikelihood_rolling([request(TEXT)])
    assert rolling == pytest.approx(log_probs(lm.model, [BOS, *plain], 1), abs=1e-4)
    # An empty context is the BOS; a context starts with it; the continuation never holds it.
    context, continuation = "def add(a, b):", "\n    return a + b\n"
    cont_ids = lm.tok_encode(continuation, add_special_tokens=False)
    whole = lm.tok_encode(context + continuation)
    [(empty, _), (after, _)] = lm.loglikelihood([request("", continuation), request(context, continuation)])
    assert empty == pytest.approx(log_probs(lm.model, [BOS, *cont_ids], 1), abs=1e-4)
    assert after == pytest.approx(log_probs(lm.model, whole, len(lm.tok_encode(context))), abs=1e-4)


def test_lm_eval_without_a_bos_prefixes_the_eos_as_before(no_bos, model_dir):
    lm = KilnLM(pretrained=str(model_dir), tokenizer=str(no_bos))
    assert lm.prefix_token_id == lm.eot_token_id == EOS
    assert lm.tok_encode(TEXT) == lm.tok_encode(TEXT, add_special_tokens=False) and BOS not in lm.tok_encode(TEXT)


def first_inputs(model, run) -> list[list[int]]:
    """The prompt rows of the first forward (the prefill) that run() makes the model do."""
    seen = []
    hook = model.register_forward_pre_hook(lambda _, args: seen.append(args[0]) if not seen else None)
    try:
        run()
    finally:
        hook.remove()
    return seen[0].tolist()


def test_code_and_infill_prompts_and_completions_start_with_the_bos(llama, no_bos, model_dir):
    _, path = llama
    tokenizer = load_tokenizer(path)
    model = build_model(ModelConfig(**read_json(model_dir / "model_config.json"))).eval()
    task = single_line_tasks(load_problems(1))[0]
    whole = code.fim_ids(tokenizer, task, "psm", 10_000)
    assert whole[0] == BOS and tokenizer.decode(whole[1:2], skip_special_tokens=False) == "<fim_prefix>"
    short = code.fim_ids(tokenizer, task, "spm", 40)
    assert len(short) == 40 and short[0] == BOS
    problem = infill.InfillProblem("d", "single", "a = 1\n", "b = 2\n", "c = 3\n")
    assert infill._prompt(problem, tokenizer, "psm", 1_000)[0] == BOS
    assert len(infill._prompt(problem, tokenizer, "psm", 5)) == 5
    # HumanEval's completions and the eval's/train's samples: the model's first input starts with it.
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    healed = [[BOS, *ids[:-1]]]  # token healing takes the last token off
    assert first_inputs(model, lambda: code.complete(model, tokenizer, [TEXT], 4, GREEDY, None)) == healed
    assert first_inputs(model, lambda: complete(model, tokenizer, [TEXT], 4)) == healed
    plain = load_tokenizer(no_bos)  # no BOS: the prompt alone, as before
    assert first_inputs(model, lambda: code.complete(model, plain, [TEXT], 4, GREEDY, None)) == [ids[:-1]]
    assert code.fim_ids(plain, task, "psm", 99)[0] != BOS


# (e) the export


def test_the_export_names_the_sources_bos(llama, model_dir, tmp_path):
    from transformers import AutoTokenizer

    _, path = llama
    model = build_model(ModelConfig(**read_json(model_dir / "model_config.json")))
    hf.export(model, tmp_path / "hf", path)
    config = read_json(tmp_path / "hf" / "config.json")
    assert config["bos_token_id"] == BOS and config["eos_token_id"] == EOS
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert theirs.bos_token == "<s>" and theirs.bos_token_id == BOS and theirs.eos_token == "</s>"
    ours = load_tokenizer(path).encode(TEXT, add_special_tokens=False).ids
    assert theirs(TEXT)["input_ids"] == [BOS, *ours]  # the layout the model was trained on
    assert hf.hf_config(model.config, EOS)["bos_token_id"] == EOS  # no BOS known: the EOS, as before
