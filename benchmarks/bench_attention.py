"""Sparse attention and the indexer's scan on the GPU: the Triton kernels against the reference
paths, same inputs.

    python benchmarks/bench_attention.py --out results/attention/h200.json

For the glm53_mini geometry (H = 4, kv_dim 576, FP8 656-byte rows, k = 512; ``--heads 16 --k 1024``
for glm53_h200's) at N queries per
layer call (decode batches, and verification passes of K = 4 at C64), it times one layer's
attention four ways (reference; the per-head kernel unsplit and with its default split-K; the all-heads tensor-core kernel) (CUDA events, median of --reps after warm-up, a 256 MB L2 flush and a GPU spin before each)
and reports the difference of the outputs, the kernel's effective bandwidth over the bytes it
must read (N x k x row_bytes) against the 4.22 TB/s HBM copy rate (docs/design.md), and the
speed-up, then both kernels over chunk counts 1-16 at 1-128 queries (``split_sweep``: the data
for ``SPLIT_ROWS``, which fixes the count by k alone), the all-heads kernel's tiles and warps
at a small batch, a decode batch and a verification call, and the indexer's scan;
``--sections`` picks some; ``--cpu-dry-run`` runs them all at toy sizes under the interpreter (a
check of the script, not a measurement). Exits 1 if the outputs disagree beyond float32 rounding.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_timing import median_us  # noqa: E402  (benchmarks/, the script's folder)

from figures.presets import HBM_BPS  # noqa: E402  (the H200's measured copy rate)


def _wall_us(torch, fn, flush, reps: int) -> float:
    """A dry run's stand-in for median_us: one call's wall time (the interpreter's, meaningless)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


SECTIONS = {"kernels", "splits", "tiles", "index"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--queries", default="1,16,64,256,1024")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4, help="query heads (glm53_h200: 16, k 1024)")
    ap.add_argument("--pool-rows", type=int, default=1 << 20)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--history", type=int, default=16384, help="positions the index scan covers")
    ap.add_argument(
        "--sections",
        default=",".join(sorted(SECTIONS)),
        help="comma-separated parts to run: kernels (the four ways at --queries), splits (chunk "
        "counts), tiles (the mma kernel's tile and warps), index (the indexer's scan)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="exercise every section on CPU at toy sizes (the interpreter, float32, wall-clock "
        "times that mean nothing): a check of the script before a GPU call",
    )
    args = ap.parse_args()
    dry = args.cpu_dry_run
    if dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
        args.queries, args.k, args.heads = "1,2", 32, 2
        args.pool_rows, args.reps, args.history = 256, 1, 128

    import torch

    from harness.records import finish_benchmark
    from systems.kernels.sparse_attention import (
        sparse_attention,
        sparse_attention_triton,
        split_count,
    )
    from systems.models.config import ModelConfig
    from systems.models.kv_format import encode_rows

    if not dry and not torch.cuda.is_available():
        sys.exit(
            "bench_attention: no CUDA device here; run it on the GPU machine (or --cpu-dry-run)"
        )
    dev = torch.device("cpu" if dry else "cuda")
    # the model dtype: bf16 on the GPU; float32 in a dry run (bf16 arithmetic is unreliable in
    # the interpreter)
    dt = torch.float32 if dry else torch.bfloat16
    time_us = _wall_us if dry else median_us
    cfg = ModelConfig(kv_format="fp8", kv_dim=576, kv_rope_dim=64, num_heads=args.heads)
    g = torch.Generator(device=dev).manual_seed(0)
    kv = encode_rows(torch.randn(args.pool_rows, 576, device=dev, generator=g), cfg).contiguous()
    flush = torch.empty((1 << 10) if dry else (256 << 20), dtype=torch.uint8, device=dev)
    kw = dict(kv_format="fp8", kv_dim=576, rope_dim=64, row_dtype=dt)
    # batches per section: (chunk-count sweep, tile sweep, index scan (requests, queries), index
    # tile sweep's requests)
    split_n, tile_n = ((1, 2), (1, 2)) if dry else ((1, 16, 32, 128), (1, 32, 64, 512))
    scan_bq = ((1, 1), (2, 2)) if dry else ((1, 1), (16, 1), (64, 1), (64, 4), (128, 4))
    sweep_b = 2 if dry else 128

    def inputs(N: int):
        """N queries in the model dtype and their k random pool locations (selections =
        locations)."""
        q = torch.randn(N, args.heads, 576, device=dev, generator=g).to(dt)
        return q, torch.randint(0, args.pool_rows, (N, args.k), device=dev, generator=g)

    rows, bad = [], 0
    sweep, scan, index_sweep = [], [], []

    def sweep_point(label: str, N: int, fn, **setting) -> None:
        """Time one launch setting of N queries into ``sweep`` (us and the rows' GB/s)."""
        us = time_us(torch, fn, flush, args.reps)
        gbps = N * args.k * kv.shape[1] / us / 1e3
        sweep.append({"queries": N, **setting, "us": us, "gbps": gbps})
        print(f"[attention] {label}: {us:8.1f} us ({gbps:.0f} GB/s)", flush=True)

    sections = set(args.sections.split(","))
    if unknown := sections - SECTIONS:
        sys.exit(
            f"bench_attention: unknown sections {sorted(unknown)}; choose from {sorted(SECTIONS)}"
        )
    for N in [int(x) for x in args.queries.split(",")] if "kernels" in sections else []:
        q, loc = inputs(N)
        sel = loc.clone()
        sel[:, -7:] = -1  # some padding, as short histories have
        out = {}
        fns = {
            "reference": lambda: sparse_attention(q, kv, sel, loc, impl="reference", **kw),
            "unsplit": lambda: sparse_attention_triton(q, kv, sel, loc, splits=1, **kw),
            "triton": lambda: sparse_attention_triton(q, kv, sel, loc, **kw),
            "mma": lambda: sparse_attention_triton(q, kv, sel, loc, kernel="mma", **kw),
        }
        for impl, fn in fns.items():
            out[impl] = (fn().float(), time_us(torch, fn, flush, args.reps))
        scale = out["reference"][0].abs().max().item()
        need = N * args.k * kv.shape[1]
        row = {
            "queries": N,
            "k": args.k,
            "reference_us": out["reference"][1],
            "splits": split_count(args.k, 32),
            "row_bytes_read": need,
            "max_abs_out": scale,
        }
        for impl in ("unsplit", "triton", "mma"):
            diff = (out[impl][0] - out["reference"][0]).abs().max().item()
            ok = diff <= 2e-2 * max(scale, 1e-6)  # bf16 output: one or two ulps
            bad += not ok
            us = out[impl][1]
            row.update(
                {
                    f"{impl}_us": us,
                    f"{impl}_speedup": out["reference"][1] / us,
                    f"{impl}_gbps": need / us / 1e3,
                    f"{impl}_fraction_of_hbm": need / (us * 1e-6) / HBM_BPS,
                    f"{impl}_max_abs_diff": diff,
                    f"{impl}_agree": ok,
                }
            )
        rows.append(row)
        print(
            f"[attention] N={N:5d} reference {row['reference_us']:8.1f} us | unsplit "
            f"{row['unsplit_us']:8.1f} us x{row['unsplit_speedup']:.2f} | split-K "
            f"({row['splits']:2d} chunks) {row['triton_us']:8.1f} us x{row['triton_speedup']:.2f} "
            f"{row['triton_gbps']:6.0f} GB/s ({100 * row['triton_fraction_of_hbm']:.0f}% of HBM)  "
            f"| mma {row['mma_us']:8.1f} us x{row['mma_speedup']:.2f} {row['mma_gbps']:6.0f} GB/s  "
            f"max|diff| {row['unsplit_max_abs_diff']:.1e} / {row['triton_max_abs_diff']:.1e} / "
            f"{row['mma_max_abs_diff']:.1e}",
            flush=True,
        )
    if "splits" in sections:
        # chunk-count sweep of both kernels (the all-heads one is what ``auto`` runs on a GPU):
        # SPLIT_ROWS fixes the count by k alone (batch invariance), so one count serves every batch
        for N in split_n:
            q, loc = inputs(N)
            for kernel in ("mma", "per_head"):
                for ns in (1, 2, 4, 8, 16):
                    fn = lambda: sparse_attention_triton(  # noqa: E731
                        q, kv, loc, loc, splits=ns, kernel=kernel, **kw
                    )
                    label = f"sweep {kernel:8s} N={N:3d} splits={ns:2d}"
                    sweep_point(label, N, fn, kernel=kernel, splits=ns)

    if "tiles" in sections:
        # the all-heads tensor-core kernel's launch shape, at a decode batch and a verification call
        # (16 x 8: at sm_90 ptxas gives the 16-row tile 238 registers and no spills with 8 warps,
        # against 255 and 156 bytes of spill stores with 4)
        for N in tile_n:
            q, loc = inputs(N)
            for bk, nw in ((16, 4), (16, 8), (32, 4), (64, 4), (32, 8), (64, 8)):
                fn = lambda: sparse_attention_triton(  # noqa: E731
                    q,
                    kv,
                    loc,
                    loc,
                    kernel="mma",
                    block_k=bk,
                    num_warps=nw,
                    **kw,
                )
                label = f"mma N={N:4d} block_k={bk:3d} num_warps={nw}"
                try:
                    sweep_point(label, N, fn, kernel="mma", block_k=bk, num_warps=nw)
                except Exception as e:  # e.g. out of shared memory for the larger tiles
                    print(f"[attention] {label}: {type(e).__name__}")

    if "index" in sections:
        # the indexer's scan: B requests x L history positions x Q queries, paged keys (64 bf16)
        from systems.kernels.index_scores import index_scores

        P, di, L = 64, 64, args.history
        for B, Q in scan_bq:
            pages = -(-L // P)
            pool = torch.randn(B * pages * P, di, device=dev, generator=g).to(dt)
            table = (
                torch.randperm(B * pages, device=dev, generator=g).view(B, pages).to(torch.int32)
            )
            slots = torch.arange(B, device=dev)
            iq = torch.randn(B, Q, di, device=dev, generator=g)
            out = {}
            for impl in ("reference", "triton"):
                fn = lambda: index_scores(iq, pool, table, slots, L, P, impl=impl)  # noqa: E731
                out[impl] = (fn(), time_us(torch, fn, flush, args.reps))
            diff = (out["triton"][0] - out["reference"][0]).abs().max().item()
            ok = diff <= 1e-3 * max(out["reference"][0].abs().max().item(), 1e-6)
            bad += not ok
            need = B * L * di * 2
            r = {
                "requests": B,
                "queries": Q,
                "history": L,
                "reference_us": out["reference"][1],
                "triton_us": out["triton"][1],
                "speedup": out["reference"][1] / out["triton"][1],
                "key_bytes_read": need,
                "triton_gbps": need / out["triton"][1] / 1e3,
                "max_abs_diff": diff,
                "agree": ok,
            }
            scan.append(r)
            print(
                f"[index]     B={B:4d} Q={Q} L={L} reference {r['reference_us']:9.1f} us  triton "
                f"{r['triton_us']:9.1f} us  x{r['speedup']:.2f}  {r['triton_gbps']:7.1f} GB/s  "
                f"max|diff| {diff:.2e}",
                flush=True,
            )
        # tile sweep of the scan at a high load (the decode step of the hierarchy at C128): rows of
        # history per program x warps (default 128 x 4)
        from systems.kernels.index_scores import index_scores_triton

        B = sweep_b
        pages = -(-L // P)
        pool = torch.randn(B * pages * P, di, device=dev, generator=g).to(dt)
        table = torch.randperm(B * pages, device=dev, generator=g).view(B, pages).to(torch.int32)
        slots = torch.arange(B, device=dev)
        for Q in (1, 4):
            iq = torch.randn(B, Q, di, device=dev, generator=g)
            ref = index_scores(iq, pool, table, slots, L, P, impl="triton")
            # tiles that compile without register spills at sm_90 (ptxas -v): 256 x 4 and 512 x 8 spill
            # and the multiply-add form (a float32 row per query, no 16-row padding of the dot)
            for block_l, warps, form in (
                (64, 4, "dot"),
                (128, 4, "dot"),
                (64, 2, "dot"),
                (128, 8, "dot"),
                (256, 8, "dot"),
                (64, 4, "fma"),
                (128, 4, "fma"),
                (256, 8, "fma"),
                (512, 8, "fma"),
            ):
                fn = lambda: index_scores_triton(  # noqa: E731
                    iq,
                    pool,
                    table,
                    slots,
                    L,
                    P,
                    block_l=block_l,
                    num_warps=warps,
                    form=form,
                )
                diff = (fn() - ref).abs().max().item()
                us = time_us(torch, fn, flush, args.reps)
                index_sweep.append(
                    {
                        "requests": B,
                        "queries": Q,
                        "block_l": block_l,
                        "num_warps": warps,
                        "form": form,
                        "us": us,
                        "gbps": B * L * di * 2 / us / 1e3,
                        "max_abs_diff_vs_default": diff,
                    }
                )
                print(
                    f"[index]     sweep B={B} Q={Q} {form} block_l={block_l:5d} warps={warps}: {us:8.1f} us "
                    f"({index_sweep[-1]['gbps']:.0f} GB/s)  max|diff| {diff:.1e}",
                    flush=True,
                )
    finish_benchmark(
        args.out,
        {
            "benchmark": "sparse_attention",
            "geometry": f"H {args.heads}, d 576, fp8 656 B rows, k {args.k}",
            "args": vars(args),
            "rows": rows,
            "split_sweep": sweep,
            "index_scan": scan,
            "index_sweep": index_sweep,
        },
        bool(bad),
    )


if __name__ == "__main__":
    main()
