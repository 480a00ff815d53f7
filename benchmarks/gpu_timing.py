"""GPU time of a call for the kernel benchmarks: warmed up, L2 flushed, median of repeats."""

from __future__ import annotations

import statistics


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
