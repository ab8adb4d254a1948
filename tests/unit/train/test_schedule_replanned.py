"""The schedule of a run whose max_steps is re-planned as it goes (kiln.train.schedule.Replanned): lr_at
bit for bit until a re-plan, no jump at one, and the same LR at every step for the same re-plans."""

from __future__ import annotations

import pytest

from kiln.train.schedule import Replanned, lr_at

BASE = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10)
KINDS = [
    dict(kind="wsd", decay_fraction=0.3, cooldown="1-sqrt"),
    dict(kind="wsd", decay_fraction=0.2, cooldown="linear"),
    dict(kind="cosine"),
    dict(kind="constant"),
]


@pytest.mark.parametrize("kw", KINDS)
def test_without_a_replan_it_is_lr_at_bit_for_bit(kw):
    schedule = Replanned(max_steps=100, **BASE, **kw)
    assert [schedule(s) for s in range(120)] == [lr_at(s, max_steps=100, **BASE, **kw) for s in range(120)]


@pytest.mark.parametrize("kw", KINDS)
@pytest.mark.parametrize("at", [5, 40, 75, 90])  # warmup, stable phase, early and late in the cooldown
@pytest.mark.parametrize("to", [80, 95, 140])  # shortened a lot, a little, lengthened
def test_a_replan_changes_the_slope_never_the_value(kw, at, to):
    before = Replanned(max_steps=100, **BASE, **kw)
    after = Replanned(max_steps=100, **BASE, **kw)
    after.replan(at, max(to, at + 1))
    assert [after(s) for s in range(at)] == [before(s) for s in range(at)]  # the past is not rewritten
    assert after(at) == pytest.approx(before(at), rel=1e-12)  # continuous where it takes over
    new_end = max(to, at + 1)
    assert after(new_end) == (BASE["lr"] if kw["kind"] == "constant" else BASE["min_lr"])
    values = [after(s) for s in range(new_end + 1)]
    if kw["kind"] != "constant":
        assert all(b <= a * (1 + 1e-12) for a, b in zip(values[10:], values[11:]))  # never rises after warmup


def test_a_replan_in_the_stable_phase_is_the_new_lengths_own_schedule():
    kw = dict(BASE, kind="wsd", decay_fraction=0.3, cooldown="1-sqrt")
    schedule = Replanned(max_steps=1000, **kw)
    schedule.replan(200, 800)
    assert [schedule(s) for s in range(200, 900)] == [lr_at(s, max_steps=800, **kw) for s in range(200, 900)]


def test_a_shortening_past_the_cooldown_start_begins_the_cooldown_at_once():
    kw = dict(BASE, kind="wsd", decay_fraction=0.3, cooldown="linear")
    schedule = Replanned(max_steps=1000, **kw)
    schedule.replan(650, 700)  # 700's own cooldown would have started at 490
    assert schedule(649) == BASE["lr"] and schedule(650) == pytest.approx(BASE["lr"])
    assert schedule(675) == pytest.approx(BASE["min_lr"] + 0.5 * (BASE["lr"] - BASE["min_lr"]))
    assert schedule(700) == BASE["min_lr"]


def test_the_same_replans_give_the_same_schedule_and_they_run_forwards():
    kw = dict(BASE, kind="wsd", decay_fraction=0.3, cooldown="1-sqrt")
    one, two = Replanned(max_steps=300, **kw), Replanned(max_steps=300, **kw)
    for step, steps in [(50, 280), (230, 260), (240, 300), (250, 255)]:
        one.replan(step, steps)
        two.replan(step, steps)
    assert [one(s) for s in range(320)] == [two(s) for s in range(320)]
    assert one.max_steps == 255
    with pytest.raises(ValueError, match="re-plans run forwards"):
        one.replan(100, 200)
