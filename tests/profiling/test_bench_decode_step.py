"""The decode-step benchmark's busy share and kernel count from a profiler trace."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_decode_step as B  # noqa: E402


def _x(name, cat, ts, dur):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur}


def test_union_of_overlapping_intervals():
    assert B.union_ms([(0, 10), (5, 20), (30, 40), (35, 36)]) == 0.03
    assert B.union_ms([]) == 0.0


def test_busy_share_counts_kernels_and_copies_inside_the_step_window():
    ev = [
        _x("k0", "kernel", -50, 20),  # before the first step: not counted
        _x(B.STEP_RANGE, "user_annotation", 0, 100),
        _x("k", "kernel", 10, 50),
        _x("k", "kernel", 40, 30),
        _x("m", "gpu_memcpy", 90, 10),
        _x(B.STEP_RANGE, "user_annotation", 100, 100),
        _x("k", "kernel", 150, 100),
    ]
    got = B.trace_activity({"traceEvents": ev})
    # busy: [10, 70) + [90, 100) + [150, 250) = 170 us of a [0, 250) window
    assert got["busy_share"] == 170 / 250
    assert got["kernels_per_step"] == 1.5
    assert B.trace_activity({"traceEvents": []}) == {"busy_share": None, "kernels_per_step": None}
