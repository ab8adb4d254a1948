"""docs/extending.md's worked example, added the way the doc says: its OLMo folder written where an import
of kiln.model.olmo finds it and its registry line run. A config with family: olmo then validates, builds,
trains a step, counts its parameters and activations as the module has them, is priced, saved and
loaded, and exports to transformers' OlmoForCausalLM with the same logits and imports back. Then the
registry's own contract: config and plan reach every family without torch; an unknown or twice
registered family is an error naming it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln.model
from kiln import config as kiln_config
from kiln import hf
from kiln.config import hf_source
from kiln.config.models import model_config
from kiln.errors import KilnError
from kiln.model import registry
from kiln.model.build import build_model, load_model, save_model
from kiln.plan import memory

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)

DOC = Path(__file__).parents[3] / "docs" / "extending.md"
TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"
# A python block of the doc whose first line names its file: "# src/kiln/model/olmo/spec.py"
FILE_BLOCK = re.compile(r"```python\n# ([\w/.]+)[^\n]*\n(.*?)```", re.S)
SHAPE = {"family": "olmo", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64}
VOCAB, SEQ_LEN = 320, 32


@pytest.fixture
def olmo(tmp_path, monkeypatch):
    """The doc's folder as kiln.model.olmo, and its registry line run; both gone afterwards."""
    blocks = dict(FILE_BLOCK.findall(DOC.read_text(encoding="utf-8")))
    folder = tmp_path / "olmo"
    folder.mkdir()
    for path, text in blocks.items():
        if path.startswith("src/kiln/model/olmo/"):
            (folder / Path(path).name).write_text(text, encoding="utf-8")
    assert sorted(p.name for p in folder.iterdir()) == ["__init__.py", "hf.py", "module.py", "spec.py"]
    # kiln.model's folder gains tmp_path, as if the doc's folder were written into src/kiln/model/
    monkeypatch.setattr(kiln.model, "__path__", [*kiln.model.__path__, str(tmp_path)])
    exec(blocks["src/kiln/model/registry.py"], vars(registry))  # the one line, in the registry's namespace
    yield registry.get("olmo")
    registry.FAMILIES.pop("olmo")
    for name in [m for m in sys.modules if m == "kiln.model.olmo" or m.startswith("kiln.model.olmo.")]:
        del sys.modules[name]


def _validated_section(section: dict) -> dict:
    base = kiln_config.load(TINY)
    base.pop("model")
    return kiln_config.validate(base | {"model": section})["model"]


@pytest.mark.parametrize("tie", [True, False])
def test_a_config_of_the_docs_family_validates_builds_trains_and_saves(olmo, tmp_path, tie):
    cfg = model_config(_validated_section(SHAPE | {"tie_embeddings": tie}), vocab_size=VOCAB, seq_len=SEQ_LEN)
    assert (cfg.d_ff, cfg.max_positions) == (256, None)  # Llama's SwiGLU width, from the spec
    torch.manual_seed(0)
    model = build_model(cfg)
    assert type(model).__name__ == "Olmo" and not any("norm" in name for name, _ in model.named_parameters())
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN))
    _, loss = model(ids, ids)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())

    for non_embedding in (True, False):
        assert cfg.num_params(non_embedding) == model.num_params(non_embedding)
    block = model.blocks[0]
    assert memory.layer_params(cfg) == (sum(p.numel() for p in block.parameters()),) * 2
    assert memory.estimate(cfg, memory.Setting(micro_batch=2)).total > 0  # kiln plan prices it

    save_model(cfg, model.state_dict(), tmp_path)
    back = load_model(tmp_path)
    assert back.config == cfg and all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())


def test_the_docs_family_states_its_rules_and_is_listed_among_the_families(olmo):
    with pytest.raises(kiln_config.ConfigError, match="model.bias: olmo has no biases"):
        _validated_section(SHAPE | {"bias": True})
    with pytest.raises(kiln_config.ConfigError, match=r"model.norm_eps: olmo's LayerNorm has eps 1e-5, got 1e-06"):
        _validated_section(SHAPE | {"norm_eps": 1e-6})
    with pytest.raises(kiln_config.ConfigError, match="registered: gpt2, llama, starcoder2, olmo"):
        _validated_section(SHAPE | {"family": "bert"})


@pytest.mark.parametrize("bf16,compiled", [(True, False), (True, True), (False, False)])
def test_the_docs_family_counts_the_activations_autograd_saves(olmo, bf16, compiled):
    """The spec's block_activation_bytes against what one block's graph keeps (as
    tests/unit/plan/test_memory.py measures Llama's and StarCoder2's)."""
    from kiln.model.layers import rope_tables
    from kiln.train.cpu_memory import saved_for_backward

    cfg = model_config(SHAPE | {"n_layer": 1, "d_model": 128}, VOCAB, 128)
    tokens = 3 * cfg.seq_len  # 384 tokens: no activation has a weight's shape (C 128, K 64, F 512)
    torch.manual_seed(0)
    block = build_model(cfg).blocks[0]
    cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
    fn = torch.compile(block, backend="aot_eager_decomp_partition") if compiled else block
    x = torch.randn(3, cfg.seq_len, cfg.d_model, requires_grad=True)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return fn(x, cos, sin)

    forward().sum().backward()  # compiles
    _, saved = saved_for_backward(forward, exclude=[*block.parameters(), cos, sin])
    weights = {tuple(p.shape) for p in block.parameters()} | {tuple(p.shape)[::-1] for p in block.parameters()}
    tables = {(cfg.seq_len, cfg.head_dim)}  # cos and sin cast to bf16 by each block: per block, not per token
    activations = sum(s.nbytes for s in saved if s.shape not in weights | tables)
    assert activations == pytest.approx(memory.layer_activation_bytes(cfg, tokens, bf16, compiled), rel=0.02)


def test_the_docs_family_exports_to_transformers_with_its_logits_and_imports_back(olmo, tmp_path):
    from transformers import AutoModelForCausalLM, OlmoForCausalLM

    cfg = model_config(SHAPE | {"tie_embeddings": False}, vocab_size=VOCAB, seq_len=SEQ_LEN)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # weights that look trained: init's are too small for the logits to differ
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    hf.export(model, tmp_path / "hf")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs) is OlmoForCausalLM
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN))
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], theirs(ids).logits, atol=1e-4, rtol=1e-4)
    back = hf.load(tmp_path / "hf")
    assert back.config == cfg and all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    section = hf_source.model_section(tmp_path / "hf")
    assert section == {**SHAPE, "d_ff": 256, "norm_eps": 1e-5, "tie_embeddings": False, "rope_theta": 10000.0}


def test_a_family_without_a_mapping_trains_but_is_neither_exported_nor_imported(olmo, tmp_path):
    (tmp_path / "olmo" / "hf.py").unlink()
    model = build_model(model_config(SHAPE, vocab_size=VOCAB, seq_len=SEQ_LEN))
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN))
    model(ids, ids)[1].backward()
    assert registry.model_types() == ("gpt2", "llama", "qwen2", "qwen3", "starcoder2")
    with pytest.raises(KilnError, match=r"model.family olmo: no Hugging Face mapping \(kiln.model.olmo.hf does not"):
        hf.export(model, tmp_path / "hf")


def test_config_and_plan_reach_every_familys_spec_and_mapping_without_torch():
    code = """
import sys
import kiln.config
from kiln.config.models import model_config
from kiln.model import registry
from kiln.plan import memory
for name in registry.names():
    registry.get(name).spec, registry.get(name).hf
cfg = model_config({"flavour": "llama3.2-1b"}, vocab_size=32768, seq_len=8192)
memory.estimate(cfg, memory.Setting(micro_batch=1))
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:5]
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_unknown_or_twice_registered_family_is_named():
    with pytest.raises(KilnError, match=r"model.family: 'bert' is not one of gpt2, llama, starcoder2"):
        registry.get("bert")
    with pytest.raises(KilnError, match="model family 'llama' is registered twice"):
        registry.register("llama", "elsewhere.llama", "Llama", "again")
    assert registry.importing("bert") is None
    assert registry.model_types() == ("gpt2", "llama", "qwen2", "qwen3", "starcoder2")
