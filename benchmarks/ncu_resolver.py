"""One resolver call shape, called a few times, for Nsight Compute to profile (GPU only).

    ncu --kernel-name regex:_resolver_kernel --launch-skip 2 --launch-count 3 ... \\
        python benchmarks/ncu_resolver.py --batch 8 --misses 77 [--kw early_copy=True+copy_programs_per_request=4]

The state is the Fig. 8c one of bench_resolver.py (DeepSeek-like source, k = 512, B = 4096,
500K positions, a full cache with random stamps); the hot-cache state is restored before each
call, so every profiled launch does the same work. benchmarks/gpu_ncu.sh runs this under ncu for
several variants and writes per-source-line stall samples; this script alone only calls the kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ncu_lines import add_call_args, dump_cubin, require_cuda  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--B", type=int, default=4096)
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--misses", type=int, default=77)
    ap.add_argument("--ctx", type=int, default=500_000)
    ap.add_argument(
        "--kw",
        default="",
        help="resolver keyword arguments, e.g. early_copy=True+copy_programs_per_request=4",
    )
    add_call_args(ap)
    args = ap.parse_args()
    torch = require_cuda("ncu_resolver")
    import bench_resolver as br

    from systems.kernels import resolver as rv

    kw = br.parse_kw(args.kw)
    src = br.make_ds_source(
        torch,
        R=args.batch,
        B=args.B,
        ctx=args.ctx,
        k=args.k,
        misses=args.misses,
        host_gib=2.0,
        seed=200 + args.batch,
    )
    saved = (src.hot_pos.clone(), src.hot_lru.clone())
    stamp = 5000
    for _ in range(1 + args.calls):
        src.hot_pos.copy_(saved[0])
        src.hot_lru.copy_(saved[1])
        stamp += 1
        res = rv.resolve_triton(*src.args(src.sel), stamp, check=False, **kw, **src.kwargs())
    torch.cuda.synchronize()
    copies = int(res.counters[:, 3].sum())
    if copies != args.batch * args.misses:
        sys.exit(f"ncu_resolver: expected {args.batch * args.misses} copies, got {copies}")
    dump_cubin(rv._resolver_kernel, args.dump_cubin, "ncu_resolver")
    print(
        f"ncu_resolver: batch {args.batch} B {args.B} misses {args.misses} {kw or 'defaults'}: "
        f"{1 + args.calls} calls, {copies} copies in the last"
    )


if __name__ == "__main__":
    main()
