"""How long the KV host store takes to page-lock: PyTorch's pinned allocator against
systems.kv.host_memory (exact size, parallel page touch, cudaHostRegister).

    python benchmarks/bench_host_alloc.py --gib 12 --out results/host_alloc/h200.json

A bundled server pins its whole host store at start-up (Fig. 4's preset: 37 GB), once per system
and sweep setting. For each path the script allocates ``--gib`` GiB, checks that the tensor
reports pinned, that the GPU reads bytes written on the host both through a non-blocking copy
and through a Triton kernel that loads from the host tensor over UVA (the resolver's path), then
frees it. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpu_timing import write_json  # noqa: E402  (benchmarks/, the script's folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gib", type=float, default=12.0, help="store size per allocation (GiB)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="allocations per path (the first grows the machine's memory; later ones reuse it)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    import triton
    import triton.language as tl

    from systems.kv.host_memory import pinned_empty

    @triton.jit
    def uva_read(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    if not torch.cuda.is_available():
        print("bench_host_alloc: needs a CUDA GPU (pinned memory); nothing timed")
        return 0
    torch.cuda.init()
    n = int(args.gib * 2**30)
    paths = {
        "torch_pin_memory": lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True),
        "register_exact": lambda: pinned_empty((n,), torch.uint8),
    }
    rows, bad = [], 0
    for rep in range(args.repeats):
        order = list(paths.items())
        if rep % 2:  # alternate which path meets the machine's memory first
            order.reverse()
        for name, alloc in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            t = alloc()
            dt = time.perf_counter() - t0
            ok = bool(t.is_pinned())
            # write a pattern on the host at both ends, read it on the GPU
            probe = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
            t[:4096].copy_(probe)
            t[-4096:].copy_(probe.flip(0))
            head = t[:4096].to("cuda", non_blocking=True)
            tail = t[-4096:].to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            ok &= bool(torch.equal(head.cpu(), probe)) and bool(
                torch.equal(tail.cpu(), probe.flip(0))
            )
            seen = torch.empty(4096, dtype=torch.uint8, device="cuda")
            uva_read[(4,)](t[-4096:], seen, 4096, BLOCK=1024)  # kernel loads over PCIe
            torch.cuda.synchronize()
            ok &= bool(torch.equal(seen.cpu(), probe.flip(0)))
            # the kernel's read rate from this memory over PCIe (a 1 GiB stream, median of 5):
            # the resolver's host path must not depend on which allocator pinned the store
            m = min(1 << 30, n)
            sink = torch.empty(m, dtype=torch.uint8, device="cuda")
            times = []
            for _ in range(5):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                uva_read[(triton.cdiv(m, 8192),)](t[:m], sink, m, BLOCK=8192)
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3)
            read_gbps = m / sorted(times)[2] / 1e9
            del sink
            bad += not ok
            rows.append(
                dict(
                    path=name,
                    repeat=rep,
                    gib=args.gib,
                    seconds=dt,
                    gib_per_s=args.gib / dt,
                    pinned_and_readable=ok,
                    kernel_read_gbps=read_gbps,
                )
            )
            print(
                f"[host_alloc] {name:18s} repeat {rep}: {args.gib:.1f} GiB in {dt:6.2f} s "
                f"({args.gib / dt:5.2f} GiB/s), kernel reads it at {read_gbps:5.1f} GB/s  "
                f"{'ok' if ok else 'FAILED'}",
                flush=True,
            )
            del t, head, tail, seen
            # PyTorch's caching host allocator keeps the freed pinned block: without this, the
            # next torch allocation of the same size is a cache hit, not an allocation
            if hasattr(torch._C, "_host_emptyCache"):
                torch._C._host_emptyCache()
    out = dict(
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        commit=os.environ.get("DHS_GIT_COMMIT"),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        note="torch's pinned allocator rounds each request up to a power of two",
        rows=rows,
    )
    write_json(args.out, out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
