"""kiln.train.gc_control: the collector is off inside fit, collects young objects every N steps on
the loop's schedule, and is as it was afterwards."""

from __future__ import annotations

import gc

from kiln.train.gc_control import GarbageCollection


def _collections(generation: int):
    seen = []

    def callback(phase, info):
        if phase == "start" and info["generation"] == generation:
            seen.append(info)

    return seen, callback


def test_collections_happen_only_on_the_loops_schedule_and_the_collector_is_restored():
    assert gc.isenabled()
    young, callback = _collections(1)
    gc.callbacks.append(callback)
    try:
        with GarbageCollection(every=3) as collector:
            assert not gc.isenabled() and gc.get_freeze_count() > 0
            for step in range(1, 10):
                for _ in range(2000):  # far past the 700-allocation threshold: no automatic collection
                    a = []
                    a.append(a)  # a reference cycle, the garbage only the collector frees
                collector.step(step)
            assert len(young) == 3  # steps 3, 6 and 9
    finally:
        gc.callbacks.remove(callback)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with GarbageCollection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
