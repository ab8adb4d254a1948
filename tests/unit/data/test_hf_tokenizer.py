"""tokenizer: {kind: hf, path: FOLDER}: a stock checkpoint's tokenizer as it is (its ids, its
end-of-text token, its FIM tokens where it has them; Kiln's appended for a role it lacks), the roles
recorded beside tokenizer.json and followed by pretokenize, and init_from taking the source whose
tokenizer the run's extends as the same one."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import typed_section
from hf_folder import FIM_STYLES, TEXTS, write_hf_folder

from kiln import hf
from kiln.config import settings
from kiln.config.data_sections import PretokenizeSection
from kiln.config.special_tokens import SPECIAL_TOKENS, roles_used
from kiln.data.pretokenize import pretokenize
from kiln.data.tokenizer import EOS, load_tokenizer, role_id, role_ids, token_roles
from kiln.data.tokenizer_build import build_tokenizer, encode_batch
from kiln.errors import KilnError
from kiln.forecast import model_vocab
from kiln.io import read_json, sha256_file, write_json
from kiln.train.init_from import InitSource, check_same_tokenizer

SAMPLE = "def greet(name):\n    return f'hello {name}' + '<|endoftext|></s>'\n"
FIM, REPO = SPECIAL_TOKENS[1:5], SPECIAL_TOKENS[5:]


def hf_cfg(folder):
    return typed_section("tokenizer", {"kind": "hf", "path": str(folder), "heldout_docs": 3})


def source_ids(folder, texts):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(folder)
    return [theirs(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module", params=[None, "starcoder", "qwen"])
def built(request, raw_dir, tmp_path_factory):
    """(source folder, FIM style, tokenizer, stats) for a source without FIM tokens and with each style."""
    folder = write_hf_folder(tmp_path_factory.mktemp("source"), fim=request.param, model=False)
    tokenizer, stats = build_tokenizer(raw_dir, hf_cfg(folder), seed=7)
    return folder, request.param, tokenizer, stats


def test_ids_are_the_source_tokenizers_on_sample_text(built):
    folder, _, tokenizer, _ = built
    texts = [*TEXTS, "x = 'naïve ☃'\n\n\tpass"]
    assert encode_batch(tokenizer, texts) == source_ids(folder, texts)


def test_special_spellings_in_a_document_stay_text(built):
    """As with every Kiln tokenizer: only the layout puts a special id in a sequence."""
    _, _, tokenizer, stats = built
    ids = tokenizer.encode(SAMPLE, add_special_tokens=False).ids
    assert not set(ids) & set(stats["special_token_ids"].values())
    assert tokenizer.decode(ids) == SAMPLE


def test_documents_end_with_the_sources_eos_and_fim_uses_its_tokens_where_it_has_them(built):
    folder, fim, tokenizer, stats = built
    source = json.loads((folder / "tokenizer.json").read_text())
    n = max(source["model"]["vocab"].values()) + 1
    roles, ids = stats["special_tokens"], stats["special_token_ids"]
    assert roles[EOS] == "</s>" and ids[EOS] == source["model"]["vocab"]["</s>"] == 1
    if fim:
        assert [roles[r] for r in FIM] == FIM_STYLES[fim]
        assert all(ids[r] < n for r in FIM)  # the source's own ids, nothing appended for them
    else:
        assert [roles[r] for r in FIM] == list(FIM)  # Kiln's spellings, appended
    appended = [t for t in SPECIAL_TOKENS[1:] if fim is None or t in REPO]
    assert stats["added_tokens"] == [roles[r] for r in appended]
    assert sorted(ids[r] for r in appended) == list(range(n, n + len(appended)))
    assert stats["vocab_size"] == n + len(appended) and stats["padded_vocab_size"] % 64 == 0
    assert stats["source_tokenizer_sha256"] == sha256_file(folder / "tokenizer.json")
    assert model_vocab(hf_cfg(folder)) == stats["padded_vocab_size"]  # what `kiln plan` sizes the model at


def test_pretokenize_lays_out_the_sources_ids(built, raw_dir, tmp_path):
    """Through the stage's files: EOS after every document is the source's eos id, and the FIM
    sentinels in train.bin are the roles' ids; the meta records the source tokenizer."""
    folder, _, tokenizer, stats = built
    path = tmp_path / "tokenizer" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    write_json(path.with_name("stats.json"), stats)
    assert token_roles(path) == stats["special_tokens"]
    assert role_ids(tokenizer, path) == stats["special_token_ids"]
    loaded = load_tokenizer(path)  # what eval, samples and the export load: the roles come with it
    assert {r: role_id(loaded, r) for r in SPECIAL_TOKENS} == stats["special_token_ids"]
    exported = hf.hf_tokenizer(path)
    assert exported.eos_token == "</s>" and exported.eos_token_id == stats["special_token_ids"][EOS]
    assert (
        exported.convert_tokens_to_ids(stats["special_tokens"]["<fim_middle>"])
        == stats["special_token_ids"]["<fim_middle>"]
    )
    cfg = {
        "val_tokens": 2_000,
        "mixture": {},
        "heldout_ngram": 50,
        "heldout_guard": 10,
        "repo_context": False,
        "encoder": "auto",
        "fim": {"rate": 1.0, "psm": 0.5, "spm": 0.5, "middle_only": 0.0, "min_chars": 10},
    }
    out = tmp_path / "tokens"
    out.mkdir()
    meta = pretokenize(raw_dir, path, out, 7, PretokenizeSection.of(cfg))
    ids = stats["special_token_ids"]
    assert meta["eos_id"] == ids[EOS] == 1
    assert meta["source_tokenizer_sha256"] == stats["source_tokenizer_sha256"]
    train = np.fromfile(out / "train.bin", dtype=meta["dtype"])
    assert train[-1] == ids[EOS]
    assert {ids[r] for r in FIM[:3]} <= set(np.unique(train).tolist())


def test_init_from_takes_the_source_whose_tokenizer_the_run_extends(built):
    folder, _, _, stats = built
    source = InitSource("hf", folder, optimizer=False)
    check_same_tokenizer(source, "a" * 64, stats["source_tokenizer_sha256"])  # the run's own differs: fine
    with pytest.raises(KilnError, match="another tokenizer"):
        check_same_tokenizer(source, "a" * 64, None)


def test_a_source_naming_no_eos_token_is_an_error_naming_the_files(raw_dir, tmp_path):
    folder = write_hf_folder(tmp_path / "source", model=False)
    config = read_json(folder / "tokenizer_config.json")
    del config["eos_token"]
    write_json(folder / "tokenizer_config.json", config)
    with pytest.raises(KilnError, match=r"tokenizer.path: neither .*tokenizer_config.json nor .*special_tokens_map"):
        build_tokenizer(raw_dir, hf_cfg(folder), seed=7)
    write_json(folder / "special_tokens_map.json", {"eos_token": {"content": "</s>", "special": True}})
    assert build_tokenizer(raw_dir, hf_cfg(folder), seed=7)[1]["special_tokens"][EOS] == "</s>"
    write_json(folder / "special_tokens_map.json", {"eos_token": "<eot>"})
    with pytest.raises(KilnError, match=r"special_tokens_map.json names eos_token '<eot>', which .* lacks"):
        build_tokenizer(raw_dir, hf_cfg(folder), seed=7)


def test_a_folder_without_tokenizer_json_is_an_error(raw_dir, tmp_path):
    with pytest.raises(KilnError, match=r"tokenizer.path: .* has no tokenizer.json"):
        build_tokenizer(raw_dir, hf_cfg(tmp_path), seed=7)


def test_the_stage_script_writes_the_roles_beside_the_tokenizer(raw_dir, tmp_path):
    folder = write_hf_folder(tmp_path / "source", eos="<|endoftext|>", fim="starcoder", model=False)
    out = tmp_path / "out"
    params = json.dumps({"seed": 7, "tokenizer": {"kind": "hf", "path": str(folder), "heldout_docs": 3}})
    cmd = [sys.executable, "workflow/scripts/tokenizer.py", "--params", params, "--raw", str(raw_dir)]
    cmd += ["--tokenizer", str(out / "tokenizer.json"), "--stats", str(out / "stats.json")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert token_roles(out / "tokenizer.json")[EOS] == "<|endoftext|>"
    assert read_json(out / "stats.json")["special_token_ids"]["<fim_prefix>"] == 2


@pytest.mark.parametrize("fim", [None, "starcoder"])
def test_a_run_using_no_fim_or_repository_roles_keeps_the_source_tokenizer_byte_for_byte(raw_dir, tmp_path, fim):
    """A drop-in continuation (the stage's derived roles: the end of a document alone): nothing is
    appended, the stage's tokenizer.json is the source's file, a role neither has is not recorded and has
    no id, a source's own FIM tokens keep their roles; pretokenize with FIM off needs no other token."""
    folder = write_hf_folder(tmp_path / "source", fim=fim, model=False)
    out = tmp_path / "out"
    tokenizer_cfg = {"kind": "hf", "path": str(folder), "heldout_docs": 3}
    params = json.dumps({"seed": 7, "tokenizer": tokenizer_cfg, settings.DERIVED: {"roles": [EOS]}})
    cmd = [sys.executable, "workflow/scripts/tokenizer.py", "--params", params, "--raw", str(raw_dir)]
    cmd += ["--tokenizer", str(out / "tokenizer.json"), "--stats", str(out / "stats.json")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    stats = read_json(out / "stats.json")
    n = max(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"].values()) + 1
    assert stats["added_tokens"] == [] and stats["vocab_size"] == stats["source_vocab_size"] == n
    assert stats["special_tokens"] == {EOS: "</s>", **dict(zip(FIM, FIM_STYLES[fim] if fim else []))}
    loaded = load_tokenizer(out / "tokenizer.json")
    assert role_id(loaded, REPO[0]) is None and (role_id(loaded, FIM[0]) is None) == (fim is None)
    assert hf.hf_tokenizer(out / "tokenizer.json").get_vocab() == loaded.get_vocab(with_added_tokens=True)
    cfg = {"val_tokens": 2_000, "fim": {"rate": 0}}
    (out / "tokens").mkdir()
    meta = pretokenize(raw_dir, out / "tokenizer.json", out / "tokens", 7, PretokenizeSection.of(cfg))
    train = np.fromfile(out / "tokens" / "train.bin", dtype=meta["dtype"])
    assert meta["eos_id"] == 1 and train[-1] == 1 and train.max() < n


def test_a_run_with_fim_and_no_repository_context_appends_the_fim_tokens_alone(raw_dir, tmp_path):
    folder = write_hf_folder(tmp_path / "source", model=False)
    tokenizer, stats = build_tokenizer(raw_dir, hf_cfg(folder), 7, roles_used(0.5, repo_context=False))
    n = stats["source_vocab_size"]
    assert stats["added_tokens"] == list(FIM) and stats["vocab_size"] == n + len(FIM)
    assert list(stats["special_tokens"]) == [EOS, *FIM]
    assert tokenizer.token_to_id(REPO[0]) is None
