"""GPU time of a call for the kernel benchmarks: warmed up, L2 flushed, median of repeats; and
the JSON file a benchmark writes."""

from __future__ import annotations

import json
import os
import statistics


def write_json(path: str | None, out: dict) -> None:
    """Write a benchmark's result to ``path`` (its folder made), if a path was given."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def median_us(torch, fn, flush, reps: int, guard_cycles: int = 2_000_000) -> float:
    """Median of CUDA-event timings of fn after warm-up, the L2 flushed before each (``flush``:
    a buffer larger than L2, zeroed), then a ~1 ms GPU spin so the host has queued all of fn's
    launches before the start event fires: the timing is GPU time, as inside a CUDA graph, not
    Python launch overhead."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda._sleep(guard_cycles)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
