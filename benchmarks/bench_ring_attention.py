"""The drafter's ring attention on the GPU: the Triton kernel's settings against its byte floor.

    python benchmarks/bench_ring_attention.py [--batch 1 8 32] [--block 4 1] [--d 512]
        [--window 2048] [--configs 128x32x4x2 64x32x4x2 256x64x8x1]
        [--out results/attention/ring-h200.json]

The drafter of an Adaptive DHiSparse round attends, per request, to its slot's ring (R_d rows,
eq. 9: the window, a page and a verification block) and to its block's own L keys, twice a round
(propose and catch-up) per drafter layer. ``bench_decode_step --experiment fig4_h200`` puts the
kernel at 38 / 203 us of a round's propose at batch 1 / 32 (d = 512, two layers, so two calls),
where the keys and values a call must read, 2 x B x (R_d + L) x d x 2 bytes, take ~1 / ~34 us
at the H200's measured 4.22 TB/s (docs/design.md): 2 / 68 us for the two calls. This script
times each ``--configs`` entry, CHUNKxBLOCK_NxWARPSxSTAGES (keys per split-K chunk, keys per
tile, warps, pipeline stages; the kernel's defaults first; a setting that does not compile or
fit shared memory is reported and left out), from a CUDA graph (back-to-back replays, the
model's case) and reports microseconds per call, GB/s against the bytes above and the floor's
share, with the reference (gather + SDPA) beside it.

Before timing, every config is checked on the GPU against the reference (bf16 tolerance) on the
timed shapes and on a masked window with a fresh request (whole chunks masked), and for batch
invariance: each request's output bits alone equal its bits in the batch. A failure exits 1. A
config changes the chunk size, so its numerics are its own: a change of default is a change of
the drafter's bits (MEASUREMENT_CHANGES).

``--cpu-dry-run`` runs the checks and the loop at toy sizes under the interpreter (float32), with
wall-clock timing, to exercise the script (tests/kernels/test_ring_attention.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from figures.presets import HBM_BPS  # noqa: E402  (the H200's measured copy rate)


def parse_config(text: str) -> dict:
    """CHUNKxBLOCK_NxWARPSxSTAGES -> the kernel's keyword arguments."""
    try:
        chunk, block_n, warps, stages = (int(x) for x in text.split("x"))
    except ValueError:
        raise ValueError(
            f"--configs entry {text!r}: CHUNKxBLOCK_NxWARPSxSTAGES, e.g. 128x32x4x2"
        ) from None
    if block_n < 16 or block_n & (block_n - 1) or chunk < block_n or warps < 1 or stages < 1:
        raise ValueError(
            f"--configs entry {text!r}: BLOCK_N a power of two >= 16, CHUNK >= BLOCK_N, "
            "WARPS and STAGES >= 1"
        )
    return dict(chunk_rows=chunk, block_n=block_n, num_warps=warps, num_stages=stages)


def case(torch, B, L, d, R, dev, dt, g, fresh: int | None = None):
    """Random rings and blocks with the drafter's mask: each request sees the last ``R - pad``
    ring rows (a window) and its block causally; request ``fresh`` sees no ring row (its first
    block), so whole chunks of its keys are masked."""
    S = B + 1  # one slot more than requests: slots are not the batch's order
    ring_k, ring_v = (torch.randn(S, R, d, generator=g, device=dev).to(dt) for _ in range(2))
    q, k, v = (torch.randn(B, L, d, generator=g, device=dev).to(dt) for _ in range(3))
    slots = torch.randperm(S, generator=g, device=dev)[:B]
    bias = torch.zeros(B, 1, L, R + L, dtype=dt, device=dev)
    bias[..., : R // 16] = float("-inf")  # ring rows outside the window
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).triu(1)
    bias[..., R:].masked_fill_(causal, float("-inf"))
    if fresh is not None:
        bias[fresh, ..., :R] = float("-inf")
    return q, ring_k, ring_v, slots, k, v, bias


def check(torch, ra, cfgs, shapes, dev, dt) -> str | None:
    """Every config against the reference and batch invariant; the first failure, else None."""
    tol = 2e-2 if dt == torch.bfloat16 else 1e-4
    g = torch.Generator(device=dev).manual_seed(3)
    for B, L, d, R in shapes:
        args = case(torch, B, L, d, R, dev, dt, g, fresh=B - 1 if B > 1 else None)
        ref = ra.ring_attention_reference(*args, 0.125).float()
        for name, kw in cfgs:
            out = ra.ring_attention_triton(*args, 0.125, **kw)
            err = (out.float() - ref).abs().max().item()
            if not torch.allclose(out.float(), ref, rtol=tol, atol=tol):
                return f"{name} at B={B} L={L} d={d} R={R}: differs from the reference by {err:.3g}"
            q, ring_k, ring_v, slots, k, v, bias = args
            for i in sorted({0, B - 1}):
                one = (q[i : i + 1], ring_k, ring_v, slots[i : i + 1], k[i : i + 1],
                       v[i : i + 1], bias[i : i + 1])  # fmt: skip
                alone = ra.ring_attention_triton(*one, 0.125, **kw)
                if not torch.equal(alone[0], out[i]):
                    return f"{name} at B={B} L={L}: request {i}'s bits depend on the batch"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--block", type=int, nargs="+", default=[4, 1], help="queries per request")
    ap.add_argument("--d", type=int, default=512, help="the drafter's width (fig4_h200: 512)")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--k-max", type=int, default=8, help="the largest verification block")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["128x32x4x2", "64x32x4x2", "256x32x4x2", "128x16x4x2", "128x32x8x2", "128x32x4x1"],
        metavar="CHUNKxBLOCK_NxWARPSxSTAGES",
    )
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument(
        "--cpu-dry-run", action="store_true", help="exercise the script on CPU (interpreter)"
    )
    args = ap.parse_args()
    try:
        cfgs = [(c, parse_config(c)) for c in args.configs]
    except ValueError as e:
        ap.error(str(e))
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

    import torch

    from systems.kernels import ring_attention as ra
    from systems.spec.ring import ring_rows

    if args.cpu_dry_run:
        dev, dt = torch.device("cpu"), torch.float32
        batches, blocks, d, R = [1, 3], [2], 16, 70
    else:
        if not torch.cuda.is_available():
            print("bench_ring_attention needs a CUDA GPU (or --cpu-dry-run)", file=sys.stderr)
            return 2
        dev, dt = torch.device("cuda"), torch.bfloat16
        batches, blocks, d = args.batch, args.block, args.d
        R = ring_rows(args.window, args.page, args.k_max)
    shapes = [(B, L, d, R) for L in blocks for B in batches]
    runs = []
    for name, kw in cfgs:  # a setting past the shared memory or the compiler is left out
        try:
            ra.ring_attention_triton(*case(torch, 2, max(blocks), d, R, dev, dt, None), 0.125, **kw)
            runs.append((name, kw))
        except Exception as e:  # triton's OutOfResources / CompilationError
            print(f"# {name}: left out, it does not run here ({type(e).__name__}: {e})"[:300])
    if not runs:
        print("no --configs entry runs here", file=sys.stderr)
        return 1
    cfgs = runs
    bad = check(torch, ra, cfgs, shapes + [(3, max(blocks), d, 2 * R // 3 + 5)], dev, dt)
    if bad:
        print(f"CHECK FAILED: {bad}", file=sys.stderr)
        return 1
    print(f"# checked against the reference and alone vs batched: {[c for c, _ in cfgs]}")

    def us(fn) -> float:
        if args.cpu_dry_run:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        from triton.testing import do_bench_cudagraph

        return 1e3 * do_bench_cudagraph(fn, rep=50, return_mode="median")

    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(
        f"{'B':>4} {'L':>3} {'R_d':>5} {'config':>12} {'us':>8} {'GB/s':>8} {'floor':>6} {'ref_us':>8}"
    )
    for L in blocks:
        for B in batches:
            a = case(torch, B, L, d, R, dev, dt, g)
            nbytes = 2 * B * (R + L) * d * a[0].element_size()
            ref_us = us(lambda: ra.ring_attention_reference(*a, 0.125))
            for name, kw in cfgs:
                t = us(lambda: ra.ring_attention_triton(*a, 0.125, **kw))
                row = dict(B=B, L=L, d=d, R_d=R, config=name, **kw, us=t, ref_us=ref_us,
                           bytes=nbytes, gbps=nbytes / (t * 1e-6) / 1e9,
                           floor_share=nbytes / HBM_BPS / (t * 1e-6))  # fmt: skip
                rows.append(row)
                print(
                    f"{B:>4} {L:>3} {R:>5} {name:>12} {t:>8.1f} {row['gbps']:>8.1f} "
                    f"{row['floor_share']:>6.3f} {ref_us:>8.1f}",
                    flush=True,
                )
    if args.out:
        from harness.environment import environment

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {"benchmark": "ring_attention", "env": environment(), "args": vars(args),
                 "dry_run": bool(args.cpu_dry_run), "rows": rows},
                indent=1,
            ) + "\n"
        )  # fmt: skip
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
