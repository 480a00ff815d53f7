"""The indexer's top-k on the GPU: the sort-based reference against the Triton radix select.

    python benchmarks/bench_topk.py [--batch 1 8 32] [--context 2048 16384] [--k 512] [--q 1]
                                    [--dist randn|ties] [--configs 4096x16 2048x8x4]
                                    [--out results/topk/summary.json]

One decode row per request (Q = 1 by default), each query at the end of its history (position
L - 1: all L positions visible), float32 scores. Before timing, the Triton kernel is checked
against the reference, bit for bit, for every --configs entry: on odd shapes (random positions,
some past L; tie-heavy and continuous scores; k above L), on replays of a captured CUDA graph on
new data, and on every timed shape; a mismatch exits 1. Per shape, median microseconds per call:
    ref_us        topk_positions_reference (masking, 64-bit keys, torch.topk, gather), eager
    ref_graph_us  the same replayed from a CUDA graph (launch overhead excluded)
    torch_topk_us torch.topk on the raw float scores alone (no mask, no tie rule): a floor for
                  any sort-based path
    tri_us        topk_positions_triton, eager, per --configs (block x warps [x segments per
                  row; default the kernel's rule, topk_segments])
    tri_graph_us  the same from a CUDA graph
and the Triton kernel's GB/s against the scores it must read, B*Q*L*4 bytes (graph timing).
Timing: triton.testing.do_bench (flushes L2 before each call, so eager numbers read the
scores from HBM) and do_bench_cudagraph (back-to-back replays, scores in L2, as in the model
where index_scores has just written them); both report the median.
--dist ties draws scores from 5 values (every threshold is a tie broken by position).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def check_odd_shapes(torch, dev, configs) -> str | None:
    """The kernel against the reference, bit for bit, on the GPU: odd shapes, random positions
    (some past L), tie-heavy and continuous scores, k above L. Returns a mismatch or None."""
    from systems.kernels.topk import topk_positions_reference, topk_positions_triton

    g = torch.Generator(device=dev).manual_seed(1)
    vals = torch.tensor([-1.5, -0.0, 0.0, 0.25, 3.0, float("-inf")], device=dev)
    for B, Q, L, k in [
        (3, 1, 1, 1),
        (3, 4, 9, 64),
        (3, 4, 41, 8),
        (3, 1, 341, 64),
        (5, 4, 1000, 512),
        (2, 8, 5000, 512),
        (3, 2, 16384, 2048),
        (1, 1, 70000, 512),
    ]:
        for dist in ("ties", "randn", "near"):
            if dist == "ties":
                s = vals[torch.randint(0, len(vals), (B, Q, L), device=dev, generator=g)]
            elif dist == "near":
                s = 1.0 + torch.randint(0, 300, (B, Q, L), device=dev, generator=g) * 2.0**-17
            else:
                s = torch.randn(B, Q, L, device=dev, generator=g)
            pos = torch.randint(0, L + 2, (B, Q), device=dev, generator=g)
            ref = topk_positions_reference(s, pos, k)
            for block, warps, seg in configs:
                tri = topk_positions_triton(s, pos, k, block=block, num_warps=warps, segments=seg)
                if not torch.equal(ref, tri):
                    return f"B={B} Q={Q} L={L} k={k} {dist} {block}x{warps}x{seg}"
    # captured once, replayed on new scores and positions: nothing depends on the first data
    for block, warps, seg in configs:
        scores = torch.randn(4, 2, 3000, device=dev, generator=g)
        pos = torch.randint(0, 3000, (4, 2), device=dev, generator=g)
        kw = dict(block=block, num_warps=warps, segments=seg)
        topk_positions_triton(scores, pos, 512, **kw)  # compile
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = topk_positions_triton(scores, pos, 512, **kw)
        for _ in range(3):
            scores.copy_(vals[torch.randint(0, len(vals), scores.shape, device=dev, generator=g)])
            pos.copy_(torch.randint(0, 3002, pos.shape, device=dev, generator=g))
            graph.replay()
            if not torch.equal(out, topk_positions_reference(scores, pos, 512)):
                return f"CUDA graph replay {block}x{warps}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--q", type=int, default=1, help="queries per request (verification: 4-8)")
    ap.add_argument("--dist", choices=["randn", "ties"], default="randn")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=None,
        metavar="BLOCKxWARPS[xSEGMENTS]",
        help="Triton block sizes, warps and segments per row to compare, e.g. 4096x16 "
        "2048x8x4 (default: the kernel's defaults; segments: topk_segments' rule)",
    )
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    import torch
    import triton
    from triton.testing import do_bench, do_bench_cudagraph

    from harness.environment import environment
    from systems.kernels.topk import topk_positions_reference, topk_positions_triton

    if not torch.cuda.is_available():
        print("bench_topk needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(
        f"# {torch.cuda.get_device_name(dev)}, triton {triton.__version__}, torch "
        f"{torch.__version__}, k={args.k}, Q={args.q}, dist={args.dist}"
    )
    from systems.kernels import topk as tk

    configs = []
    for c in args.configs or [f"{tk.BLOCK}x{tk.NUM_WARPS}"]:
        v = [int(x) for x in c.split("x")]
        if len(v) not in (2, 3):
            ap.error(f"--configs entry {c!r}: BLOCKxWARPS or BLOCKxWARPSxSEGMENTS")
        configs.append((v[0], v[1], v[2] if len(v) == 3 else None))
    name = lambda b, w, s: f"{b}x{w}" + (f"x{s}" if s else "")  # noqa: E731
    bad = check_odd_shapes(torch, dev, configs)
    if bad:
        print(f"MISMATCH against the reference: {bad}", file=sys.stderr)
        return 1
    print(f"# checked against the reference on odd shapes: identical for {configs}")
    print(
        f"{'B':>4} {'L':>7} {'ref_us':>8} {'ref_graph_us':>12} {'torch_topk_us':>13} "
        f"{'config':>9} {'tri_us':>8} {'tri_graph_us':>12} {'tri_GB/s':>9}"
    )

    def us(fn, graph):
        return 1e3 * (
            do_bench_cudagraph(fn, rep=50, return_mode="median")
            if graph
            else do_bench(fn, warmup=25, rep=200, return_mode="median")
        )

    for L in args.context:
        for B in args.batch:
            shape = (B, args.q, L)
            if args.dist == "ties":
                vals = torch.tensor([-2.0, -0.0, 0.0, 0.5, 1.0], device=dev)
                scores = vals[torch.randint(0, 5, shape, device=dev, generator=g)]
            else:
                scores = torch.randn(shape, device=dev, generator=g)
            positions = torch.full((B, args.q), L - 1, dtype=torch.long, device=dev)
            positions -= torch.arange(args.q, device=dev).flip(0)  # verification rows: L-Q..L-1
            k = args.k
            ref_fn = partial(topk_positions_reference, scores, positions, k)
            ref = ref_fn()
            base = {
                "B": B,
                "Q": args.q,
                "L": L,
                "k": k,
                "dist": args.dist,
                "ref_us": us(ref_fn, False),
                "ref_graph_us": us(ref_fn, True),
                "torch_topk_us": us(partial(torch.topk, scores, min(k, L), dim=-1), False),
            }
            for block, warps, seg in configs:
                tri_fn = partial(
                    topk_positions_triton,
                    scores,
                    positions,
                    k,
                    block=block,
                    num_warps=warps,
                    segments=seg,
                )
                if not torch.equal(ref, tri_fn()):
                    bad = (ref != tri_fn()).any(-1).nonzero()[:4].tolist()
                    print(
                        f"MISMATCH at B={B} L={L} {name(block, warps, seg)}: rows {bad}",
                        file=sys.stderr,
                    )
                    return 1
                row = dict(
                    base,
                    block=block,
                    num_warps=warps,
                    segments=seg or tk.topk_segments(L, k, B * args.q),
                    tri_us=us(tri_fn, False),
                    tri_graph_us=us(tri_fn, True),
                )
                row["tri_gbps"] = B * args.q * L * 4 / (row["tri_graph_us"] * 1e-6) / 1e9
                rows.append(row)
                print(
                    f"{B:>4} {L:>7} {row['ref_us']:>8.1f} {row['ref_graph_us']:>12.1f} "
                    f"{row['torch_topk_us']:>13.1f} {name(block, warps, seg):>9} "
                    f"{row['tri_us']:>8.1f} {row['tri_graph_us']:>12.1f} "
                    f"{row['tri_gbps']:>9.1f}",
                    flush=True,
                )
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(dev), "env": environment(), "rows": rows},
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
