"""The rehearsal's count of a train step's peak (LiveBytes on fake tensors) against the same step run
with real tensors on this CPU (kiln.rehearse.calibration, as bench/rehearse_calibration.py compares
them): issue 59's calibration, within 10%. Four FSDP2 ranks run as rank 0 of torch's fake process
group, whose collectives return at once with real tensors too."""

from pathlib import Path

import pytest

from kiln.rehearse.calibration import cpu_run, rehearsed_and_measured

TINY = str(Path(__file__).resolve().parents[3] / "tests" / "configs" / "tiny.yaml")


@pytest.mark.parametrize(
    "micro, precision, ranks",
    [
        (8, "fp32", 1),  # Muon's and AdamW's state, made by the first step, alive through the second's backward
        (8, "bf16", 1),
        (2, "fp32", 4),  # FSDP2: sharded weights, gradients and state; each block gathered and freed
    ],
)
def test_a_cpu_steps_rehearsed_peak_is_within_10_percent_of_its_measured_one(micro, precision, ranks):
    rehearsed, measured = rehearsed_and_measured(*cpu_run([TINY], micro, precision, ranks))
    assert 0.9 < rehearsed / measured < 1.1, f"rehearsed {rehearsed:,} B, measured {measured:,} B"
