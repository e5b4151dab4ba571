"""The account of the GPU's idle time between launched batches (``encode.idle.gpu_idle``): each gap
is given to the host step that came after the device ran dry, and the parts add up to the idle
time inside the span. The stage fills the timeline on a GPU only (tests/test_gpu_launch.py)."""

from __future__ import annotations

import pytest

from shardsmith.encode.idle import gpu_idle


def row(staged, begin, end, start, stop):
    return (staged, begin, end, start, stop)


def test_each_gap_goes_to_the_step_that_came_late():
    tl = [
        row(0.00, 0.00, 0.01, 0.02, 1.00),   # first batch
        row(0.10, 0.10, 0.11, 1.00, 2.00),   # queued long before: no gap
        row(2.50, 2.50, 2.51, 2.60, 3.00),   # staged after the device ran dry at 2.00: pixels, 0.60 s
        row(2.60, 3.20, 3.21, 3.30, 4.00),   # staged in time, queued after 3.00: launch, 0.30 s
        row(3.00, 3.10, 3.20, 4.05, 5.00),   # queued in time, started 0.05 s late anyway: device
    ]
    got = gpu_idle(tl)
    assert got["gaps"] == 3
    assert got["by_cause_s"] == {"pixels": 0.6, "launch": 0.3, "device": 0.05}
    assert got["idle_s"] == pytest.approx(0.95) and got["span_s"] == pytest.approx(4.98)
    assert got["idle_frac"] == pytest.approx(0.95 / 4.98, abs=1e-4)


def test_order_is_the_devices_and_overlap_is_no_gap():
    # given out of order (as batches complete), and a batch that overlaps the one before (another stream)
    tl = [row(1.0, 1.0, 1.1, 1.9, 3.0), row(0.0, 0.0, 0.1, 0.2, 2.0)]
    got = gpu_idle(tl)
    assert got["gaps"] == 0 and got["idle_s"] == 0.0 and got["span_s"] == pytest.approx(2.8)


def test_fewer_than_two_batches_give_nothing():
    assert gpu_idle([]) is None
    assert gpu_idle([row(0, 0, 0, 0, 1)]) is None
