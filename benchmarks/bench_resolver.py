"""Resolver microbenchmarks of the paper's Figure 8, timed apart from the model.

    python benchmarks/bench_resolver.py [--quick] [--check] [--out results/fig8/summary.json]

(a) GLM-like source, verification width Q = 8, batch 32, B = 4096, k = 2048, 656-byte rows:
    resolver time against the unique host-miss payload of a call, for synthetic shared /
    partial / disjoint selections across the 8 queries, with a cold or a retained cache.
    Misses that do not fit the B-row cache go to a staging arena (``staging_loc_base``), so
    every distinct missing row of the call is copied from pinned host memory once. Least-
    squares line time = a + payload / bandwidth -> host_path_gbps and fit_r2 (paper: 49.4 GB/s,
    R^2 = 0.9992). Nine timings per point (paper: min-max error bars), L2 flushed and the
    hot-cache state restored before each (both outside the timed region).
(b) DeepSeek-like source, single query, k = 512, no host miss: time against B in
    {2048, 4096, 8192} at batch 8 and 160, plus the direct path (all selected rows in ready
    optional history, so the scan is skipped). triton.testing.do_bench, 10/50/90 percentiles.
(c) Same at B = 4096 with 77 host misses per request (state restored before every timing;
    CUDA events around the call only, as do_bench does, 10/50/90 percentiles).

Pinned host memory reaches the kernel as the pinned CPU tensor itself: Triton 3.6's launcher
translates its data_ptr() with cuPointerGetAttribute(DEVICE_POINTER), which is valid for
page-locked memory under UVA (see systems/kernels/resolver.py).

--check verifies the Triton kernel against the PyTorch reference ON THE GPU first (small
random cases with duplicates/tail/padding, helper copy programs, fig-8a/8b/8c-shaped cases,
and a CUDA-graph capture + replay with a device stamp) and exits 1 on any mismatch before
timing anything. --quick shrinks batch/context for a smoke run. --cpu-dry-run runs the whole
script on CPU through the Triton interpreter at toy sizes (tests the script, times nothing
meaningful; writes to /tmp unless --out is given).

Synthetic-state notes: host page tables alias host rows only when R x context x row_bytes
would exceed --host-gib (copies are real row reads either way); selections are uniform
random positions. Output: results/fig8/summary.json (keys host_path_gbps, fit_r2,
nomiss_b4096_batch8_us, nomiss_b4096_batch160_us, miss77_b4096_batch8_us,
miss77_b4096_batch160_us, raw points, GPU name, versions, paper values beside ours).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER = {
    "host_path_gbps": 49.4,
    "fit_r2": 0.9992,
    "nomiss_b4096_batch8_us": 18.7,
    "nomiss_b4096_batch160_us": 36.9,
    "miss77_b4096_batch8_us": 29.3,
    "miss77_b4096_batch160_us": 243.3,
    "scan_growth_2048_to_8192": {"batch8": 1.9, "batch160": 2.2},
    "direct_vs_scan_b4096_batch8": 2.5,
    "note": "Fig. 8 / sec. 4.3.3, measured by the paper on B300 nodes",
}

SIZES = {
    "full": dict(
        a=dict(R=32, Q=8, K=2048, B=4096, ctx=65536, reps=9, extra_patterns=True),
        bc=dict(
            batches=(8, 160),
            Bs=(2048, 4096, 8192),
            B_c=4096,
            k=512,
            misses=77,
            ctx=500_000,
            reps_c=100,
        ),
    ),
    "quick": dict(
        a=dict(R=8, Q=8, K=2048, B=4096, ctx=32768, reps=9, extra_patterns=False),
        bc=dict(
            batches=(8, 160),
            Bs=(2048, 4096, 8192),
            B_c=4096,
            k=512,
            misses=77,
            ctx=131072,
            reps_c=30,
        ),
    ),
    "dry": dict(
        a=dict(R=2, Q=8, K=16, B=32, ctx=1024, reps=2, extra_patterns=False),
        bc=dict(batches=(2, 3), Bs=(32, 64, 128), B_c=64, k=16, misses=3, ctx=2048, reps_c=2),
    ),
}

DEV = "cuda"  # "cpu" under --cpu-dry-run


def log(*a):
    print(*a, flush=True)


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------
# synthetic KV source
# ----------------------------------------------------------------------------------------


def alloc_host_pool(torch, rows, row_bytes, g=None):
    """Host store filled with random bytes (pinned on GPU runs; bytes generated on the
    device and copied down in chunks)."""
    pool = torch.empty((rows, row_bytes), dtype=torch.uint8, pin_memory=(DEV == "cuda"))
    flat = pool.view(-1)
    chunk = 1 << 28
    for s0 in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - s0)
        flat[s0 : s0 + n].copy_(
            torch.randint(0, 256, (n,), dtype=torch.uint8, device=DEV, generator=g)
        )
    sync(torch)
    return pool


class Source:
    """One KV source for R requests: host store, device pool (direct pages, tail, hot cache,
    staging), page tables and a hot cache. History positions are [0, ctx); the tail holds
    positions [ctx, ctx + tail)."""

    def __init__(
        self,
        torch,
        *,
        R,
        B,
        QK,
        row_bytes,
        page_size,
        ctx,
        tail=64,
        staging=False,
        direct_ready=False,
        host_gib=2.0,
        seed=0,
        host_pool=None,
    ):
        self.t = torch
        dev = torch.device(DEV)
        g = torch.Generator(device=dev).manual_seed(seed)
        self.R, self.B, self.QK, self.rb, self.ps, self.ctx, self.T = (
            R,
            B,
            QK,
            row_bytes,
            page_size,
            ctx,
            tail,
        )
        ps = page_size
        P = (ctx + tail + ps - 1) // ps
        self.P = P
        if host_pool is None:
            max_pages = max(1, int(host_gib * 2**30) // (ps * row_bytes))
            host_pool = alloc_host_pool(torch, min(R * P, max_pages) * ps, row_bytes, g)
        assert host_pool.shape[1] == row_bytes
        self.host_pool = host_pool
        H_pages = host_pool.shape[0] // ps
        if R * P <= H_pages:  # distinct host page per (request, page)
            hpt = torch.randperm(H_pages, device=dev, generator=g)[: R * P]
        else:  # aliased
            hpt = torch.randint(0, H_pages, (R * P,), device=dev, generator=g)
        self.host_page_table = hpt.to(torch.int32).reshape(R, P)
        # device pool layout: [direct pages][tail][hot][staging]
        n_direct_pages = min(R * P, 4096) if direct_ready else 0
        tail_base = n_direct_pages * ps
        hot_base = tail_base + R * tail
        stg_base = hot_base + R * B
        N = stg_base + (R * QK if staging else 0)
        self.kv_pool = torch.zeros((N, row_bytes), dtype=torch.uint8, device=dev)
        self.tail_start = torch.full((R,), ctx, dtype=torch.int32, device=dev)
        self.tail_loc = (tail_base + torch.arange(R * tail, device=dev, dtype=torch.int32)).reshape(
            R, tail
        )
        self.hot_loc_base = (hot_base + B * torch.arange(R, device=dev, dtype=torch.int32)).to(
            torch.int32
        )
        self.staging_loc_base = (
            (stg_base + QK * torch.arange(R, device=dev, dtype=torch.int32)).to(torch.int32)
            if staging
            else None
        )
        if direct_ready:  # every page ready; page ids alias a small region (never read here)
            j = torch.arange(R * P, device=dev)
            self.direct_page_table = (j % n_direct_pages).to(torch.int32).reshape(R, P)
        else:
            self.direct_page_table = None
        self.hot_pos = torch.full((R, B), -1, dtype=torch.int32, device=dev)
        self.hot_lru = torch.zeros((R, B), dtype=torch.int64, device=dev)
        self.g = g
        self.dev = dev

    def perms(self, n):
        """Per request, n distinct random history positions (int64 [R, n])."""
        t = self.t
        return t.stack(
            [t.randperm(self.ctx, device=self.dev, generator=self.g)[:n] for _ in range(self.R)]
        )

    def fill_hot(self, positions, lru_max=1000, write_rows=False):
        """Full-or-partial cache: positions (int64 [R, n], n <= B, distinct per row) in random
        slots, the rest empty; random stamps in [0, lru_max). write_rows also puts each cached
        row's bytes into its slot (needed by --check's byte comparison, not for timing)."""
        t = self.t
        R, B = self.R, self.B
        n = positions.shape[1]
        assert n <= B
        self.hot_pos.fill_(-1)
        slots = t.stack([t.randperm(B, device=self.dev, generator=self.g)[:n] for _ in range(R)])
        self.hot_pos.scatter_(1, slots, positions.to(t.int32))
        self.hot_lru.copy_(t.randint(0, lru_max, (R, B), device=self.dev, generator=self.g))
        if write_rows:
            pos = positions.long()
            r_idx = t.arange(R, device=self.dev)[:, None].expand(R, n)
            hrow = self.host_page_table.long()[r_idx, pos // self.ps] * self.ps + pos % self.ps
            dst = (self.hot_loc_base.long()[:, None] + slots).reshape(-1)
            self.kv_pool[dst] = self.host_pool[hrow.reshape(-1).cpu()].to(self.dev)

    def args(self, selections):
        return (
            selections,
            self.tail_start,
            self.tail_loc,
            self.hot_pos,
            self.hot_lru,
            self.hot_loc_base,
            self.host_page_table,
            self.kv_pool,
            self.host_pool,
        )

    def kwargs(self):
        return dict(
            page_size=self.ps,
            direct_page_table=self.direct_page_table,
            staging_loc_base=self.staging_loc_base,
        )


def make_ds_source(
    torch, *, R, B, ctx, k, misses, host_gib, seed, direct=False, host_pool=None, write_rows=False
):
    """DeepSeek-like single-query source: k selected rows per request, all hot-cache hits
    except `misses` of them; the cache is full (B rows) with random stamps."""
    assert B >= k
    src = Source(
        torch,
        R=R,
        B=B,
        QK=k,
        row_bytes=656,
        page_size=64,
        ctx=ctx,
        staging=False,
        direct_ready=direct,
        host_gib=host_gib,
        seed=seed,
        host_pool=host_pool,
    )
    pool = src.perms(B + misses)
    sel = pool[:, :k]
    # cached: the k - misses selected rows that hit + other history rows; misses not cached
    cached = torch.cat([pool[:, : k - misses], pool[:, k : k + (B - (k - misses))]], 1)
    src.fill_hot(cached, write_rows=write_rows)
    src.sel = sel.reshape(R, 1, k).to(torch.int32).contiguous()
    return src


# ----------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------


class _WallEvent:  # CPU stand-in for torch.cuda.Event under --cpu-dry-run
    def __init__(self, **_):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _event(torch):
    return torch.cuda.Event(enable_timing=True) if DEV == "cuda" else _WallEvent()


def _sweep_timing(sz) -> tuple[int, int]:
    """(timings, warm-up calls) per sweep point: on the GPU a quarter of (c)'s timings, at least
    five; a CPU dry run (the interpreter, seconds per call) only exercises the code, once."""
    if DEV == "cpu":
        return 1, 0
    return max(5, sz["reps_c"] // 4), 3


def time_stateful(torch, fn, restore, reps, warmup=2, flush_bytes=256 << 20, guard_cycles=400_000):
    """CUDA-event timing of fn() only (ms per call); before each timing the state is restored
    and L2 is flushed with a 256 MB memset, both outside the timed region, followed by a
    ~0.2 ms GPU spin (torch.cuda._sleep) so that the host has queued the timed launch before
    the GPU reaches the start event (host launch overhead never enters the timing)."""
    cache = torch.empty(flush_bytes if DEV == "cuda" else 1024, dtype=torch.int8, device=DEV)
    for _ in range(warmup):
        restore()
        fn()
    sync(torch)
    starts = [_event(torch) for _ in range(reps)]
    ends = [_event(torch) for _ in range(reps)]
    for i in range(reps):
        restore()
        cache.zero_()
        if DEV == "cuda" and guard_cycles:
            torch.cuda._sleep(guard_cycles)
        starts[i].record()
        fn()
        ends[i].record()
    sync(torch)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_interleaved(torch, fns, restore, reps, warmup=2):
    """time_stateful for several variants of one call, taken in turn (A B C A B C ...) so that a
    drift over the run (clocks, host, L2 state) falls on every variant alike: {label: [ms]}."""
    out = {label: [] for label, _ in fns}
    for _ in range(reps):
        for label, fn in fns:
            out[label] += time_stateful(torch, fn, restore, 1, warmup=warmup)
        warmup = 0
    return out


def bench_stateless(torch, fn):
    """(p10, p50, p90) in ms: triton.testing.do_bench on GPU."""
    if DEV == "cuda":
        from triton.testing import do_bench

        return tuple(do_bench(fn, warmup=25, rep=200, quantiles=[0.1, 0.5, 0.9]))
    ms = time_stateful(torch, fn, lambda: None, 3, warmup=1)
    return pct(ms, 0.1), pct(ms, 0.5), pct(ms, 0.9)


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def linfit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx > 0 else float("nan")
    icpt = my - slope * mx
    ss_res = sum((y - (icpt + slope * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return slope, icpt, r2


# ----------------------------------------------------------------------------------------
# correctness on the GPU (--check)
# ----------------------------------------------------------------------------------------


def _compare(torch, rv, name, src, sel, stamp, copy_programs=None, **knobs):
    """Run reference and kernel on clones of src's state; return a list of mismatches. ``knobs``
    go to resolve_triton (kernel settings that must not change the result)."""

    def clone_state():
        return dict(
            hot_pos=src.hot_pos.clone(), hot_lru=src.hot_lru.clone(), kv=src.kv_pool.clone()
        )

    a, b = clone_state(), clone_state()
    kw = src.kwargs()

    def common(st):
        return (
            sel,
            src.tail_start,
            src.tail_loc,
            st["hot_pos"],
            st["hot_lru"],
            src.hot_loc_base,
            src.host_page_table,
            st["kv"],
            src.host_pool,
        )

    ref = rv.resolve(*common(a), stamp, impl="reference", **kw)
    if knobs:
        tri = rv.resolve_triton(
            *common(b), stamp, copy_programs_per_request=copy_programs, **knobs, **kw
        )
    else:
        tri = rv.resolve(
            *common(b), stamp, impl="triton", copy_programs_per_request=copy_programs, **kw
        )
    sync(torch)
    bad = []
    for what, x, y in (
        ("locations", ref.locations, tri.locations),
        ("counters", ref.counters, tri.counters),
        ("overflow", ref.overflow, tri.overflow),
        ("hot_pos", a["hot_pos"], b["hot_pos"]),
        ("hot_lru", a["hot_lru"], b["hot_lru"]),
        ("kv_pool", a["kv"], b["kv"]),
    ):
        if not torch.equal(x.cpu(), y.cpu()):
            bad.append(f"{name}: {what} differs")
    # bytes at the returned locations of history rows == their host rows
    loc = tri.locations.reshape(src.R, -1).long()
    s = sel.reshape(src.R, -1).long()
    hist = (s >= 0) & (s < src.ctx) & (loc >= 0)
    if src.direct_page_table is not None:
        pg = src.direct_page_table.long().gather(1, s.clamp(min=0) // src.ps)
        hist &= pg < 0  # direct rows live in a synthetic region whose bytes are not the row
    r_idx = torch.arange(src.R, device=loc.device)[:, None].expand_as(s)[hist]
    p = s[hist]
    hrow = src.host_page_table.long()[r_idx, p // src.ps] * src.ps + p % src.ps
    want = src.host_pool[hrow.cpu()].to(loc.device)
    got = b["kv"][loc[hist]]
    if not torch.equal(want, got):
        bad.append(f"{name}: bytes at returned locations are not the selected rows")
    c = tri.counters.sum(0).tolist()
    log(
        f"  check {name}: direct={c[0]} hit={c[1]} host_sel={c[2]} copies={c[3]} "
        f"overflow={int(tri.overflow.sum())} -> {'OK' if not bad else 'MISMATCH'}"
    )
    return bad


def run_check(torch, rv, sizes):
    log("== --check: Triton kernel vs PyTorch reference on the " + DEV)
    bad = []
    dry = sizes is SIZES["dry"]
    # 1. random cases: duplicates across queries, newest (tail) row, padding, helpers, staging
    for seed, (R, Q, K, B, staging, S) in enumerate(
        [
            (5, 3, 41, 64, True, 1),
            (5, 3, 41, 64, False, 4),
            (3, 1, 9, 16, False, None),
            (4, 8, 37, 128, True, 3),
        ]
    ):
        src = Source(
            torch,
            R=R,
            B=B,
            QK=Q * K,
            row_bytes=656,
            page_size=8,
            ctx=2000,
            tail=8,
            staging=staging,
            host_gib=0.05,
            seed=seed,
        )
        src.fill_hot(src.perms(B // 2), write_rows=True)
        for step in range(3 if not dry else 1):
            pool = src.perms(Q * K)
            pick = torch.randint(0, Q * K, (Q * K,), device=DEV)
            sel = pool[:, pick].reshape(R, Q, K).to(torch.int32).contiguous()
            sel[:, :, 0] = src.ctx  # the newest (tail) row in every query
            sel[0, 0, 1] = -1
            bad += _compare(
                torch, rv, f"random{seed}.{step}", src, sel, 1000 + step, copy_programs=S
            )
            rv.resolve(
                *src.args(sel), 1000 + step, impl="reference", **src.kwargs()
            )  # advance state
    a = sizes["a"]
    # 2. fig-8a shaped: Q=8, k, B, disjoint selections, staging, cold then retained cache
    R = min(4, a["R"])
    src = Source(
        torch,
        R=R,
        B=a["B"],
        QK=a["Q"] * a["K"],
        row_bytes=656,
        page_size=64,
        ctx=a["ctx"],
        staging=True,
        host_gib=0.5,
        seed=11,
    )
    sel = src.perms(a["Q"] * a["K"]).reshape(R, a["Q"], a["K"]).to(torch.int32).contiguous()
    # stamps above every filled lru (fill_hot draws them below 1000), as the engine's only grow
    bad += _compare(torch, rv, "fig8a-disjoint-cold", src, sel, 1005, copy_programs=2)
    src.fill_hot(sel.reshape(R, -1)[:, : a["B"] // 4].long(), write_rows=True)
    bad += _compare(torch, rv, "fig8a-disjoint-retained", src, sel, 1006)
    # 3. fig-8c / 8b shaped: single query, misses per request, and the direct path
    c = sizes["bc"]
    src = make_ds_source(
        torch,
        R=c["batches"][0],
        B=c["B_c"],
        ctx=min(c["ctx"], 131072),
        k=c["k"],
        misses=c["misses"],
        host_gib=0.5,
        seed=12,
        write_rows=True,
    )
    bad += _compare(torch, rv, "fig8c-misses", src, src.sel, 1007)
    if not dry:  # copy programs with roles by program id, with and without the early copy (the
        # interpreter runs programs in order, so its tests cover the rest: tests/kernels)
        bad += _compare(
            torch, rv, "fig8c-misses-pid-roles", src, src.sel, 1011, copy_programs=3, pid_roles=True
        )
        bad += _compare(
            torch,
            rv,
            "fig8c-misses-pid-roles-early",
            src,
            src.sel,
            1012,
            copy_programs=8,
            pid_roles=True,
            early_copy=True,
        )
    src = make_ds_source(
        torch,
        R=c["batches"][0],
        B=c["B_c"],
        ctx=min(c["ctx"], 131072),
        k=c["k"],
        misses=0,
        host_gib=0.5,
        seed=13,
        direct=True,
    )
    bad += _compare(torch, rv, "fig8b-direct", src, src.sel, 1008)
    if not dry:
        # a wide batch over a multi-tile cache: the victim keys rebuilt from the slot state and the
        # pipelined scan (the batch-160 defaults; every case above keeps its keys in registers)
        src = make_ds_source(
            torch, R=64, B=2048, ctx=20000, k=64, misses=16, host_gib=0.5, seed=14, write_rows=True
        )
        st = settings_of(rv, src)
        assert not st["keys_in_registers"] and st["scan_stages"] > 1, st
        bad += _compare(torch, rv, "wide-batch-keys-from-state", src, src.sel, 1009)
    # 4. CUDA graph capture / replay with a device stamp
    if DEV == "cuda":
        bad += check_graph(torch, rv)
    log("CHECK FAILED:\n  " + "\n  ".join(bad) if bad else "== check passed")
    return bad


def check_graph(torch, rv):
    bad = []
    R, Q, K, B = 4, 2, 64, 128
    src = Source(
        torch,
        R=R,
        B=B,
        QK=Q * K,
        row_bytes=656,
        page_size=16,
        ctx=4000,
        staging=True,
        host_gib=0.05,
        seed=21,
    )
    src.fill_hot(src.perms(B // 2), write_rows=True)
    sel_static = torch.zeros((R, Q, K), dtype=torch.int32, device=DEV)
    stamp = torch.tensor(
        [1000], dtype=torch.int64, device=DEV
    )  # above fill_hot's lru (< 1000), as in serving
    out = (
        torch.empty((R, Q, K), dtype=torch.int32, device=DEV),
        torch.zeros((R, 4), dtype=torch.int64, device=DEV),
        torch.empty((R,), dtype=torch.int32, device=DEV),
    )
    ref_state = dict(
        hot_pos=src.hot_pos.clone(), hot_lru=src.hot_lru.clone(), kv=src.kv_pool.clone()
    )
    saved = (src.hot_pos.clone(), src.hot_lru.clone(), src.kv_pool.clone())

    def call():
        rv.resolve(
            *src.args(sel_static), stamp, out=out, copy_programs_per_request=2, **src.kwargs()
        )

    def restore():
        src.hot_pos.copy_(saved[0])
        src.hot_lru.copy_(saved[1])
        src.kv_pool.copy_(saved[2])

    try:
        # warm-up (compile + workspace growth) on the stream the capture will use
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            restore()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=s):
                call()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        restore()
        for step in range(3):
            sel = src.perms(Q * K).reshape(R, Q, K).to(torch.int32)
            sel_static.copy_(sel)
            stamp.fill_(100 + step)
            graph.replay()
            ref = rv.resolve(
                sel,
                src.tail_start,
                src.tail_loc,
                ref_state["hot_pos"],
                ref_state["hot_lru"],
                src.hot_loc_base,
                src.host_page_table,
                ref_state["kv"],
                src.host_pool,
                100 + step,
                impl="reference",
                **src.kwargs(),
            )
            torch.cuda.synchronize()
            ok = (
                torch.equal(ref.locations, out[0])
                and torch.equal(ref.counters, out[1])
                and torch.equal(ref.overflow, out[2])
                and torch.equal(ref_state["hot_pos"], src.hot_pos)
                and torch.equal(ref_state["hot_lru"], src.hot_lru)
                and torch.equal(ref_state["kv"], src.kv_pool)
            )
            log(f"  check cuda-graph replay {step}: {'OK' if ok else 'MISMATCH'}")
            if not ok:
                bad.append(f"cuda-graph replay {step} differs from the reference")
    except Exception as e:  # report, but do not hide the kernel checks above
        bad.append(f"cuda-graph capture failed: {type(e).__name__}: {e}")
        log(f"  check cuda-graph: FAILED ({type(e).__name__}: {e})")
    return bad


# ----------------------------------------------------------------------------------------
# scenarios
# ----------------------------------------------------------------------------------------


def fig8a(torch, rv, args, sz):
    R, Q, K, B, ctx, reps = sz["R"], sz["Q"], sz["K"], sz["B"], sz["ctx"], sz["reps"]
    rb = args.row_bytes
    log(f"== Fig. 8a: R={R} Q={Q} k={K} B={B} row_bytes={rb} ctx={ctx}")
    src = Source(
        torch,
        R=R,
        B=B,
        QK=Q * K,
        row_bytes=rb,
        page_size=64,
        ctx=ctx,
        staging=True,
        host_gib=args.host_gib,
        seed=1,
    )
    points = []
    patterns = [("shared", 1.0), ("partial", 0.5), ("disjoint", 0.0)]
    if sz["extra_patterns"]:
        patterns += [("partial75", 0.75), ("partial25", 0.25)]
    for pname, overlap in patterns:
        n_common = int(round(overlap * K))
        n_own = K - n_common
        need = n_common + Q * n_own
        pool = src.perms(need)
        common = pool[:, :n_common]
        qs = [
            torch.cat([common, pool[:, n_common + q * n_own : n_common + (q + 1) * n_own]], 1)
            for q in range(Q)
        ]
        sel = torch.stack(qs, 1).to(torch.int32).contiguous()  # [R, Q, K]
        for cache in ("cold", "retained"):
            if cache == "cold":
                src.hot_pos.fill_(-1)
                src.hot_lru.zero_()
            else:
                # retained: a full cache that kept query 0's whole selection from an earlier call, plus
                # other history rows (shared selections then miss nothing: the panel's no-miss point)
                keep = qs[0]
                others = src.perms(min(src.ctx, need + B))
                # per request: rows not in that request's own selections (isin is row-blind)
                other_rows = torch.stack(
                    [
                        others[r][~torch.isin(others[r], pool[r])][: B - keep.shape[1]]
                        for r in range(R)
                    ]
                )
                src.fill_hot(torch.cat([keep, other_rows], 1))
            saved = (src.hot_pos.clone(), src.hot_lru.clone())
            stamp = [10_000]

            def restore():
                src.hot_pos.copy_(saved[0])
                src.hot_lru.copy_(saved[1])

            def fn():
                stamp[0] += 1
                return rv.resolve_triton(
                    *src.args(sel),
                    stamp[0],
                    copy_programs_per_request=args.copy_programs,
                    check=False,
                    **src.kwargs(),
                )

            restore()
            res = fn()
            copies = int(res.counters[:, 3].sum())
            hits = int(res.counters[:, 1].sum())
            ms = time_stateful(torch, fn, restore, reps)
            payload_mb = copies * rb / 1e6
            pt = dict(
                pattern=pname,
                overlap=overlap,
                cache=cache,
                copies=copies,
                payload_mb=payload_mb,
                hits=hits,
                overflow_rows=int(res.overflow.sum()),
                ms_median=statistics.median(ms),
                ms_min=min(ms),
                ms_max=max(ms),
                ms_all=ms,
            )
            points.append(pt)
            log(
                f"  {pname:9s} {cache:8s} payload {payload_mb:8.2f} MB  copies {copies:7d}  hits {hits:6d}  "
                f"median {pt['ms_median']:.3f} ms  [{pt['ms_min']:.3f}, {pt['ms_max']:.3f}]"
            )
    slope, icpt, r2 = linfit([p["payload_mb"] for p in points], [p["ms_median"] for p in points])
    gbps = 1.0 / slope if slope > 0 else float("nan")  # MB per ms == GB/s
    log(
        f"  fit: {gbps:.1f} GB/s (R^2 = {r2:.4f}), intercept {icpt:.3f} ms   [paper 49.4 GB/s, R^2 0.9992]"
    )

    def cold_disjoint(s):
        """The largest point (disjoint selections, cold cache) of source ``s`` and a restore
        of its state."""
        sel = s.perms(Q * K).reshape(R, Q, K).to(torch.int32).contiguous()
        s.hot_pos.fill_(-1)
        s.hot_lru.zero_()
        saved = (s.hot_pos.clone(), s.hot_lru.clone())

        def restore():
            s.hot_pos.copy_(saved[0])
            s.hot_lru.copy_(saved[1])

        return sel, restore

    sweep = []
    if args.sweep_copy_programs:  # copy-grid sweep
        sel, restore = cold_disjoint(src)
        for S in (1, 2, 4, 8):

            def fn(S=S):
                return rv.resolve_triton(
                    *src.args(sel), 20_000, copy_programs_per_request=S, check=False, **src.kwargs()
                )

            med = statistics.median(time_stateful(torch, fn, restore, 5))
            mb = R * Q * K * rb / 1e6
            sweep.append(
                dict(copy_programs_per_request=S, grid=R * S, ms_median=med, gbps=mb / med)
            )
            log(f"  copy-grid sweep: S={S} grid={R * S}: {med:.3f} ms = {mb / med:.1f} GB/s")
    src = None  # frees the pinned host store before the next one is allocated

    def time_largest(s, stamp):
        """(a)'s largest point (disjoint selections, cold cache) on source ``s``: median ms."""
        sel_s, restore_s = cold_disjoint(s)

        def fn():
            return rv.resolve_triton(*s.args(sel_s), stamp, check=False, **s.kwargs())

        return statistics.median(time_stateful(torch, fn, restore_s, 5))

    rows_sweep = []
    for rb2 in [int(x) for x in args.sweep_row_bytes.split(",") if x]:
        # the same largest point with other row sizes: PCIe reads of host memory move whole
        # 128-byte lines (a 656-byte row spans six, 768 bytes), so the payload rate should track
        # row_bytes / (bytes of the lines each row touches)
        s2 = Source(
            torch,
            R=R,
            B=B,
            QK=Q * K,
            row_bytes=rb2,
            page_size=64,
            ctx=ctx,
            staging=True,
            host_gib=args.host_gib,
            seed=2,
        )
        med = time_largest(s2, 40_000)
        mb = R * Q * K * rb2 / 1e6
        lines = touched(rb2, rb2, 128) * 128
        rows_sweep.append(
            dict(
                row_bytes=rb2,
                ms_median=med,
                gbps=mb / med,
                line_bytes_per_row=lines,
                line_gbps=mb / med * lines / rb2,
            )
        )
        log(
            f"  row-bytes sweep: {rb2} B rows: {med:.3f} ms = {mb / med:.1f} GB/s payload, "
            f"{mb / med * lines / rb2:.1f} GB/s of 128-byte lines ({lines:.0f} B per row)"
        )
        del s2
    stride_sweep = []
    for hs in [int(x) for x in args.sweep_host_stride.split(",") if x]:
        # the same largest point with the 656-byte rows padded to a host row stride of hs bytes
        # (sector- or line-aligned layouts): fewer 32-byte sectors and PCIe read requests per row
        P = (ctx + 64 + 63) // 64
        n_rows = min(R * P, max(1, int(args.host_gib * 2**30) // (64 * hs))) * 64
        hp = alloc_host_pool(torch, n_rows, hs)[:, :rb]
        s3 = Source(
            torch,
            R=R,
            B=B,
            QK=Q * K,
            row_bytes=rb,
            page_size=64,
            ctx=ctx,
            staging=True,
            host_gib=args.host_gib,
            seed=3,
            host_pool=hp,
        )
        med = time_largest(s3, 50_000)
        mb = R * Q * K * rb / 1e6
        sectors = touched(rb, hs, 32) * 32
        lines = touched(rb, hs, 128)
        stride_sweep.append(
            dict(
                host_stride=hs,
                row_bytes=rb,
                ms_median=med,
                gbps=mb / med,
                sector_bytes_per_row=sectors,
                lines_per_row=lines,
            )
        )
        log(
            f"  host-stride sweep: {rb} B rows {hs} B apart: {med:.3f} ms = {mb / med:.1f} GB/s payload "
            f"({sectors:.0f} B of sectors, {lines:.2f} lines per row)"
        )
        del s3, hp
    return dict(
        points=points,
        host_path_gbps=gbps,
        fit_r2=r2,
        fit_intercept_ms=icpt,
        row_bytes_sweep=rows_sweep,
        host_stride_sweep=stride_sweep,
        config=dict(
            R=R,
            Q=Q,
            k=K,
            B=B,
            row_bytes=rb,
            ctx=ctx,
            reps=reps,
            page_size=64,
            copy_programs_per_request=args.copy_programs
            or rv.default_copy_programs(R, Q, rv.num_sms(DEV)),
        ),
        copy_programs_sweep=sweep,
    )


def touched(row_bytes: int, stride: int, unit: int) -> float:
    """Mean number of ``unit``-byte blocks (32-byte sectors, 128-byte lines) a row of ``row_bytes``
    touches when rows lie ``stride`` bytes apart from an aligned base."""
    return statistics.mean(
        ((o % unit) + row_bytes + unit - 1) // unit for o in range(0, 128 * stride, stride)
    )


def call_knobs(args, knobs) -> dict:
    """A swept variant's resolver keywords, with --copy-programs where the variant names none."""
    return {"copy_programs_per_request": args.copy_programs, **knobs}


def early_knobs(args) -> list[tuple[dict, str]]:
    """--sweep-early-copy values as resolver knobs: S > 1 = early_copy with S copy programs per
    request; 1 = the plain path (no copy programs), whatever the defaults are."""
    out = []
    for S in (int(x) for x in args.sweep_early_copy.split(",") if x):
        kn = dict(early_copy=S > 1, copy_programs_per_request=S)
        out.append((kn, f"early copy S={S}" if S > 1 else "plain S=1"))
    return out


def parse_kw(spec: str) -> dict:
    """Resolver keyword arguments from ``a=1+b=True`` -> {"a": 1, "b": True} (values are Python
    literals); also benchmarks/ncu_resolver.py's --kw."""
    import ast

    out = {}
    for item in (x for x in spec.split("+") if x):
        name, eq, value = item.partition("=")
        if not eq or not name.strip().isidentifier():
            raise SystemExit(f"expected name=value joined by +, got {item!r}")
        out[name.strip()] = ast.literal_eval(value.strip())
    return out


def kw_knobs(args) -> list[tuple[dict, str]]:
    """--sweep-kw values as resolver keyword arguments: "a=1+b=True,a=2" -> [{a: 1, b: True}, {a: 2}]."""
    return [(parse_kw(spec), spec) for spec in args.sweep_kw.split(",") if spec]


def interleaved_rows(torch, rv, args, src, restore, stamp, R, B, misses) -> list:
    """The defaults and every --sweep-early-copy / --sweep-kw variant of one call, timed in turn
    (time_interleaved), one row each with interleaved=True. ``stamp``: an int (stateless calls) or
    the (c) stamp list, advanced per call."""
    variants = [({}, "defaults")] + early_knobs(args) + kw_knobs(args)
    fns = []
    for kn, label in variants:

        def fn(kn=kn):
            if isinstance(stamp, list):
                stamp[0] += 1
            st = stamp[0] if isinstance(stamp, list) else stamp
            return rv.resolve_triton(
                *src.args(src.sel), st, check=False, **call_knobs(args, kn), **src.kwargs()
            )

        fns.append((label, fn))
    reps = 1 if DEV == "cpu" else args.interleave
    times = time_interleaved(torch, fns, restore, reps, warmup=0 if DEV == "cpu" else 2)
    rows = []
    for kn, label in variants:
        med = statistics.median(times[label]) * 1e3
        rows.append(
            dict(
                batch=R,
                B=B,
                misses_per_request=misses,
                **kn,
                sweep=True,
                interleaved=True,
                variant=label,
                us_median=med,
                us_p10=pct(times[label], 0.1) * 1e3,
                us_p90=pct(times[label], 0.9) * 1e3,
            )
        )
        log(
            f"  ({'c' if misses else 'b'}) interleaved batch {R:3d} B {B:5d} {label}: {med:8.1f} us"
        )
    return rows


def fig8bc(torch, rv, args, sz):
    ctx, k, misses, B_c = sz["ctx"], sz["k"], sz["misses"], sz["B_c"]
    log(f"== Fig. 8b/8c: single query, k={k}, ctx={ctx}, batches {sz['batches']}, B {sz['Bs']}")
    P = (ctx + 64 + 63) // 64
    host_pool = alloc_host_pool(
        torch, min(max(sz["batches"]) * P * 64, int(args.host_gib * 2**30) // 656), 656
    )
    out_b, out_c = [], []

    def timed_call(src, stamp):
        return lambda: rv.resolve_triton(
            *src.args(src.sel),
            stamp,
            copy_programs_per_request=args.copy_programs,
            check=False,
            **src.kwargs(),
        )

    for R in sz["batches"]:
        for B in sz["Bs"]:
            src = make_ds_source(
                torch,
                R=R,
                B=B,
                ctx=ctx,
                k=k,
                misses=0,
                host_gib=args.host_gib,
                seed=100 + B + R,
                host_pool=host_pool,
            )
            fn = timed_call(src, 5000)
            res = fn()
            assert int(res.counters[:, 3].sum()) == 0 and int(res.counters[:, 1].sum()) == R * k, (
                res.counters
            )
            q10, q50, q90 = bench_stateless(torch, fn)
            guarded = statistics.median(
                time_stateful(torch, fn, lambda: None, 30 if DEV == "cuda" else 2)
            )
            out_b.append(
                dict(
                    batch=R,
                    B=B,
                    path="scan",
                    us_p10=q10 * 1e3,
                    us_median=q50 * 1e3,
                    us_p90=q90 * 1e3,
                    us_median_events_guarded=guarded * 1e3,
                    settings=settings_of(rv, src),
                )
            )
            log(
                f"  (b) batch {R:3d} B {B:5d} no miss: {q50 * 1e3:8.1f} us  [{q10 * 1e3:.1f}, {q90 * 1e3:.1f}]"
            )
            if B == B_c:
                out_c.append(
                    dict(
                        batch=R,
                        B=B,
                        misses_per_request=0,
                        us_p10=q10 * 1e3,
                        us_median=q50 * 1e3,
                        us_p90=q90 * 1e3,
                    )
                )
                if args.interleave:
                    out_b += interleaved_rows(torch, rv, args, src, lambda: None, 5000, R, B, 0)
                for knobs in scan_knobs(args.sweep_scan) + [
                    k for k, _ in early_knobs(args) + kw_knobs(args)
                ]:

                    def fn_t(knobs=knobs):
                        return rv.resolve_triton(
                            *src.args(src.sel),
                            5000,
                            check=False,
                            **call_knobs(args, knobs),
                            **src.kwargs(),
                        )

                    t_us = (
                        statistics.median(
                            time_stateful(torch, fn_t, lambda: None, 30 if DEV == "cuda" else 2)
                        )
                        * 1e3
                    )
                    out_b.append(
                        dict(
                            batch=R,
                            B=B,
                            path="scan",
                            **knobs,
                            sweep=True,
                            us_median_events_guarded=t_us,
                            us_median=t_us,
                            settings=settings_of(rv, src, knobs),
                        )
                    )
                    log(f"  (b) scan sweep batch {R:3d} B {B:5d} {knobs}: {t_us:8.1f} us")
            src = None  # frees the pinned host store before the next one is allocated
        # direct path: every selected row in ready optional history -> scan skipped
        src = make_ds_source(
            torch,
            R=R,
            B=B_c,
            ctx=ctx,
            k=k,
            misses=0,
            host_gib=args.host_gib,
            seed=7 + R,
            direct=True,
            host_pool=host_pool,
        )
        fn = timed_call(src, 5000)
        res = fn()
        assert int(res.counters[:, 0].sum()) == R * k, res.counters
        q10, q50, q90 = bench_stateless(torch, fn)
        guarded = statistics.median(
            time_stateful(torch, fn, lambda: None, 30 if DEV == "cuda" else 2)
        )
        out_b.append(
            dict(
                batch=R,
                B=B_c,
                path="direct",
                us_p10=q10 * 1e3,
                us_median=q50 * 1e3,
                us_p90=q90 * 1e3,
                us_median_events_guarded=guarded * 1e3,
            )
        )
        log(
            f"  (b) batch {R:3d} B {B_c:5d} direct path: {q50 * 1e3:8.1f} us  [{q10 * 1e3:.1f}, {q90 * 1e3:.1f}]"
        )
        src = None  # frees the pinned host store before the next one is allocated
        if "c" in args.skip.split(","):  # (b) alone: no host reads beside a serving lane
            continue
        # (c): `misses` host misses per request at B_c (state restored before each timing)
        src = make_ds_source(
            torch,
            R=R,
            B=B_c,
            ctx=ctx,
            k=k,
            misses=misses,
            host_gib=args.host_gib,
            seed=200 + R,
            host_pool=host_pool,
        )
        saved = (src.hot_pos.clone(), src.hot_lru.clone())
        stamp = [5000]

        def restore():
            src.hot_pos.copy_(saved[0])
            src.hot_lru.copy_(saved[1])

        def fn():
            stamp[0] += 1
            return rv.resolve_triton(
                *src.args(src.sel),
                stamp[0],
                copy_programs_per_request=args.copy_programs,
                check=False,
                **src.kwargs(),
            )

        restore()
        res = fn()
        assert int(res.counters[:, 3].sum()) == R * misses, res.counters
        ms = time_stateful(torch, fn, restore, sz["reps_c"], warmup=5)
        out_c.append(
            dict(
                batch=R,
                B=B_c,
                misses_per_request=misses,
                us_p10=pct(ms, 0.1) * 1e3,
                us_median=statistics.median(ms) * 1e3,
                us_p90=pct(ms, 0.9) * 1e3,
                settings=settings_of(rv, src),
            )
        )
        log(
            f"  (c) batch {R:3d} B {B_c:5d} {misses} misses: {statistics.median(ms) * 1e3:8.1f} us  "
            f"[{pct(ms, 0.1) * 1e3:.1f}, {pct(ms, 0.9) * 1e3:.1f}]"
        )
        if args.sweep_copy_programs:
            # plain decode uses one program per request by default: does a wider copy grid
            # fetch the misses sooner? (the same state restore before every timing)
            for S in (1, 2, 4, 8):

                def fn_s(S=S):
                    stamp[0] += 1
                    return rv.resolve_triton(
                        *src.args(src.sel),
                        stamp[0],
                        copy_programs_per_request=S,
                        check=False,
                        **src.kwargs(),
                    )

                ms_s = time_stateful(torch, fn_s, restore, *_sweep_timing(sz))
                out_c.append(
                    dict(
                        batch=R,
                        B=B_c,
                        misses_per_request=misses,
                        copy_programs_per_request=S,
                        sweep=True,
                        us_median=statistics.median(ms_s) * 1e3,
                    )
                )
                log(f"  (c) sweep batch {R:3d} S={S}: {statistics.median(ms_s) * 1e3:8.1f} us")
        # the scan tile (and keys in registers) on the miss path too
        sweeps_c = [(k, f"scan {k}") for k in scan_knobs(args.sweep_scan)]
        # rows per copy tile: 77 misses are three dependent host-load rounds at 32 rows
        sweeps_c += [
            (dict(copy_rows=int(x)), f"copy rows {x}") for x in args.sweep_copy_rows.split(",") if x
        ]
        # copy programs reading their first tile's host rows before the victims are known
        sweeps_c += early_knobs(args) + kw_knobs(args)
        for knobs, label in sweeps_c:

            def fn_k(knobs=knobs):
                stamp[0] += 1
                return rv.resolve_triton(
                    *src.args(src.sel),
                    stamp[0],
                    check=False,
                    **call_knobs(args, knobs),
                    **src.kwargs(),
                )

            ms_k = time_stateful(torch, fn_k, restore, *_sweep_timing(sz))
            out_c.append(
                dict(
                    batch=R,
                    B=B_c,
                    misses_per_request=misses,
                    **knobs,
                    sweep=True,
                    settings=settings_of(rv, src, knobs),
                    us_median=statistics.median(ms_k) * 1e3,
                )
            )
            log(f"  (c) sweep batch {R:3d} {label}: {statistics.median(ms_k) * 1e3:8.1f} us")
        if args.interleave:
            out_c += interleaved_rows(torch, rv, args, src, restore, stamp, R, B_c, misses)
        if args.ablate_c:
            out_c += ablate_c(
                torch, rv, args, src, saved, stamp, R, B_c, misses, reps=_sweep_timing(sz)[0]
            )
        if args.phase_times:
            out_c.append(phase_times_c(torch, rv, args, src, restore, stamp, R, B_c, misses, sz))
            for knobs, _ in early_knobs(args) + kw_knobs(args):  # and where those calls' time goes
                out_c.append(
                    phase_times_c(
                        torch, rv, args, src, restore, stamp, R, B_c, misses, sz, knobs=knobs
                    )
                )
        if args.sweep_radix:
            # victim selection: slots per radix tile x digit width (same result for every choice)
            for spec in args.sweep_radix.split(","):
                tile, bits = (int(x) for x in spec.split(":"))

                def fn_r(tile=tile, bits=bits):
                    stamp[0] += 1
                    return rv.resolve_triton(
                        *src.args(src.sel),
                        stamp[0],
                        copy_programs_per_request=args.copy_programs,
                        radix_tile=tile,
                        radix_bits=bits,
                        check=False,
                        **src.kwargs(),
                    )

                ms_r = time_stateful(torch, fn_r, restore, *_sweep_timing(sz))
                out_c.append(
                    dict(
                        batch=R,
                        B=B_c,
                        misses_per_request=misses,
                        radix_tile=tile,
                        radix_bits=bits,
                        sweep=True,
                        us_median=statistics.median(ms_r) * 1e3,
                    )
                )
                log(
                    f"  (c) radix sweep batch {R:3d} tile {tile} bits {bits}: "
                    f"{statistics.median(ms_r) * 1e3:8.1f} us"
                )
        src = None  # frees the pinned host store before the next one is allocated
    return out_b, out_c


def phase_summary(t, names) -> tuple[dict, float]:
    """Phase boundaries [timings, requests, phases] (ns) -> ({phase: median over timings of the
    slowest request's time in it, us}, median over timings of the slowest request's start-to-end
    time, us). A phase a request skipped (its boundaries equal) counts 0 for it."""
    t = t.double()
    per = {}
    for j in range(1, len(names)):
        d = (t[:, :, j] - t[:, :, j - 1]) / 1e3
        per[names[j]] = statistics.median(d.max(dim=1).values.tolist())
    total = (t[:, :, -1] - t[:, :, 0]) / 1e3
    return per, statistics.median(total.max(dim=1).values.tolist())


def phase_times_c(torch, rv, args, src, restore, stamp, R, B_c, misses, sz, knobs=None) -> dict:
    """Where one (c) call's time goes, by phase: the kernel stamps the GPU's global timer at each
    phase boundary of every request's resolver program (resolver.PHASE_NAMES), under the same
    timing protocol (state restored, L2 flushed, launch queued ahead). Per phase: the median over
    timings of the slowest request's duration (the call waits for its slowest request)."""
    reps, warm = _sweep_timing(sz)
    names = rv.PHASE_NAMES
    buf = torch.zeros((reps + warm, R, len(names)), dtype=torch.int64, device=DEV)
    k = [0]

    kn = call_knobs(args, knobs or {})

    def fn():
        stamp[0] += 1
        i = min(k[0], buf.shape[0] - 1)
        k[0] += 1
        return rv.resolve_triton(
            *src.args(src.sel), stamp[0], phase_times=buf[i], check=False, **kn, **src.kwargs()
        )

    ms = time_stateful(torch, fn, restore, reps, warmup=warm)
    per, program = phase_summary(buf[warm:].cpu(), names)
    # what the call ran with, defaults resolved (a row without knobs is at the commit's defaults)
    resolved = copy_settings_of(rv, R, 1, kn)
    row = dict(
        batch=R,
        B=B_c,
        misses_per_request=misses,
        phase_times=True,
        sweep=True,
        **(knobs or {}),
        resolved=resolved,
        us_median=statistics.median(ms) * 1e3,
        phase_us_slowest_request=per,
        program_us_median=program,
        timer="%globaltimer (ns; its update granularity bounds the resolution)",
    )
    log(
        f"  (c) phases batch {R:3d}{' ' + str(knobs) if knobs else ''} (slowest request, us): "
        + ", ".join(f"{n} {v:.1f}" for n, v in per.items())
        + f"; program {row['program_us_median']:.1f} of {row['us_median']:.1f} us per call"
    )
    return row


def ablate_c(torch, rv, args, src, saved, stamp, R, B_c, misses, reps=25) -> list:
    """Where (c)'s miss time goes, by variants of the same call that take one cost out or add
    one (METHOD: time variants, take differences; no hardware counters needed):
      host_in_hbm    the host store copied to device memory: the copy's PCIe round trips leave
      stamps_1pass   every slot's stamp equal: the victim radix select takes one pass, not two
      stamps_3pass   stamps over 2**20: three passes
      l2_warm        no L2 flush before the timing: the slot state and page tables come from L2
    The same restore before every timing; results are checked like the main call (misses
    copied)."""
    rows = []
    lru_uniform = torch.full_like(saved[1], 500)
    lru_wide = torch.randint(
        0, 1 << 20, saved[1].shape, device=saved[1].device, dtype=saved[1].dtype
    )
    stamp[0] = max(stamp[0], 1 << 20)  # every lru below the call's stamp, as in serving
    host_dev = src.host_pool.to(DEV) if src.host_pool.numel() <= (4 << 30) else None

    def run_with(host, lru, flush=True):
        def restore():
            src.hot_pos.copy_(saved[0])
            src.hot_lru.copy_(lru)

        def fn():
            stamp[0] += 1
            a = list(src.args(src.sel))
            a[-1] = host
            return rv.resolve_triton(
                *a,
                stamp[0],
                copy_programs_per_request=args.copy_programs,
                check=False,
                **src.kwargs(),
            )

        restore()
        res = fn()
        assert int(res.counters[:, 3].sum()) == R * misses, res.counters
        return (
            statistics.median(
                time_stateful(
                    torch,
                    fn,
                    restore,
                    reps,
                    warmup=0 if DEV == "cpu" else 3,
                    flush_bytes=(256 << 20) if flush else 1024,
                )
            )
            * 1e3
        )

    variants = [
        ("baseline", src.host_pool, saved[1], True),
        ("stamps_1pass", src.host_pool, lru_uniform, True),
        ("stamps_3pass", src.host_pool, lru_wide, True),
        ("l2_warm", src.host_pool, saved[1], False),
    ]
    if host_dev is not None:
        variants.insert(1, ("host_in_hbm", host_dev, saved[1], True))
    for name, host, lru, flush in variants:
        us = run_with(host, lru, flush)
        rows.append(
            dict(batch=R, B=B_c, misses_per_request=misses, ablate=name, sweep=True, us_median=us)
        )
        log(f"  (c) ablate batch {R:3d} {name:13s}: {us:8.1f} us")
    src.hot_pos.copy_(saved[0])
    src.hot_lru.copy_(saved[1])
    return rows


_SCAN_KEYS = ("scan_tile", "keys_in_registers", "pending_bitmap", "scan_stages")


def settings_of(rv, src, knobs=None) -> dict:
    """The scan settings a timed call ran with (given knobs, the rest the kernel's defaults for
    the shape): recorded in each row, so a row says what it measured when the defaults change."""
    knobs = knobs or {}
    out = rv.scan_settings(
        src.R,
        src.B,
        src.host_page_table.shape[1] * src.ps,
        **{k: knobs[k] for k in _SCAN_KEYS if k in knobs},
    )
    # and how it copied (copy programs, early copy, roles by program id)
    out.update(
        copy_settings_of(
            rv, src.R, src.sel.shape[1] if getattr(src, "sel", None) is not None else 1, knobs
        )
    )
    return out


def copy_settings_of(rv, R: int, Q: int, knobs: dict) -> dict:
    """The copy settings (resolver.copy_settings) a call of R requests x Q queries ran with: the
    knobs it named, the kernel's defaults for this GPU for the rest."""
    return rv.copy_settings(
        R,
        Q,
        **{
            k: knobs.get(k)
            for k in ("copy_programs_per_request", "early_copy", "pid_roles", "copy_grid")
        },
        num_sms=rv.num_sms(DEV),
    )


def scan_knobs(spec: str) -> list:
    """--sweep-scan entries: TILE (victim keys in registers when B fits one tile), TILEs (keys
    rebuilt from the slot state in each radix pass), TILEb / TILEg (the scan's membership test by
    the pending-position bitmap / by gathering the position scratch; default: the kernel's choice
    by batch and scratch size), TILEpN (the scan loop software-pipelined N deep), suffixes combined
    (TILEsb, TILEsbp2), any with :WARPS, e.g. 1024,4096s,4096b,4096g,1024sbp2,4096:16."""
    out = []
    for item in (x for x in spec.split(",") if x):
        tile, _, warps = item.partition(":")
        flags = tile.lstrip("0123456789")
        knobs = dict(scan_tile=int(tile[: len(tile) - len(flags)]))
        stages = re.search(r"p(\d+)$", flags)
        if stages:
            knobs["scan_stages"] = int(stages.group(1))
            flags = flags[: stages.start()]
        if set(flags) - set("bgs") or {"b", "g"} <= set(flags):
            raise SystemExit(
                f"--sweep-scan: bad suffix in {item!r} (s: keys rebuilt from the slot "
                f"state, b: pending bitmap, g: position-scratch gather, pN: N pipeline stages)"
            )
        if "s" in flags:
            knobs["keys_in_registers"] = False
        if "b" in flags or "g" in flags:
            knobs["pending_bitmap"] = "b" in flags
        if warps:
            knobs["num_warps"] = int(warps)
        out.append(knobs)
    return out


def main() -> None:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="smaller batch (a) and context (b, c): smoke run"
    )
    ap.add_argument(
        "--check", action="store_true", help="verify kernel vs reference on the GPU before timing"
    )
    ap.add_argument("--check-only", action="store_true", help="run the --check part and exit")
    ap.add_argument("--out", default=None, help="summary path (default results/fig8/summary.json)")
    ap.add_argument("--row-bytes", type=int, default=656, help="row size for (a)")
    ap.add_argument(
        "--host-gib", type=float, default=2.0, help="cap on the pinned host store (GiB)"
    )
    ap.add_argument(
        "--copy-programs",
        type=int,
        default=None,
        help="copy programs per request (default: the resolver's choice)",
    )
    ap.add_argument(
        "--sweep-copy-programs",
        action="store_true",
        help="also sweep the copy grid (programs per request) on (a) and (c)",
    )
    ap.add_argument(
        "--sweep-copy-rows",
        default="",
        help="also time (c) with these rows per copy tile, e.g. 32,64,128",
    )
    ap.add_argument(
        "--sweep-early-copy",
        default="",
        help="also time (b) at B_c and (c) with early_copy at these copy programs per request, "
        "e.g. 1,2,4 (the copy programs read their first tile's host rows before the victims "
        "are known; 1 = the plain path, no copy programs); "
        "with --phase-times, also split those (c) calls by phase",
    )
    ap.add_argument(
        "--sweep-kw",
        default="",
        help="also time (b) at B_c and (c) with these resolver keyword arguments, comma-separated "
        "sets of name=value joined by +, e.g. scan_tile=1024+pending_bitmap=True,copy_rows=64",
    )
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="REPS",
        help="also time the defaults and every --sweep-early-copy / --sweep-kw variant in turn "
        "(A B C A B C ...), REPS timings each, for (b) at B_c and for (c): a drift over the run "
        "then falls on every variant alike",
    )
    ap.add_argument(
        "--sweep-host-stride",
        default="",
        help="also time (a)'s largest point with the host store's rows padded to these strides "
        "(bytes, >= --row-bytes, multiples of 8), e.g. 656,672,768",
    )
    ap.add_argument(
        "--sweep-row-bytes",
        default="",
        help="also time (a)'s largest point with these row sizes, e.g. 640,656,768",
    )
    ap.add_argument(
        "--sweep-scan",
        default="",
        help="also time (b) and (c) at B_c with these scan tiles: TILE, TILEs (victim keys "
        "rebuilt from the slot state instead of kept in registers), TILEb / TILEg (pending "
        "bitmap / position-scratch gather), TILEpN (N pipeline stages), optional :WARPS; "
        "e.g. 1024,4096s,4096b,4096g,4096:16",
    )
    ap.add_argument(
        "--sweep-radix",
        default="",
        help="also time (c) with these victim-selection settings, tile:bits,... "
        "(e.g. 256:4,1024:8,2048:8,4096:8; 256:4 is the tile and digit width before the histogram change)",
    )
    ap.add_argument(
        "--ablate-c",
        action="store_true",
        help="also time (c) with one cost taken out or added: the host store in device memory "
        "(no PCIe), one radix pass, three radix passes",
    )
    ap.add_argument(
        "--phase-times",
        action="store_true",
        help="also split (c)'s call into the resolver's phases (the kernel stamps the GPU's global "
        "timer at each phase boundary; GPU only)",
    )
    ap.add_argument(
        "--num-warps",
        type=int,
        default=None,
        help="warps per resolver program for every timed call (default: the kernel's 8)",
    )
    ap.add_argument(
        "--batches",
        default="",
        help="batches of (b) and (c), comma-separated (default 8,160); the summary's batch-8 / "
        "batch-160 keys take the smallest / largest, e.g. 8,16,32,160",
    )
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of parts to skip: a, bc, or c (time (b) "
        "only: it reads nothing from host memory)",
    )
    ap.add_argument(
        "--cpu-dry-run", action="store_true", help="exercise the script on CPU (interpreter)"
    )
    args = ap.parse_args()
    if args.phase_times and args.cpu_dry_run:
        ap.error("--phase-times reads the GPU's global timer: not available in a CPU dry run")
    bad_stride = [
        x
        for x in args.sweep_host_stride.split(",")
        if x and not (x.isdigit() and int(x) >= args.row_bytes and int(x) % 8 == 0)
    ]
    if bad_stride:
        ap.error(
            f"--sweep-host-stride: {bad_stride} (expected byte strides >= --row-bytes, multiples of 8)"
        )
    bad_rows = [x for x in args.sweep_copy_rows.split(",") if x and not x.isdigit()]
    if bad_rows:
        ap.error(f"--sweep-copy-rows: {bad_rows} (expected row counts, e.g. 32,64)")

    if args.cpu_dry_run:
        DEV = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    if not args.cpu_dry_run:
        if not torch.cuda.is_available():
            sys.exit(
                "bench_resolver: no CUDA device here. This benchmark times the fused resolver on a GPU "
                "(pinned host memory read through UVA); run it on the GPU machine. CPU correctness: "
                "pytest tests/kernels/test_resolver.py (or --cpu-dry-run to exercise this script)."
            )
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            sys.exit(
                "bench_resolver: TRITON_INTERPRET is set; unset it to time the compiled kernel"
            )
    import triton

    from systems.kernels import resolver as rv

    if args.num_warps:  # tuning runs: every call below goes through resolve_triton
        rv = _with_num_warps(rv, args.num_warps)

    sizes = SIZES["dry" if args.cpu_dry_run else "quick" if args.quick else "full"]
    if args.batches:
        try:
            batches = tuple(sorted({int(x) for x in args.batches.split(",") if x}))
        except ValueError:
            ap.error(f"--batches: expected comma-separated integers, got {args.batches!r}")
        if len(batches) < 2 or batches[0] < 1:
            ap.error(
                "--batches: at least two positive batch sizes (the smallest and largest are the summary's)"
            )
        sizes = dict(sizes, bc=dict(sizes["bc"], batches=batches))
    out = args.out or (
        str(Path("/tmp") / "fig8_dry_run.json")
        if args.cpu_dry_run
        else str(REPO / "results" / "fig8" / "summary.json")
    )
    gpu = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run, interpreter)"
    log(
        f"device {gpu}; torch {torch.__version__}; triton {triton.__version__}; CUDA {torch.version.cuda}"
    )
    summary = dict(
        gpu=gpu,
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        quick=bool(args.quick),
        dry_run=bool(args.cpu_dry_run),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        commit=_commit(),
        sizes=sizes,
        paper=PAPER,
        num_warps=args.num_warps or 8,
        method=dict(
            a="CUDA events around the resolver call only; state restore + 256 MB L2 flush "
            "before each of the nine timings; median, min, max",
            b="triton.testing.do_bench(warmup=25, rep=200), quantiles 0.1/0.5/0.9; "
            "us_median_events_guarded = the (a) method (events + L2 flush + GPU spin) "
            "as a cross-check that host launch overhead did not leak into do_bench",
            c="as (a) with 100 timings, quantiles 0.1/0.5/0.9",
        ),
    )

    if args.check or args.check_only:
        t0 = time.time()
        bad = run_check(torch, rv, sizes)
        summary["check"] = dict(passed=not bad, mismatches=bad, seconds=round(time.time() - t0, 1))
        if bad or args.check_only:
            _write(out, summary)
            if bad:
                sys.exit(1)
            return

    skip = set(x for x in args.skip.split(",") if x)
    if "a" not in skip:
        a = fig8a(torch, rv, args, sizes["a"])
        summary["fig8a"] = a
        summary["host_path_gbps"] = a["host_path_gbps"]
        summary["fit_r2"] = a["fit_r2"]
        if DEV == "cuda":
            torch.cuda.empty_cache()
    if "bc" not in skip:
        sz = sizes["bc"]
        b, c = fig8bc(torch, rv, args, sz)
        summary["fig8b_points"] = b
        summary["fig8c_points"] = c
        summary["fig8bc_config"] = dict(
            sz,
            row_bytes=656,
            page_size=64,
            selected_per_request=sz["k"],
            copy_programs_per_request=args.copy_programs
            or rv.default_copy_programs(sz["batches"][0], 1, rv.num_sms(DEV)),
        )

        def pick(rows, **kv):
            # kernel time: CUDA events with the L2 flush and GPU spin of (a) and (c) where the
            # point has it (launch overhead excluded; do_bench medians include the host launch)
            for r in rows:
                if all(r.get(k) == v for k, v in kv.items()) and not r.get("sweep"):
                    return r.get("us_median_events_guarded", r["us_median"])
            return None

        lo_b, hi_b = min(sz["batches"]), max(sz["batches"])
        Bc = sz["B_c"]
        summary["nomiss_b4096_batch8_us"] = pick(b, batch=lo_b, B=Bc, path="scan")
        summary["nomiss_b4096_batch160_us"] = pick(b, batch=hi_b, B=Bc, path="scan")
        summary["miss77_b4096_batch8_us"] = pick(c, batch=lo_b, misses_per_request=sz["misses"])
        summary["miss77_b4096_batch160_us"] = pick(c, batch=hi_b, misses_per_request=sz["misses"])
        summary["direct_b4096_batch8_us"] = pick(b, batch=lo_b, B=Bc, path="direct")
        summary["bc_time_method"] = (
            "CUDA events, L2 flush + GPU spin before each call (kernel time)"
        )
        s_lo = {r["B"]: pick(b, batch=lo_b, B=r["B"], path="scan") for r in b if r["batch"] == lo_b}
        s_hi = {r["B"]: pick(b, batch=hi_b, B=r["B"], path="scan") for r in b if r["batch"] == hi_b}
        b_min, b_max = min(sz["Bs"]), max(sz["Bs"])
        summary["scan_growth_2048_to_8192"] = dict(
            batch8=s_lo[b_max] / s_lo[b_min], batch160=s_hi[b_max] / s_hi[b_min]
        )
        summary["direct_vs_scan_b4096_batch8"] = (
            summary["nomiss_b4096_batch8_us"] / summary["direct_b4096_batch8_us"]
        )
    _write(out, summary)
    log("== summary (ours vs paper)")
    for k in (
        "host_path_gbps",
        "fit_r2",
        "nomiss_b4096_batch8_us",
        "nomiss_b4096_batch160_us",
        "miss77_b4096_batch8_us",
        "miss77_b4096_batch160_us",
        "scan_growth_2048_to_8192",
        "direct_vs_scan_b4096_batch8",
    ):
        if k in summary:
            log(f"  {k:30s} {_fmt(summary[k]):>34s}   paper {_fmt(PAPER[k])}")


def _with_num_warps(rv, num_warps):
    """The resolver module with resolve_triton bound to ``num_warps`` (a namespace copy: the
    kernel module itself is untouched)."""
    import types

    ns = types.SimpleNamespace(**{k: getattr(rv, k) for k in dir(rv) if not k.startswith("__")})
    ns.resolve_triton = lambda *a, **kw: rv.resolve_triton(*a, **{"num_warps": num_warps, **kw})
    return ns


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def _commit():
    c = os.environ.get("DHS_GIT_COMMIT")
    if c:
        return c
    try:
        import subprocess

        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    except Exception:
        return None


def _write(path, summary):
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(summary, indent=2, default=float))
    log(f"wrote {p}")


if __name__ == "__main__":
    main()
