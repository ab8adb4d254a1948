"""Stock Hugging Face checkpoints of each family Kiln continues (kiln.config.hf_source), made by
transformers itself, small and random, saved with save_pretrained (offline): Kiln reads the shape
from config.json, loads the weights, and gives transformers' loss and logits (fp32, 1e-4); its
export loads back into the same transformers class with the same logits. Then the shape rules: a
model section that contradicts the source, and features Kiln lacks, are errors naming the field."""

import json

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Starcoder2Config,
    Starcoder2ForCausalLM,
)
from transformers.modeling_rope_utils import _compute_llama3_parameters

from kiln import hf
from kiln.config import hf_source
from kiln.config.models import ModelConfig, ModelConfigError, RopeScaling
from kiln.errors import KilnError
from kiln.model.build import build_model
from kiln.model.layers import rope_frequencies

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)

VOCAB = 320
WINDOW = 48  # StarCoder2's sliding window here, and the length of the test batch's rows (_ids)
# Llama 3.1's scaling shrunk to a 16-wide head: wavelengths 6 (kept), 32 (blended) and >= 164
# positions (divided by factor), so all three of its regimes are in the logits.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
LLAMA_DIMS = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
FAMILIES = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=2)),
    "llama3": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            max_position_embeddings=256,
            rope_parameters=LLAMA3_ROPE,
            tie_word_embeddings=True,
            **LLAMA_DIMS,
        )
    ),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, max_position_embeddings=256, **LLAMA_DIMS)),
    # bigcode's shape: untied (as starcoder2-15b), a sliding window shorter than the positions. The
    # window is the test batch's length: Kiln's full attention must equal it there, at its edge.
    "starcoder2": lambda: Starcoder2ForCausalLM(
        Starcoder2Config(
            vocab_size=VOCAB,
            max_position_embeddings=256,
            sliding_window=WINDOW,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            tie_word_embeddings=False,
            **LLAMA_DIMS,
        )
    ),
}
EXPECTED = {  # what Kiln reads from each config.json
    "gpt2": dict(family="gpt2", vocab_size=50257, seq_len=128, max_positions=128, bias=True, tie_embeddings=True),
    "llama3": dict(
        family="llama",
        n_kv_head=2,
        seq_len=256,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64),
        qkv_bias=False,
        tie_embeddings=True,
        norm_eps=1e-6,
    ),
    "qwen2": dict(family="llama", n_kv_head=2, d_ff=96, rope_scaling=None, qkv_bias=True, tie_embeddings=False),
    "starcoder2": dict(
        family="starcoder2",
        n_kv_head=2,
        d_ff=96,
        seq_len=WINDOW,  # the positions Kiln computes exactly: the window, not max_position_embeddings
        sliding_window=WINDOW,
        rope_theta=100000.0,
        bias=True,
        tie_embeddings=False,
        norm_eps=1e-5,
    ),
}


def _stock(family: str, folder):
    """transformers' model of `family`, every weight moved off its init (Qwen2's biases start at
    zero, norms at one: a mapping that dropped them would not show otherwise), saved to folder."""
    torch.manual_seed(0)
    theirs = FAMILIES[family]().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs.save_pretrained(folder)
    return theirs


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, WINDOW), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stock_checkpoint_gives_transformers_loss_and_logits_and_exports_back(family, tmp_path):
    theirs = _stock(family, tmp_path / "source")
    cfg = hf_source.source_config(tmp_path / "source")
    assert {k: getattr(cfg, k) for k in EXPECTED[family]} == EXPECTED[family]
    assert ModelConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg  # model_config.json round trip
    ours = hf.load(tmp_path / "source")
    assert ours.config == cfg
    assert cfg.num_params(non_embedding=False) == ours.num_params(non_embedding=False) == theirs.num_parameters()
    idx = _ids(cfg.vocab_size)
    with torch.no_grad():
        reference = theirs(idx, labels=idx)  # transformers shifts the labels itself
        _, loss = ours(idx[:, :-1], idx[:, 1:])
        torch.testing.assert_close(loss, reference.loss, rtol=0, atol=1e-4)
        logits = ours(idx)[0]
        torch.testing.assert_close(logits, reference.logits, rtol=0, atol=1e-4)
    hf.export(ours, tmp_path / "back")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back) is type(theirs)
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, logits, rtol=0, atol=1e-4)


def test_llama3_scaling_is_transformers_and_changes_the_model(tmp_path):
    """The frequencies equal _compute_llama3_parameters' at Llama 3.1-8B's own numbers, and a model
    without the scaling computes other logits (the parity above is not RoPE-blind)."""
    config = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=131072,
        rope_parameters=LLAMA3_ROPE | {"original_max_position_embeddings": 8192},
    )
    reference, _ = _compute_llama3_parameters(config)
    ours = rope_frequencies(128, 500000.0, RopeScaling(8.0, 1.0, 4.0, 8192))
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=0)
    plain = rope_frequencies(128, 500000.0)
    assert ours[0] == plain[0] and ours[-1] == pytest.approx(plain[-1] / 8)  # fast kept, slow divided

    _stock("llama3", tmp_path)
    scaled = hf.load(tmp_path)
    unscaled = build_model(ModelConfig(**{**scaled.config.to_dict(), "rope_scaling": None}))
    unscaled.load_state_dict(scaled.state_dict())
    idx = _ids(VOCAB)
    with torch.no_grad():
        assert (scaled(idx)[0] - unscaled.eval()(idx)[0]).abs().max() > 1e-3


def test_a_model_section_may_restate_the_source_but_not_contradict_it(tmp_path):
    _stock("qwen2", tmp_path)
    agreeing = {"family": "llama", "n_layer": 2, "d_model": 64, "n_kv_head": 2, "dropout": 0.1, "document_mask": True}
    cfg = hf_source.source_config(tmp_path, agreeing)
    assert (cfg.n_layer, cfg.qkv_bias, cfg.dropout, cfg.document_mask) == (2, True, 0.1, True)  # the run's choices
    assert hf_source.model_section(tmp_path, agreeing)["document_mask"] is True
    with pytest.raises(ModelConfigError) as error:
        hf_source.source_config(tmp_path, {"n_layer": 4, "d_model": 64, "tie_embeddings": True})
    assert error.value.problems == [
        f"model.n_layer: 4 in the config, but the source has num_hidden_layers = 2 ({tmp_path / 'config.json'}); "
        "drop model.n_layer to take the source's",
        f"model.tie_embeddings: True in the config, but the source has tie_word_embeddings = False "
        f"({tmp_path / 'config.json'}); drop model.tie_embeddings to take the source's",
    ]
    with pytest.raises(
        ModelConfigError, match=r"model.family: 'gpt2' in the config, but the source has model_type 'qwen2', Kiln"
    ):
        hf_source.source_config(tmp_path, {"family": "gpt2"})
    with pytest.raises(
        ModelConfigError, match=r"model.rope_theta: 500000.0 in the config, but the source has rope_param"
    ):
        hf_source.source_config(tmp_path, {"flavour": "llama3.2-1b"})  # a flavour's numbers count as set


@pytest.mark.parametrize(
    "family,change,message",
    [
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window = True is not supported"),
        ("llama3", {"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported \(Kiln supports silu or relu2\)"),
        ("llama3", {"attention_bias": True}, r"attention_bias = True is not supported \(Kiln supports False"),
        ("llama3", {"head_dim": 32}, r"head_dim = 32 is not supported \(Kiln supports hidden_size / num_attention"),
        ("llama3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type = 'yarn' is not supported"),
        (
            "gpt2",
            {"activation_function": "relu"},
            r"activation_function = 'relu' is not supported \(Kiln supports gelu_new",
        ),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx = True is not supported"),
        ("starcoder2", {"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported \(Kiln supports gelu_new or"),
        (
            "starcoder2",
            {"norm_type": "rms_norm"},
            r"norm_type = 'rms_norm' is not supported \(Kiln supports 'layer_norm'",
        ),
        ("starcoder2", {"rope_parameters": LLAMA3_ROPE}, r"rope_scaling = 'llama3' is not supported"),
        (
            "gpt2",
            {"model_type": "mistral"},
            r"model_type 'mistral' is not one Kiln imports \(supported: gpt2, llama, qwen2, qwen3, starcoder2\)",
        ),
    ],
)
def test_what_kiln_does_not_implement_is_an_error_naming_the_field(family, change, message, tmp_path):
    _stock(family, tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    with pytest.raises(KilnError, match=message):
        hf_source.source_config(tmp_path)


def test_a_starcoder2_context_past_its_window_is_refused_and_within_it_equals_transformers(tmp_path):
    """Kiln's full attention is StarCoder2's windowed attention only up to the window: one position
    more and transformers' logits differ, so a run whose context exceeds the window is an error."""
    theirs = _stock("starcoder2", tmp_path)
    section = hf_source.model_section(tmp_path)
    assert section["sliding_window"] == WINDOW and section["bias"] is True
    with pytest.raises(ModelConfigError, match=rf"model.sliding_window: .* last {WINDOW} positions .*seq_len=49"):
        ModelConfig(vocab_size=VOCAB, seq_len=WINDOW + 1, **section)
    ours = build_model(ModelConfig(vocab_size=VOCAB, seq_len=WINDOW + 1, **{**section, "sliding_window": None}))
    ours.load_state_dict(hf.load(tmp_path).state_dict())
    idx = torch.randint(0, VOCAB, (1, WINDOW + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (ours.eval()(idx)[0] - theirs(idx).logits).abs()
    assert diff[:, :WINDOW].max() < 1e-4 and diff[:, WINDOW].max() > 1e-3  # only the last row sees past it
