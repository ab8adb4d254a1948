"""What decoding asks of the device, counted by kiln.generate.ops' dispatch mode: host syncs that do
not grow with the tokens decoded (the stops read every STOP_CHECK_EVERY tokens, sampling without a
read-back), a sample that is torch.multinomial's (a seed's CPU draws as before), and the price
model's kernels a step (kiln.plan.decode) held to the count."""

from __future__ import annotations

import pytest
import torch

from kiln.generate.decode import STOP_CHECK_EVERY, pick
from kiln.generate.ops import COUNTED_MODELS, PADDED_PROMPTS, count_generate, count_step_kernels
from kiln.model.build import build_model
from kiln.plan.decode import KERNELS_OUTSIDE_LAYERS, KERNELS_PER_LAYER

KERNEL_TOLERANCE = 0.1  # the price's kernels within 10% of the count

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_host_syncs_do_not_grow_with_the_tokens(temperature):
    """A stop id that never comes: the batch decodes every token, reading its stops every
    STOP_CHECK_EVERY tokens and nothing else per token (one step's read-back would add 32 here)."""
    torch.manual_seed(0)
    model = build_model(COUNTED_MODELS["llama"]).eval()

    def syncs(tokens: int, stop_ids: frozenset[int]) -> int:
        generator = torch.Generator().manual_seed(0)
        kwargs = {"temperature": temperature, "generator": generator, "stop_ids": stop_ids, "vocab_size": 127}
        return count_generate(model, PADDED_PROMPTS, tokens, **kwargs).syncs

    stop = frozenset({127})  # outside vocab_size: never chosen
    assert syncs(64, stop) - syncs(32, stop) <= 32 // STOP_CHECK_EVERY
    assert syncs(64, frozenset()) == syncs(32, frozenset())  # no stop ids: nothing to read


def test_a_sample_is_torch_multinomials_draw():
    """The same ids as torch.multinomial from a generator of the same seed: a seed's CPU samples are
    what they were before sampling stopped reading back from the device."""
    probs = torch.softmax(torch.randn(16, 500, generator=torch.Generator().manual_seed(1)), dim=-1)
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(3):
        expected = torch.multinomial(probs, 1, generator=theirs).squeeze(-1)
        assert torch.equal(pick(probs.log(), 1.0, None, 1.0, ours), expected)


@pytest.mark.parametrize("family", sorted(COUNTED_MODELS))
def test_the_price_models_kernels_are_the_counted_ones(family):
    """kiln.plan.decode prices a step's launches with KERNELS_PER_LAYER and KERNELS_OUTSIDE_LAYERS:
    within KERNEL_TOLERANCE of a greedy step's kernels under bf16 autocast, as a GPU's eval runs."""
    counted = count_step_kernels(COUNTED_MODELS[family], autocast_bf16=True)
    assert KERNELS_PER_LAYER[family] == pytest.approx(counted.per_layer, rel=KERNEL_TOLERANCE)
    assert KERNELS_OUTSIDE_LAYERS[family] == pytest.approx(counted.outside_layers, rel=KERNEL_TOLERANCE)
