"""One top-k call shape, called a few times, for Nsight Compute to profile (GPU only).

    ncu --kernel-name regex:_topk_kernel --launch-skip 2 --launch-count 3 ... \\
        python benchmarks/ncu_topk.py --batch 1 --context 16384 --k 512

The shape is a decode step's indexer top-k (one query per request over the visible history,
random scores); every launch does the same work. The kernel is one program per query row, so at
a small batch its time is one row's latency: the per-source-line stall samples
(benchmarks/gpu_ncu.sh with NCU_KERNEL=topk, then benchmarks/ncu_lines.py --file topk.py --ranges
phases) say which of its passes (the two histogram passes, the compaction, the candidate passes,
the final sort) that latency comes from. This script alone only calls the kernel.
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
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--q", type=int, default=1, help="queries per request")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--k", type=int, default=512)
    add_call_args(ap)
    args = ap.parse_args()
    torch = require_cuda("ncu_topk")
    from systems.kernels import topk as tk

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    B, Q, L = args.batch, args.q, args.context
    scores = torch.randn(B, Q, L, device=dev, generator=g)
    positions = torch.full((B, Q), L - 1, device=dev, dtype=torch.int64)
    for _ in range(1 + args.calls):
        out = tk.topk_positions_triton(scores, positions, args.k)
    torch.cuda.synchronize()
    want = tk.topk_positions_reference(scores, positions, args.k)
    if not torch.equal(out, want):
        sys.exit("ncu_topk: the kernel disagrees with the reference")
    dump_cubin(tk._topk_kernel, args.dump_cubin, "ncu_topk")
    print(f"ncu_topk: batch {B} q {Q} context {L} k {args.k}: {1 + args.calls} calls")


if __name__ == "__main__":
    main()
