"""Token healing: the prompt's last token is dropped and the first new token must start with its
text; a model that learnt "):" + "\\n    " continues "def f(x):\\n" with its body only when healed."""

from __future__ import annotations

import pytest
import torch

from kiln.config.models import ModelConfig
from kiln.generate.decode import generate
from kiln.generate.healing import complete, heal
from kiln.model.build import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
CODE = "def f(x):\n    return x\n\n"


def test_heal_drops_the_last_token_and_allows_its_extensions(tokenizer):
    ids = tokenizer.encode("def f(x):\n", add_special_tokens=False).ids
    kept, allowed, cut = heal(tokenizer, ids)
    assert kept == ids[:-1] and cut == "\n"
    last = tokenizer.id_to_token(ids[-1])
    tokens = [tokenizer.id_to_token(i) for i in allowed]
    assert ids[-1] in allowed and all(t.startswith(last) for t in tokens)
    assert any(t != last and t.strip("Ċ") for t in tokens)  # a newline merged with indentation
    assert not set(allowed) & set(tokenizer.get_added_tokens_decoder())  # never a special token


def test_heal_leaves_one_token_and_special_endings_alone(tokenizer):
    one = tokenizer.encode("def", add_special_tokens=False).ids
    assert len(one) == 1 and heal(tokenizer, one) == (one, None, "")
    # (a special token's spelling in text is ordinary text here, so the id is appended)
    fim = tokenizer.encode("x = 1", add_special_tokens=False).ids + [tokenizer.token_to_id("<fim_middle>")]
    assert heal(tokenizer, fim) == (fim, None, "")


def test_first_allowed_restricts_the_first_token_only():
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="gpt2", vocab_size=64, seq_len=32, n_layer=1, n_head=2, d_model=32)).eval()
    prompts = [[1, 2, 3], [4, 5]]
    free = generate(model, prompts, 4)
    forced = generate(model, prompts, 4, first_allowed=[[7], None])
    assert forced[0][0] == 7 and forced[1] == free[1]


@pytest.mark.slow
def test_a_model_that_learnt_the_merged_newline_writes_the_body_only_when_healed(tokenizer):
    ids = tokenizer.encode(CODE * 40, add_special_tokens=False).ids
    assert tokenizer.encode(CODE, add_special_tokens=False).ids[-4:] != [tokenizer.token_to_id("Ċ")] * 4
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(family="gpt2", vocab_size=tokenizer.get_vocab_size(), seq_len=32, n_layer=2, n_head=2, d_model=64)
    )
    data = torch.tensor(ids)
    rows = torch.stack([data[i : i + 33] for i in range(0, len(ids) - 33, 3)])  # (N, 33)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(rows[:, :-1], rows[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3
    model.eval()
    [healed] = complete(model, tokenizer, ["def f(x):\n"], 6)
    assert healed.startswith("    return x")
    # Without healing the prompt ends in a lone newline token, which the model has only seen at the
    # end of a line (before "def" or a blank line), never after "):".
    raw = tokenizer.encode("def f(x):\n", add_special_tokens=False).ids
    [unhealed] = generate(model, [raw], 6, vocab_size=tokenizer.get_vocab_size())
    assert not tokenizer.decode(unhealed).startswith("    return x")
