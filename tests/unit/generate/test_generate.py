"""KV-cached, batched decoding: the cache reproduces the full forward, padding changes nothing,
greedy decoding matches the plain uncached loop, sampling keeps to its top-k/top-p support, stop
ids end each row on its own, and the eval callers get what one-by-one decoding gives."""

from __future__ import annotations

import pytest
import torch
from conftest import typed_section

from kiln.config.models import ModelConfig
from kiln.data.sources import Document
from kiln.data.tokenizer import EOS
from kiln.eval.infill import _prompt, make_problems, run_infill
from kiln.eval.metrics.completions.compute import completions
from kiln.generate.decode import generate, pick
from kiln.generate.healing import heal
from kiln.model.build import build_model
from kiln.model.kv_cache import KVCache

GPT_CFG = ModelConfig(family="gpt2", vocab_size=128, seq_len=32, n_layer=2, n_head=2, d_model=32, bias=True)
LLAMA_CFG = ModelConfig(family="llama", vocab_size=128, seq_len=32, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
CONFIGS = pytest.mark.parametrize("cfg", [GPT_CFG, LLAMA_CFG], ids=["gpt2", "llama"])
LENGTHS = (3, 11, 7, 1)  # prompts of different lengths, unsorted
CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))
DOCS = [Document(f"d/{i}", CODE.replace("x", f"v{i}"), f"{i}.py", "d") for i in range(6)]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


def _model(cfg: ModelConfig, std: float | None = 0.3):
    """A random model with its matrices at std (None: GPT-2's init). At GPT-2's 0.02 it decodes one
    token over and over, and comparisons of greedy outputs would show little."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and std is not None:
                p.normal_(0.0, std)
    return model


def _prompts(lengths=LENGTHS, vocab: int = 128) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def _uncached_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The decoding loop before the cache: the whole sequence through the model for every token."""
    ids = list(prompt)
    for _ in range(n):
        logits, _ = model(torch.tensor([ids]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


@CONFIGS
@torch.no_grad()
def test_cached_logits_match_the_full_forward(cfg):
    """A first chunk, a second chunk over a filled cache (explicit mask), then token by token."""
    model = _model(cfg, std=None)
    [ids] = _prompts([20])
    full, _ = model(torch.tensor([ids]))  # (1, 20, V)
    cache = KVCache.for_model(model, [0], 20)
    bounds = [0, 6, 11, *range(12, 21)]
    for start, end in zip(bounds, bounds[1:]):
        logits, _ = model(torch.tensor([ids[start:end]]), cache=cache)
        assert logits.shape == (1, 1, cfg.vocab_size)
        torch.testing.assert_close(logits[0, 0], full[0, end - 1], rtol=0, atol=1e-5)
    assert cache.length == 20


@CONFIGS
@torch.no_grad()
def test_left_padding_does_not_change_a_rows_logits(cfg):
    model = _model(cfg, std=None)
    prompts, steps = _prompts(), _prompts([4] * len(LENGTHS), vocab=cfg.vocab_size)
    width = max(LENGTHS)
    idx = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        idx[b, width - len(p) :] = torch.tensor(p)
    cache = KVCache.for_model(model, [width - n for n in LENGTHS], width + 4)
    batched = [model(idx, cache=cache)[0][:, 0]]
    for t in range(4):
        batched.append(model(torch.tensor([s[t] for s in steps])[:, None], cache=cache)[0][:, 0])
    for b, p in enumerate(prompts):
        alone, _ = model(torch.tensor([p + steps[b]]))  # (1, n + 4, V)
        expected = alone[0, len(p) - 1 :]
        torch.testing.assert_close(torch.stack([x[b] for x in batched]), expected, rtol=0, atol=1e-5)


@CONFIGS
def test_greedy_matches_the_uncached_loop(cfg):
    model = _model(cfg)
    for prompt in _prompts():
        assert generate(model, [prompt], 12) == [_uncached_greedy(model, prompt, 12)]


@CONFIGS
@pytest.mark.parametrize("batch_size", [None, 3])
def test_batched_equals_one_by_one(cfg, batch_size):
    model = _model(cfg)
    prompts = _prompts()
    one_by_one = [generate(model, [p], 15)[0] for p in prompts]
    assert generate(model, prompts, 15, batch_size=batch_size) == one_by_one
    assert all(len(row) == 15 for row in one_by_one)


@CONFIGS
def test_long_prompt_is_cropped_from_the_left(cfg):
    model = _model(cfg)
    [long] = _prompts([40])
    assert generate(model, [long], 10) == generate(model, [long[-(cfg.seq_len - 10) :]], 10)
    # max_new_tokens past the context: capped at seq_len - 1, keeping the prompt's last token
    [out] = generate(model, [long], 100)
    assert out == _uncached_greedy(model, long[-1:], cfg.seq_len - 1)
    # keep_first (a BOS): a prompt starting with it keeps it first; one that does not is cropped as before
    room = cfg.seq_len - 10
    bos_kept = [long[0], *long[-(room - 1) :]]
    assert generate(model, [long], 10, keep_first=long[0]) == generate(model, [bos_kept], 10)
    assert generate(model, [long], 10, keep_first=long[0]) != generate(model, [long], 10)
    assert generate(model, [long], 10, keep_first=long[0] + 1) == generate(model, [long], 10)


def test_stop_ids_end_each_row_on_its_own_and_keep_stop_keeps_them():
    model = _model(GPT_CFG)
    a, b = _prompts([5, 9])
    free_a, free_b = generate(model, [a, b], 15)
    stop = next(t for t in free_a[2:] if t not in free_b and t not in free_a[:2])
    cut = free_a.index(stop)
    assert generate(model, [a, b], 15, stop_ids=frozenset({stop})) == [free_a[:cut], free_b]
    assert generate(model, [a, b], 15, stop_ids=frozenset({stop}), keep_stop=True) == [free_a[: cut + 1], free_b]


@CONFIGS
def test_top_k_one_and_a_tiny_top_p_are_greedy(cfg):
    model = _model(cfg)
    prompts = _prompts()
    greedy = generate(model, prompts, 10)
    g = torch.Generator().manual_seed(3)
    assert generate(model, prompts, 10, temperature=1.5, top_k=1, generator=g) == greedy
    assert generate(model, prompts, 10, temperature=1.5, top_p=1e-6, generator=g) == greedy


def test_top_k_and_top_p_restrict_the_support():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])  # ranked: 1, 3, 2, 0
    logits = probs.log().expand(4000, 4)
    g = torch.Generator().manual_seed(0)

    def support(**kw) -> set[int]:
        settings = {"temperature": 1.0, "top_k": None, "top_p": 1.0} | kw
        return set(pick(logits, generator=g, **settings).tolist())

    assert support() == {0, 1, 2, 3}
    assert support(top_k=2) == {1, 3}
    assert support(top_p=0.75) == {1, 3}  # 0.5 + 0.3 covers it
    assert support(top_p=0.85) == {1, 3, 2}
    assert support(top_k=3, top_p=0.99) == {1, 3, 2}
    assert pick(logits[:2], 0.0, None, 1.0, None).tolist() == [1, 1]


def test_sampling_is_deterministic_for_a_seed_and_keeps_to_the_vocab():
    model = _model(LLAMA_CFG)
    prompts = _prompts()

    def sample(seed: int) -> list[list[int]]:
        return generate(
            model,
            prompts,
            12,
            temperature=1.0,
            top_k=50,
            top_p=0.95,
            vocab_size=100,
            generator=torch.Generator().manual_seed(seed),
        )

    first = sample(5)
    assert first == sample(5) and first != sample(6)
    assert all(0 <= t < 100 for row in first for t in row)


def test_empty_prompt_raises():
    with pytest.raises(ValueError, match="at least one token"):
        generate(_model(GPT_CFG), [[1, 2], []], 4)


def test_infill_decodes_in_batches_as_one_by_one(tokenizer):
    cfg = ModelConfig(family="gpt2", vocab_size=512, seq_len=96, n_layer=1, n_head=2, d_model=32)
    model, problems = _model(cfg), make_problems(DOCS, 3, seed=0)
    result = run_infill(model, tokenizer, problems)
    assert len(result["examples"]) == 2 * len(problems)
    stop = frozenset({tokenizer.token_to_id(EOS), tokenizer.token_to_id("<file_sep>")})
    for ex, (problem, layout) in zip(result["examples"], [(p, lay) for p in problems for lay in ("psm", "spm")]):
        assert (ex["doc_id"], ex["layout"]) == (problem.doc_id, layout)
        [alone] = generate(
            model,
            [_prompt(problem, tokenizer, layout, cfg.seq_len - 64)],
            64,
            stop_ids=stop,
            vocab_size=tokenizer.get_vocab_size(),
        )
        assert ex["completion"] == tokenizer.decode(alone, skip_special_tokens=False)


def test_completions_greedy_and_sampled_per_prompt(tokenizer):
    model = _model(ModelConfig(family="llama", vocab_size=512, seq_len=32, n_layer=1, n_head=2, d_model=32))
    cfg = typed_section(
        "eval",
        {"prompts": ["import os\n", "def f(x):\n"], "max_new_tokens": 5, "temperature": 0.8, "top_k": 50, "top_p": 0.9},
    )
    rows = completions(model, tokenizer, cfg, seed=0)
    assert [r["prompt"] for r in rows] == list(cfg.prompts)
    assert rows == completions(model, tokenizer, cfg, seed=0)
    # greedy is generate() on the healed prompt, the healed text taken off the front
    ids, allowed, cut = heal(tokenizer, tokenizer.encode("def f(x):\n", add_special_tokens=False).ids)
    [greedy] = generate(
        model,
        [ids],
        5,
        stop_ids=frozenset({tokenizer.token_to_id(EOS)}),
        vocab_size=tokenizer.get_vocab_size(),
        first_allowed=[allowed],
    )
    text = tokenizer.decode(greedy, skip_special_tokens=False)
    assert cut == "\n" and text.startswith(cut) and rows[1]["greedy"] == text[len(cut) :]
