"""What a handoff's history backup costs the engine thread: one device-to-host copy per KV
source (HiSparse's ``_backup`` before 6c3ab09) against the engine's one strided 2-D copy for all
sources (``systems/host_copy.copy_blocks_to_host``, which says in its ``calls`` if it fell back).

    python benchmarks/bench_host_copy.py --out results/host_copy/h100.json

A HiSparse handoff copies a request's history, (S, T, row_bytes) on the GPU, into S runs of the
pinned host store, one per source (glm53_h200: S = 26 sources, 656-byte rows, 279 MB at 16K
tokens). PyTorch has no strided cross-device ``copy_`` that stays one DMA (it goes through
temporaries, synchronously), so the backend queues S copies, each a slice pair and a
``cudaMemcpyAsync``. ``cudaMemcpy2DAsync`` moves the same bytes in one call: the source's rows
are S blocks of ``T * row_bytes`` a source's stride apart, and so are the host store's.

For each way the script times, with the GPU kept busy first (so nothing waits for the copies and
the host time is the queueing alone), the host time to queue one request's copies, and then the
copies' own time on the GPU (CUDA events), medians of ``--repeats``. It checks that both ways
leave the same bytes in the host store and exits 1 when they do not. The bandwidth is shown
beside the PCIe ceiling (the H200 measured 55.2 GB/s device-to-host from pinned memory).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpu_timing import write_json  # noqa: E402  (benchmarks/, the script's folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sources", type=int, default=26, help="KV sources S (glm53_h200: 26)")
    ap.add_argument("--tokens", type=int, default=16384, help="history rows per source T")
    ap.add_argument("--row-bytes", type=int, default=656, help="bytes of a KV row")
    ap.add_argument("--pool-rows", type=int, default=65536, help="host store rows per source")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--pcie-gbs", type=float, default=55.2, help="D2H ceiling, GB/s (H200: 55.2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from systems.host_copy import copy_blocks_to_host
    from systems.kv.host_memory import pinned_empty

    if not torch.cuda.is_available():
        print("bench_host_copy: needs a CUDA GPU (pinned memory, DMA); nothing timed")
        return 0
    torch.cuda.init()
    S, T, rb, N = args.sources, args.tokens, args.row_bytes, args.pool_rows
    if T > N:
        ap.error(f"--tokens {T} exceeds --pool-rows {N}")
    src = torch.randint(0, 256, (S, T, rb), dtype=torch.uint8, device="cuda")
    pool = pinned_empty((S, N, rb), torch.uint8)
    h = N - T  # the run's first host row: the last T rows of each source's slice
    calls = {}

    def per_source():
        for s in range(S):
            pool[s, h : h + T].copy_(src[s, 0:T], non_blocking=True)
        calls["per_source_copy_"] = S

    def engine_path():  # what HiSparse's _backup calls
        calls["copy_blocks_to_host"] = copy_blocks_to_host(pool[:, h : h + T], src)

    ways = {"per_source_copy_": per_source, "copy_blocks_to_host": engine_path}
    rows, bad = [], 0
    expect = src.cpu()
    for name, fn in ways.items():
        pool.zero_()
        fn()
        torch.cuda.synchronize()
        same = torch.equal(pool[:, h : h + T], expect)
        bad += not same
        host, gpu = [], []
        for _ in range(args.repeats):
            torch.cuda._sleep(50_000_000)  # the GPU busy: queueing never waits for a copy
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            b.record()
            torch.cuda.synchronize()
            gpu.append(a.elapsed_time(b))
        ms = statistics.median(gpu)
        row = {
            "way": name,
            "bytes_equal": same,
            "calls": calls[name],
            "host_ms": statistics.median(host),
            "host_ms_max": max(host),
            "copy_ms": ms,
            "copy_gbs": S * T * rb / ms / 1e6,
            "floor_ms": S * T * rb / args.pcie_gbs / 1e6,
        }
        rows.append(row)
        print(
            f"{name:>19} ({calls[name]} calls): host {row['host_ms']:.3f} ms (max {row['host_ms_max']:.3f}), "
            f"copies {ms:.2f} ms = {row['copy_gbs']:.1f} GB/s (floor {row['floor_ms']:.2f} ms "
            f"at {args.pcie_gbs} GB/s), bytes equal: {same}"
        )
    out = {
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("DHS_GIT_COMMIT", ""),
        "sources": S,
        "tokens": T,
        "row_bytes": rb,
        "rows": rows,
    }
    write_json(args.out, out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
