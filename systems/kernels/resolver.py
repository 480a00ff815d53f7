"""Fused residency-aware resolver (paper sec. 3.2, Fig. 2; union resolution of sec. 3.3).

One call resolves the top-k selections of ``Q`` queries (``Q = 1`` plain decode, up to
``K_max`` for verification) of ``R`` requests against ONE KV source, and returns a device
location for every selection. Three implementations of one semantics:

* ``_resolver_kernel`` -- the Triton kernel (one launch per call, two with ``copy_grid``, see
  "Launch" below);
* ``resolve_reference`` -- a plain-PyTorch reference (slow, obviously correct);
* ``resolve(..., impl="triton" | "reference")`` -- the dispatcher the engine calls.

Why each default is what it is, what else was tried and what it measured:
docs/kernels/resolver.md.

Contract
========
Storage (per KV source)
    ``kv_pool``   uint8 [num_locations, row_bytes]   device pool; rows are opaque bytes.
    ``host_pool`` uint8 [num_host_rows, row_bytes]   host store; pinned CPU memory on GPU
                                                     runs (read by the kernel through UVA); its
                                                     rows may be padded (a column slice of a wider
                                                     store: row stride >= row_bytes).
Per request ``r`` of the call
    ``selections``        int32 [R, Q, k]  token positions, ``-1`` = padding; duplicates
                                           within and across queries allowed.
    ``tail_start``        int32 [R]        positions ``p >= tail_start[r]`` live in the tail,
    ``tail_loc``          int32 [R, T]     at ``tail_loc[r, p - tail_start[r]]`` (a position
                                           past the tail is invalid input).
    ``direct_page_table`` int32 [R, P] or None   ready optional history: page
                                           ``j = p // page_size`` -> device page id or -1;
                                           location = ``id * page_size + p % page_size``.
    ``hot_pos``           int32 [R, B]     position held by each hot slot, -1 = empty
                                           (non-negative entries unique per request).
    ``hot_lru``           int64 [R, B]     last-use stamp of each slot, ``0 <= lru < 2**59``.
    ``hot_loc_base``      int32 [R]        slot ``s`` lives at location ``hot_loc_base[r] + s``.
    ``host_page_table``   int32 [R, P]     host row of ``p`` =
                                           ``host_page_table[r, p // page_size] * page_size + p % page_size``.
                                           Every position is ``< P * page_size``.
    ``staging_loc_base``  int32 [R] or None  (extension, see "Overflow") the j-th overflow
                                           row of request r goes to ``staging_loc_base[r] + j``.
    ``stamp``             int, or int64 device tensor of one element (graph-safe form):
                          the LRU clock, strictly increasing per call, ``0 <= stamp < 2**59``.

Resolution, per request (Fig. 2)
    1. Direct: a selection ``p >= tail_start`` resolves to its tail location; otherwise, when
       ``direct_page_table`` is given and the page is ready, to its direct location. Direct
       rows never touch the hot cache (a row that is also in the hot cache is neither
       refreshed nor protected by this selection).
    2. Scan: the remaining positions -- the union over the Q queries, deduplicated -- are
       looked up among the B slots. A hit resolves to its slot; its ``lru := stamp``. Hit
       slots are protected (never victims in this call).
    3. Miss: let the distinct misses be ordered by first occurrence in the flattened [Q, k]
       selection order (``i = q * k + j``), ``m`` of them; ``h`` = number of hit slots;
       ``avail = B - h``; ``nv = min(m, avail)``. The victim set is the ``nv`` unprotected
       slots with the smallest key ``(0 if hot_pos == -1 else hot_lru + 1, slot)``: empty
       slots first, then oldest stamp, ties to the lower slot index. The j-th miss
       (j < nv) is paired with the j-th victim in ASCENDING SLOT ORDER (a pairing that the
       kernel gets from a prefix sum instead of a sort); its host row is copied to
       ``kv_pool[hot_loc_base + slot]``, ``hot_pos := position``, ``hot_lru := stamp``.
    Steps 2 and 3 are skipped entirely for a request whose selections all resolved in 1
    (its hot_pos / hot_lru are untouched).

Overflow (only possible with Q > 1)
    Misses with rank ``j >= nv`` overflow; ``overflow[r] = m - nv``. Without staging their
    locations are ``-2`` (a later staging arena handles them). With ``staging_loc_base``
    (used by the Fig. 8a benchmark, where disjoint verification selections fetch 8 x k rows
    per request through a B = 2k cache) they are copied from host to
    ``staging_loc_base[r] + (j - nv)`` (staging needs ``Q * k`` rows per request) and
    resolve there. Overflow rows never enter the hot cache.

Outputs
    ``locations`` int32 [R, Q, k] in selection order (-1 where the selection is -1,
    -2 for unstaged overflow); ``hot_pos`` / ``hot_lru`` / ``kv_pool`` updated in place;
    ``counters`` int64 [R, 4] = (selections resolved directly via tail+direct map,
    selections resolved by hot hits, selections of missed rows (overflowed ones
    included), distinct rows copied from host by this call); ``overflow`` int32 [R].
    ``host_bytes_moved(counters, row_bytes)`` = copies * row_bytes.

Bytes moved per call (n = Q*k selections per request)
    host -> HBM payload (PCIe, the term that sets Fig. 8a's slope): copies * row_bytes read
        from pinned host memory with 16-byte loads, and the same written into kv_pool.
    metadata (HBM / L2): selections 4n read, locations 4n written, one 4-byte tail or
        direct-page-table entry per selection. Only for a request with a pending selection: the
        scan reads hot_pos 4 B + hot_lru 8 B per slot and tests each slot's position against the
        pending set (a 4-byte gather of the position scratch, or on wide batches one bit of a
        W / 8-byte bitmap); hit and victim slots write lru 8 B / pos 4 B. Only for a request with
        misses: victim selection takes 1 + ceil(bits(stamp range) / 8) radix passes over the B
        keys plus one assignment pass; the keys stay in registers when B fits one scan tile, else
        each pass rebuilds them from hot_pos / hot_lru (12 bytes per slot and pass).
    Nothing else: no host sync, no host-side gather, no per-call allocation once the
    workspace has grown to the largest shapes.

Launch
======
ONE launch per call (two with ``copy_grid``, below), grid ``R * S`` programs (``S`` copy programs
per request, see ``default_copy_programs``: plain decode 8 or 4 while the R x S programs fit the
GPU's multiprocessors, else 1; verification ``clamp(ceil(64 / R), 1, 8)``). Each request's
resolver program runs, separated by CTA barriers:
(A) tail / direct-map resolution and dedup marks (``atomic_min`` of the flattened index on a
per-request position scratch), (B) the B-slot scan (hits, lru := stamp, victim keys),
(C) first-occurrence ranks of the distinct misses (prefix sum), (V) a 256-way radix select of
the victim threshold over the slot keys plus a prefix sum assigning victims in slot order,
(D) locations in selection order, then the scratch reset. The other ``R * (S - 1)`` programs
wait on their request's flag (release / acquire, published as soon as the victims are known, so
the copy runs beside (D)) and copy an interleaved share of that request's miss rows: the copy
grid scales with the batch (paper: 4 to 32 thread blocks). With ``S == 1`` the resolver program
copies its rows itself and no flag exists.

Two ways to hand out roles: plain decode (``early_copy``, ``pid_roles``) takes programs 0..R-1
as resolvers, publishes the miss list after (C) so each copy program reads its first tile of host
rows while (V) runs, and each request's last copy program re-arms its flag (one 128-byte line per
request). Verification takes tickets from an atomic counter, so every request's resolver is
resident before any copy program can wait; flags only grow there (launch ``e`` of a per-launch
epoch publishes ``2e + 1`` and ``2e + 2``). The scratch is self-cleaning (entries a call touched
are reset at its end), so it is never memset after creation.

``copy_grid = G`` (the paper's HiSparse baseline, sec. 4.2.1: its copy path runs on a fixed grid
of four thread blocks, the batch's size notwithstanding): the resolver launches with ``S == 1`` and
copies nothing, leaving each request's miss list, victims and counts in the workspace; a second
launch on the same stream, ``_copy_grid_kernel`` with G programs, copies every request's miss rows
(tiles of rows handed out round-robin). Same results and host -> HBM bytes as above; the metadata
adds each request's 4-byte copy count read by each of the G programs, and per copy tile its
request's counts and location bases (16 bytes).

Compiled for sm_90a with 8 warps (``aot_compile`` / ``aot_compile_copy`` compile without a
GPU; the CPU tests do).

CUDA-graph safety: the wrapper performs no host sync and no data-dependent shape work. Not
graph-safe: (a) the first call with a new largest shape (grows the workspace: warm up with
the largest batch / positions / B / Q*k before capture, or pass a preallocated
``ResolverWorkspace``); (b) a Python-int ``stamp`` is baked into a captured graph -- pass a
device tensor and advance it on the device; (c) the pinned-memory check is skipped while
capturing. Concurrent calls on different streams must use different workspaces (the default
workspace cache is keyed by device and current stream, so capture and replay on one stream
share one workspace).

Pinned host memory in Triton 3.6: the pinned CPU tensor itself is passed as the pointer
argument. Triton's CUDA launcher calls ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)``
on ``data_ptr()``, which succeeds for page-locked memory and yields its UVA device address, so
loads from it are PCIe reads (bit-exact; docs/design.md has the bandwidth measured). A pageable
CPU tensor fails there ("cannot be accessed from Triton (cpu tensor?)"); the wrapper rejects it
earlier with a clear message.

CPU: the Triton kernel runs under ``TRITON_INTERPRET=1`` (which must be set before triton is
imported). Memory: the position scratch is ``R * P * page_size`` int32 (e.g. 32 MB for
R = 160 at 50K positions, 320 MB at 500K).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

try:  # triton is optional for the reference path
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - triton missing
    triton = None
    tl = None
    _HAVE_TRITON = False

__all__ = [
    "ResolveResult",
    "ResolverWorkspace",
    "resolve",
    "resolve_reference",
    "resolve_triton",
    "host_bytes_moved",
    "COUNTER_DIRECT",
    "COUNTER_HOT_HIT",
    "COUNTER_HOST_SEL",
    "COUNTER_HOST_COPIES",
    "LOC_PAD",
    "LOC_OVERFLOW",
]

COUNTER_DIRECT = 0
COUNTER_HOT_HIT = 1
COUNTER_HOST_SEL = 2
COUNTER_HOST_COPIES = 3
LOC_PAD = -1
LOC_OVERFLOW = -2

_SENT = 0x7FFFFFFF  # empty scratch entry
_HIT = 0x10000000  # scratch entry = _HIT | slot after the scan
_MISS = 0x20000000  # scratch entry = _MISS | miss rank after dedup
_IDX = 0x0FFFFFFF
_KEY_NONE = 1 << 62  # victim key of a protected slot
_MAX_STAMP = 1 << 59
# Tuned on the H200 (docs/kernels/resolver.md has each measurement):
# victim selection: 8-bit radix digits over 2048-slot tiles (2 passes of 2 tiles at B = 4096)
RADIX_DIGIT_BITS = 8
RADIX_TILE = 2048
# scan: one 4096-slot tile keeps the victim keys in registers (no store and re-read per pass);
# from SCAN_WIDE_BATCH requests up, or past one tile, 1024-slot tiles (occupancy), pipelined
# SCAN_STAGES_MULTI deep, with the keys rebuilt from the slot state in each pass
SCAN_TILE = 4096
SCAN_TILE_MULTI = 1024
SCAN_WIDE_BATCH = 64
SCAN_STAGES_MULTI = 2
# membership test: a bit per pending position once the batch's 4-byte position scratch outgrows
# L2 (the gather then reads HBM); below that the scratch gather is faster
PENDING_BITMAP_BYTES = 32 << 20
# plain decode: copy programs start reading host rows before the victims are known (early copy),
# with roles by program id; the first S that keeps the whole grid resident, else 1 program
EARLY_COPY = True
DECODE_COPY_PROGRAMS = (8, 4)
PID_ROLES = True
# copy_grid: requests whose tile counts a copy program reads as one vector
COPY_GRID_REQ_BLOCK = 256
# the multiprocessors a CPU (interpreter) run assumes: the H200's, so CPU tests take the GPU's path
# for the same batch (with the smallest copy grid of that path, see default_copy_programs)
_NOMINAL_SMS = 132


# phase boundaries written with ``phase_times`` (ns, the GPU's global timer), per request: the
# resolver program's start, then the end of each phase; unwritten entries stay as the caller set them
# (a request with no pending selection skips B..D)
PHASE_NAMES = (
    "start",
    "A_direct_dedup",
    "B_scan",
    "C_rank_misses",
    "V_victims",
    "D_locations",
    "reset_counters",
    "copy_done",
)


class ResolveResult(NamedTuple):
    locations: torch.Tensor  # int32 [R, Q, k]
    counters: torch.Tensor  # int64 [R, 4]
    overflow: torch.Tensor  # int32 [R]


def host_bytes_moved(counters: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """Host bytes moved by a call (or by accumulated counters): distinct copies * row_bytes.

    Returns a 0-dim int64 tensor on the counters' device (``.item()`` syncs)."""
    return counters[..., COUNTER_HOST_COPIES].sum() * int(row_bytes)


# --------------------------------------------------------------------------------------
# Argument checking shared by both implementations
# --------------------------------------------------------------------------------------


def _check_hot_rows(hot_rows: torch.Tensor, R: int) -> None:
    if hot_rows.dtype != torch.int64 or tuple(hot_rows.shape) != (R,):
        raise ValueError("hot_rows must be int64 [R] (the rows of hot_pos / hot_lru) or None")


def _check_args(
    selections,
    tail_start,
    tail_loc,
    hot_pos,
    hot_lru,
    hot_loc_base,
    host_page_table,
    kv_pool,
    host_pool,
    page_size,
    direct_page_table,
    staging_loc_base,
    hot_rows=None,
):
    if selections.dim() != 3:
        raise ValueError("selections must be int32 [R, Q, k]")
    R = selections.shape[0]
    i32 = torch.int32
    for name, t, shape in (
        ("selections", selections, None),
        ("tail_start", tail_start, (R,)),
        ("hot_pos", hot_pos, None),
        ("hot_loc_base", hot_loc_base, (R,)),
        ("tail_loc", tail_loc, None),
        ("host_page_table", host_page_table, None),
    ):
        if t.dtype != i32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if hot_lru.dtype != torch.int64:
        raise TypeError(f"hot_lru must be int64, got {hot_lru.dtype}")
    rows = R if hot_rows is None else hot_pos.shape[0]
    if (
        hot_pos.dim() != 2
        or hot_pos.shape[0] != rows
        or tuple(hot_lru.shape) != tuple(hot_pos.shape)
    ):
        raise ValueError("hot_pos int32 [R, B] and hot_lru int64 [R, B] expected")
    if hot_rows is not None:
        _check_hot_rows(hot_rows, R)
    if tail_loc.dim() != 2 or tail_loc.shape[0] != R:
        raise ValueError("tail_loc must be int32 [R, T]")
    if host_page_table.dim() != 2 or host_page_table.shape[0] != R:
        raise ValueError("host_page_table must be int32 [R, P]")
    if direct_page_table is not None:
        if (
            direct_page_table.dtype != i32
            or direct_page_table.dim() != 2
            or direct_page_table.shape[0] != R
        ):
            raise ValueError("direct_page_table must be int32 [R, P] or None")
    if staging_loc_base is not None:
        if staging_loc_base.dtype != i32 or tuple(staging_loc_base.shape) != (R,):
            raise ValueError("staging_loc_base must be int32 [R] or None")
    if kv_pool.dtype != torch.uint8 or host_pool.dtype != torch.uint8:
        raise TypeError("kv_pool and host_pool must be uint8 [rows, row_bytes]")
    if kv_pool.dim() != 2 or host_pool.dim() != 2 or kv_pool.shape[1] != host_pool.shape[1]:
        raise ValueError("kv_pool and host_pool must be [rows, row_bytes] with equal row_bytes")
    if int(page_size) <= 0:
        raise ValueError("page_size must be positive")


# --------------------------------------------------------------------------------------
# Reference implementation (plain PyTorch, per request; defines the semantics)
# --------------------------------------------------------------------------------------


def resolve_reference(
    selections,
    tail_start,
    tail_loc,
    hot_pos,
    hot_lru,
    hot_loc_base,
    host_page_table,
    kv_pool,
    host_pool,
    stamp,
    *,
    page_size,
    direct_page_table=None,
    staging_loc_base=None,
    out=None,
    accumulate_counters=False,
) -> ResolveResult:
    """Plain-PyTorch resolver with exactly the kernel's semantics (see module docstring).

    Works on any device (computes on CPU copies of the metadata, writes results back).
    Asserts on invalid input (positions past the tail or past the page tables, duplicate
    hot positions, stamps out of range)."""
    _check_args(
        selections,
        tail_start,
        tail_loc,
        hot_pos,
        hot_lru,
        hot_loc_base,
        host_page_table,
        kv_pool,
        host_pool,
        page_size,
        direct_page_table,
        staging_loc_base,
    )
    ps = int(page_size)
    R, Q, K = selections.shape
    QK = Q * K
    B = hot_pos.shape[1]
    dev = kv_pool.device
    stamp_v = int(stamp.reshape(-1)[0].item()) if torch.is_tensor(stamp) else int(stamp)
    assert 0 <= stamp_v < _MAX_STAMP, "stamp out of range"

    cpu = torch.device("cpu")
    sel_all = selections.reshape(R, QK).to(cpu, torch.int64)
    ts_all = tail_start.to(cpu, torch.int64)
    tl_all = tail_loc.to(cpu, torch.int64)
    hpt_all = host_page_table.to(cpu, torch.int64)
    dpt_all = None if direct_page_table is None else direct_page_table.to(cpu, torch.int64)
    base_all = hot_loc_base.to(cpu, torch.int64)
    stg_all = None if staging_loc_base is None else staging_loc_base.to(cpu, torch.int64)
    hp_all = hot_pos.to(cpu, torch.int64).clone()
    lru_all = hot_lru.to(cpu).clone()
    assert bool((lru_all >= 0).all()) and bool((lru_all < _MAX_STAMP).all()), "hot_lru out of range"
    W = host_page_table.shape[1] * ps
    T = tail_loc.shape[1]

    locs = torch.full((R, QK), LOC_PAD, dtype=torch.int64)
    counters = torch.zeros((R, 4), dtype=torch.int64)
    overflow = torch.zeros((R,), dtype=torch.int64)
    copy_src, copy_dst = [], []

    for r in range(R):
        sel = sel_all[r]
        loc = locs[r]
        valid = sel >= 0
        ts = int(ts_all[r])
        in_tail = valid & (sel >= ts)
        tidx = sel[in_tail] - ts
        assert bool((tidx < T).all()), f"request {r}: selected position past the tail"
        loc[in_tail] = tl_all[r][tidx]
        pend = valid & ~in_tail
        if dpt_all is not None:
            pg = torch.full_like(sel, -1)
            pg[pend] = dpt_all[r][sel[pend] // ps]
            ready = pend & (pg >= 0)
            loc[ready] = pg[ready] * ps + sel[ready] % ps
            pend = pend & ~ready
        n_pend = int(pend.sum())
        counters[r, COUNTER_DIRECT] = int(valid.sum()) - n_pend
        if n_pend == 0:
            continue  # scan and miss path skipped: hot state untouched

        pidx = pend.nonzero().squeeze(1)
        ppos = sel[pidx]
        assert bool((ppos < W).all()), f"request {r}: position past the page tables"
        uniq, inv = torch.unique(ppos, return_inverse=True)
        first = torch.full((uniq.numel(),), QK, dtype=torch.int64).scatter_reduce(
            0, inv, pidx, reduce="amin"
        )
        order = torch.argsort(first)  # distinct pending positions, first-occurrence order
        U = uniq[order]
        u_rank = torch.empty_like(order)
        u_rank[order] = torch.arange(order.numel())

        hp = hp_all[r]
        lru = lru_all[r]
        filled = (hp >= 0).nonzero().squeeze(1)
        fpos = hp[filled]
        assert fpos.unique().numel() == fpos.numel(), f"request {r}: duplicate hot positions"
        sp, sidx = torch.sort(fpos)
        sslot = filled[sidx]
        if sp.numel() > 0:
            j = torch.searchsorted(sp, U).clamp(max=sp.numel() - 1)
            found = sp[j] == U
            hit_slot = torch.where(found, sslot[j], torch.full_like(U, -1))
        else:
            found = torch.zeros_like(U, dtype=torch.bool)
            hit_slot = torch.full_like(U, -1)

        protected = torch.zeros(B, dtype=torch.bool)
        protected[hit_slot[found]] = True
        h = int(found.sum())
        miss_pos = U[~found]  # first-occurrence order
        m = miss_pos.numel()
        avail = B - h
        nv = min(m, avail)
        base = int(base_all[r])

        key = torch.where(hp < 0, torch.zeros_like(lru), lru + 1)
        cand = (~protected).nonzero().squeeze(1)  # ascending slot order
        ordk = torch.argsort(key[cand], stable=True)  # ties -> lower slot
        victims = torch.sort(cand[ordk[:nv]]).values  # victim set, ascending slot order

        lru[hit_slot[found]] = stamp_v
        hp[victims] = miss_pos[:nv]
        lru[victims] = stamp_v

        u_loc = torch.full((U.numel(),), LOC_OVERFLOW, dtype=torch.int64)
        u_loc[found] = base + hit_slot[found]
        miss_loc = torch.full((m,), LOC_OVERFLOW, dtype=torch.int64)
        miss_loc[:nv] = base + victims
        n_copy = nv
        if stg_all is not None and m > nv:
            miss_loc[nv:] = int(stg_all[r]) + torch.arange(m - nv)
            n_copy = m
        u_loc[~found] = miss_loc
        loc[pidx] = u_loc[u_rank[inv]]

        src = hpt_all[r][miss_pos[:n_copy] // ps] * ps + miss_pos[:n_copy] % ps
        copy_src.append(src)
        copy_dst.append(miss_loc[:n_copy])

        hsel = found[u_rank[inv]]
        counters[r, COUNTER_HOT_HIT] = int(hsel.sum())
        counters[r, COUNTER_HOST_SEL] = n_pend - int(hsel.sum())
        counters[r, COUNTER_HOST_COPIES] = n_copy
        overflow[r] = m - nv

    # byte copies host -> kv_pool
    if copy_src:
        src = torch.cat(copy_src)
        dst = torch.cat(copy_dst)
        if src.numel():
            rows = host_pool[src.to(host_pool.device)]
            kv_pool[dst.to(dev)] = rows.to(dev)

    hot_pos.copy_(hp_all.to(torch.int32))
    hot_lru.copy_(lru_all)
    locs32 = locs.to(torch.int32).reshape(R, Q, K)
    if out is not None:
        o_loc, o_cnt, o_ovf = out
        o_loc.copy_(locs32)
        if accumulate_counters:
            o_cnt.add_(counters.to(o_cnt.device))
        else:
            o_cnt.copy_(counters)
        o_ovf.copy_(overflow.to(torch.int32))
        return ResolveResult(o_loc, o_cnt, o_ovf)
    return ResolveResult(locs32.to(dev), counters.to(dev), overflow.to(torch.int32).to(dev))


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------

if _HAVE_TRITON:

    @triton.jit
    def _victim_key(hp_row, hl_row, scr_row, W, s, ms, stamp, n_stale):
        """The victim keys of slots ``s``, rebuilt from the slot state after the scan (keys not in
        registers): 12 bytes read per slot instead of an 8-byte key stored by the scan and read
        back, so a call without misses writes no keys. A slot the scan hit holds ``lru == stamp``;
        where no other slot did before the call (``n_stale == 0``, always so when stamps only grow)
        that equality is the protection mark, else the position scratch says which of them this
        call hit (``HIT | slot``, kept until the scratch reset)."""
        q = tl.load(hp_row + s, mask=ms, other=-1, cache_modifier=".cg")
        lru = tl.load(hl_row + s, mask=ms, other=0, cache_modifier=".cg")
        key = tl.where(q < 0, tl.zeros_like(lru), lru + 1)
        tie = ms & (lru == stamp)
        sc = tl.load(
            scr_row + q,
            mask=tie & (n_stale > 0) & (q >= 0) & (q < W),
            other=0,
            cache_modifier=".cg",
        )
        hit = tie & ((n_stale == 0) | (sc == (s | 0x10000000)))
        return tl.where(ms & ~hit, key, 4611686018427387904)

    @triton.jit
    def _stamp_phase(dbg_ptr, r64, k: tl.constexpr, TIMING: tl.constexpr):
        """With TIMING, write the GPU's global timer (ns) as phase boundary ``k`` of request
        ``r64`` (PHASE_NAMES): where a call's time goes, per phase, without a profiler."""
        if TIMING:
            t = tl.inline_asm_elementwise(
                "mov.u64 $0, %globaltimer;",
                "=l,r",
                [r64.to(tl.int32)],
                dtype=tl.int64,
                is_pure=False,
                pack=1,
            )
            tl.store(dbg_ptr + r64 * 8 + k, t)

    @triton.jit
    def _host_rows_of(mpos_row, hpt_row, j, mj, page_size):
        """Host rows of the misses ``j`` of a request's miss list (page table -> row)."""
        p = tl.load(mpos_row + j, mask=mj, other=0, cache_modifier=".cg")
        hpage = tl.load(hpt_row + p // page_size, mask=mj, other=0)
        return hpage.to(tl.int64) * page_size + (p % page_size)

    @triton.jit
    def _load_tile(host_ptr, hrow, mj, cols, WORDS: tl.constexpr, HSTRIDE: tl.constexpr):
        """Read a copy tile of host rows ``hrow`` (rows where ``mj``, ``HSTRIDE`` words apart; a
        compile-time stride, so the compiler sees the rows' 16-byte alignment and keeps 16-byte
        loads): (words, mask)."""
        m2 = mj[:, None] & (cols < WORDS)[None, :]
        return tl.load(host_ptr + (hrow[:, None] * HSTRIDE + cols[None, :]), mask=m2), m2

    @triton.jit
    def _store_tile(
        kv_ptr,
        vic_row,
        hot_base,
        stg_base,
        j,
        mj,
        nv,
        val,
        m2,
        cols,
        WORDS: tl.constexpr,
        HAS_STAGING: tl.constexpr,
    ):
        """Store a copy tile of miss rows ``j``: the j-th miss goes to its victim's slot (j < nv),
        else to the staging arena."""
        isv = j < nv
        vs = tl.load(vic_row + j, mask=mj & isv, other=0, cache_modifier=".cg")
        if HAS_STAGING:
            dst = tl.where(isv, hot_base + vs, stg_base + (j - nv))
        else:
            dst = hot_base + vs
        tl.store(kv_ptr + (dst.to(tl.int64)[:, None] * WORDS + cols[None, :]), val, mask=m2)

    @triton.jit
    def _copy_tile(
        kv_ptr,
        host_ptr,
        mpos_row,
        hpt_row,
        vic_row,
        hot_base,
        stg_base,
        t,
        nc,
        nv,
        page_size,
        rows,
        cols,
        ROWS: tl.constexpr,
        WORDS: tl.constexpr,
        HSTRIDE: tl.constexpr,
        HAS_STAGING: tl.constexpr,
    ):
        """Copy tile ``t`` (ROWS misses) of a request's miss list from host to its slots."""
        j = t * ROWS + rows
        mj = j < nc
        hrow = _host_rows_of(mpos_row, hpt_row, j, mj, page_size)
        val, m2 = _load_tile(host_ptr, hrow, mj, cols, WORDS, HSTRIDE)
        _store_tile(
            kv_ptr, vic_row, hot_base, stg_base, j, mj, nv, val, m2, cols, WORDS, HAS_STAGING
        )

    @triton.jit
    def _publish(meta_ptr, flag_addr, r64, nv, ncopy, flag, COPY_PROGRAMS: tl.constexpr):
        """Hand this request's copy list (miss positions, counts, and with ``flag`` at stage 2 the
        victims) to its copy programs: stage 1 (``2e + 1``) once the miss list is known (early
        copy), stage 2 (``2e + 2``) once the victims are."""
        tl.store(meta_ptr + r64 * 2, nv)
        tl.store(meta_ptr + r64 * 2 + 1, ncopy)
        tl.debug_barrier()
        if COPY_PROGRAMS:
            tl.atomic_xchg(flag_addr, flag, sem="release")

    @triton.jit
    def _wait_flag(flag_addr, target):
        """Copy program: wait until its request's flag reaches ``target`` (an acquire atomic per
        poll), then a CTA barrier so every thread sees what the resolver published."""
        f = tl.atomic_add(flag_addr, 0, sem="acquire")
        while f < target:
            f = tl.atomic_add(flag_addr, 0, sem="acquire")
        tl.debug_barrier()

    @triton.jit(do_not_specialize=["stamp_arg"])
    def _resolver_kernel(
        sel_ptr,
        loc_ptr,
        tail_start_ptr,
        tail_loc_ptr,
        tail_stride,
        T,
        dpt_ptr,
        dpt_stride,
        hpt_ptr,
        hpt_stride,
        hot_pos_ptr,
        hot_pos_stride,
        hot_lru_ptr,
        hot_lru_stride,
        hot_rows_ptr,
        hot_base_ptr,
        stg_base_ptr,
        kv_ptr,
        host_ptr,
        counters_ptr,
        overflow_ptr,
        stamp_arg,
        scr_ptr,
        scr_stride,
        W,
        bm_ptr,
        bm_stride,
        mpos_ptr,
        vic_ptr,
        list_stride,
        meta_ptr,
        flags_ptr,
        ctrl_ptr,
        pflags_ptr,
        pdone_ptr,
        R,
        QK,
        B,
        page_size,
        S,
        HAS_DIRECT: tl.constexpr,
        HAS_STAGING: tl.constexpr,
        HAS_HOT_ROWS: tl.constexpr,
        STAMP_IS_PTR: tl.constexpr,
        ACCUM: tl.constexpr,
        COPY_PROGRAMS: tl.constexpr,
        WORDS: tl.constexpr,
        WPAD: tl.constexpr,
        ROWS: tl.constexpr,
        HSTRIDE: tl.constexpr,
        QBLK: tl.constexpr,
        BBLK: tl.constexpr,
        RBLK: tl.constexpr,
        DIGIT: tl.constexpr,
        NBINS: tl.constexpr,
        REG_KEYS: tl.constexpr,
        BITMAP: tl.constexpr,
        SCAN_STAGES: tl.constexpr,
        EARLY: tl.constexpr,
        PID_ROLES: tl.constexpr,
        DEFER_COPY: tl.constexpr,
        dbg_ptr,
        TIMING: tl.constexpr,
    ):
        # Constants (literals, Triton globals must be constexpr):
        #   SENT 0x7FFFFFFF, HIT 0x10000000, MISS 0x20000000, IDX 0x0FFFFFFF,
        #   PENDING location marker -3, KEY_NONE 1 << 62 = 4611686018427387904.
        # ---- role ---------------------------------------------------------------------
        # COPY_PROGRAMS: S > 1, copy programs beside the resolvers, handed their work through a flag;
        # their roles come from tickets, or (PID_ROLES) from the program id
        if COPY_PROGRAMS and not PID_ROLES:
            ticket = tl.atomic_add(ctrl_ptr, 1).to(tl.int64)  # ctrl = [ticket, done, epoch]
            epoch = tl.atomic_add(ctrl_ptr + 2, 0).to(tl.int64)
        else:
            # PID_ROLES: programs 0..R-1 resolve, the rest copy; flags start at 0 every launch
            # (the request's last copy program resets them), so the epoch is always 0
            ticket = tl.program_id(0).to(tl.int64)
            epoch = tl.zeros([], tl.int64)
        r64 = ticket % R
        share = (ticket // R).to(tl.int32)
        if PID_ROLES:
            flag_addr = pflags_ptr + r64 * 16  # one 128-byte line per request's flag
        else:
            flag_addr = flags_ptr + r64

        sel_row = sel_ptr + r64 * QK
        loc_row = loc_ptr + r64 * QK
        scr_row = scr_ptr + r64 * scr_stride
        bm_row = bm_ptr + r64 * bm_stride
        mpos_row = mpos_ptr + r64 * list_stride
        vic_row = vic_ptr + r64 * list_stride
        if HAS_HOT_ROWS:  # the slot state in place: no gather / scatter around the call
            slot_row = tl.load(hot_rows_ptr + r64)
        else:
            slot_row = r64
        hp_row = hot_pos_ptr + slot_row * hot_pos_stride
        hl_row = hot_lru_ptr + slot_row * hot_lru_stride
        hot_base = tl.load(hot_base_ptr + r64)
        if HAS_STAGING:
            stg_base = tl.load(stg_base_ptr + r64)
        else:
            stg_base = hot_base * 0

        if share == 0:
            # ======================= per-request resolver =============================
            _stamp_phase(dbg_ptr, r64, 0, TIMING)
            if STAMP_IS_PTR:
                stamp = tl.load(stamp_arg).to(tl.int64)
            else:
                stamp = stamp_arg + tl.zeros([], tl.int64)
            ts = tl.load(tail_start_ptr + r64)
            offs_q = tl.arange(0, QBLK)
            offs_b = tl.arange(0, BBLK)
            n_pend = tl.zeros([], tl.int32)
            n_dir = tl.zeros([], tl.int32)
            # -- phase A: tail / direct map; mark pending positions (first occurrence) --
            for q0 in range(0, QK, QBLK):
                i = q0 + offs_q
                mi = i < QK
                p = tl.load(sel_row + i, mask=mi, other=-1)
                valid = p >= 0
                in_tail = valid & (p >= ts)
                tidx = p - ts
                tloc = tl.load(
                    tail_loc_ptr + r64 * tail_stride + tidx, mask=in_tail & (tidx < T), other=-1
                )
                loc = tl.where(in_tail, tloc, tl.where(valid, -3, -1))
                pend = valid & (p < ts)
                if HAS_DIRECT:
                    pg = tl.load(dpt_ptr + r64 * dpt_stride + p // page_size, mask=pend, other=-1)
                    ready = pend & (pg >= 0)
                    loc = tl.where(ready, pg * page_size + p % page_size, loc)
                    pend = pend & (pg < 0)
                tl.store(loc_row + i, loc, mask=mi)
                tl.atomic_min(scr_row + p, i, mask=pend & (p < W), sem="relaxed")
                if BITMAP:
                    # one bit per pending position: the scan's membership test reads these W / 8
                    # bytes (L2-resident) instead of gathering the 4-byte position scratch
                    tl.atomic_or(
                        bm_row + (p >> 5),
                        tl.full(p.shape, 1, tl.int32) << (p & 31),
                        mask=pend & (p < W),
                        sem="relaxed",
                    )
                n_pend += tl.sum(pend.to(tl.int32), 0)
                n_dir += tl.sum((valid & ~pend).to(tl.int32), 0)

            n_hsel = tl.zeros([], tl.int32)
            n_msel = tl.zeros([], tl.int32)
            nv = tl.zeros([], tl.int32)
            ncopy = tl.zeros([], tl.int32)
            ovf = tl.zeros([], tl.int32)
            _stamp_phase(dbg_ptr, r64, 1, TIMING)
            if n_pend > 0:
                tl.debug_barrier()
                # -- phase B: scan the B slots: hits, protection, victim keys ----------
                n_hit = tl.zeros([], tl.int32)
                lo = tl.full([], 4611686018427387904, tl.int64)
                hi = tl.zeros([], tl.int64)
                # REG_KEYS (B fits one scan tile): the victim keys stay in registers for phase V;
                # else phase V rebuilds them from hot_pos / hot_lru (_victim_key)
                kreg = tl.zeros([BBLK], tl.int64)
                # slots that already held lru == stamp before this call, not hit by it: they make
                # the rebuilt keys consult the scratch for protection
                n_stale = tl.zeros([], tl.int32)
                for b0 in tl.range(0, B, BBLK, num_stages=SCAN_STAGES):
                    s = b0 + offs_b
                    ms = s < B
                    q = tl.load(hp_row + s, mask=ms, other=-1)
                    lru = tl.load(hl_row + s, mask=ms, other=0)
                    qv = ms & (q >= 0) & (q < W)
                    if BITMAP:
                        wd = tl.load(bm_row + (q >> 5), mask=qv, other=0, cache_modifier=".cg")
                        hit = qv & (((wd >> (q & 31)) & 1) != 0)
                    else:
                        sc = tl.load(scr_row + q, mask=qv, other=0x7FFFFFFF, cache_modifier=".cg")
                        hit = qv & (sc != 0x7FFFFFFF)
                    tl.store(scr_row + q, s | 0x10000000, mask=hit)
                    tl.store(hl_row + s, stamp + tl.zeros_like(lru), mask=hit)
                    cand = ms & ~hit
                    key = tl.where(q < 0, tl.zeros_like(lru), lru + 1)
                    key = tl.where(cand, key, 4611686018427387904)
                    if REG_KEYS:
                        kreg = key
                    else:
                        n_stale += tl.sum((cand & (lru == stamp)).to(tl.int32), 0)
                    n_hit += tl.sum(hit.to(tl.int32), 0)
                    lo = tl.minimum(lo, tl.min(key, 0))
                    hi = tl.maximum(hi, tl.max(tl.where(cand, key, 0), 0))
                tl.debug_barrier()
                _stamp_phase(dbg_ptr, r64, 2, TIMING)
                # -- phase C: rank the distinct misses in first-occurrence order -------
                m = tl.zeros([], tl.int32)
                for q0 in range(0, QK, QBLK):
                    i = q0 + offs_q
                    mi = i < QK
                    loc = tl.load(loc_row + i, mask=mi, other=-1, cache_modifier=".cg")
                    pend = mi & (loc == -3)
                    p = tl.load(sel_row + i, mask=pend, other=0)
                    sc = tl.load(scr_row + p, mask=pend, other=-1, cache_modifier=".cg")
                    first = pend & (sc == i)
                    f32 = first.to(tl.int32)
                    rank = m + tl.cumsum(f32, 0) - 1
                    tl.store(scr_row + p, rank | 0x20000000, mask=first)
                    tl.store(mpos_row + rank, p, mask=first)
                    m += tl.sum(f32, 0)
                nv = tl.minimum(m, B - n_hit)
                ovf = m - nv
                if HAS_STAGING:
                    ncopy = m
                else:
                    ncopy = nv
                tl.debug_barrier()
                if EARLY:  # copy programs start their host reads while the victims are chosen
                    _publish(meta_ptr, flag_addr, r64, nv, ncopy, 2 * epoch + 1, COPY_PROGRAMS)
                _stamp_phase(dbg_ptr, r64, 3, TIMING)
                # -- phase V: victims = nv smallest keys, assigned in slot order -------
                if nv > 0:
                    d = hi - lo
                    top = tl.zeros([], tl.int32)
                    while (d >> (top + DIGIT)) > 0:
                        top += DIGIT
                    prefix = tl.zeros([], tl.int64)
                    need = nv
                    shift = top
                    bins = tl.arange(0, NBINS)
                    offs_r = tl.arange(0, RBLK)
                    while shift >= 0:
                        counts = tl.zeros([NBINS], tl.int32)
                        hs = shift + DIGIT
                        if REG_KEYS:
                            c = (offs_b < B) & (kreg != 4611686018427387904)
                            x = kreg - lo
                            match = c & ((x >> hs) == (prefix >> hs))
                            dig = ((x >> shift) & (NBINS - 1)).to(tl.int32)
                            counts += tl.histogram(dig, NBINS, mask=match)
                        else:
                            for b0 in range(0, B, RBLK):
                                s = b0 + offs_r
                                ms = s < B
                                key = _victim_key(hp_row, hl_row, scr_row, W, s, ms, stamp, n_stale)
                                c = ms & (key != 4611686018427387904)
                                x = key - lo
                                match = c & ((x >> hs) == (prefix >> hs))
                                dig = ((x >> shift) & (NBINS - 1)).to(tl.int32)
                                # a block-wide histogram per tile (shared-memory atomics), not
                                # a [RBLK, bins] one-hot: wide tiles and 256 bins stay cheap
                                counts += tl.histogram(dig, NBINS, mask=match)
                        cum = tl.cumsum(counts, 0)
                        dsel = tl.sum((cum < need).to(tl.int32), 0)
                        below = tl.sum(tl.where(bins < dsel, counts, 0), 0)
                        need -= below
                        prefix += dsel.to(tl.int64) << shift
                        shift -= DIGIT
                    thr = lo + prefix
                    taken = tl.zeros([], tl.int32)
                    eq_seen = tl.zeros([], tl.int32)
                    for b0 in range(0, B, BBLK):
                        s = b0 + offs_b
                        ms = s < B
                        if REG_KEYS:
                            key = kreg
                        else:
                            key = _victim_key(hp_row, hl_row, scr_row, W, s, ms, stamp, n_stale)
                        c = ms & (key != 4611686018427387904)
                        lt = c & (key < thr)
                        eq = c & (key == thr)
                        # the v-th victim: keys below the threshold before it + the first `need`
                        # threshold ties
                        eqrank = eq_seen + tl.cumsum(eq.to(tl.int32), 0) - 1
                        chosen = lt | (eq & (eqrank < need))
                        ch32 = chosen.to(tl.int32)
                        v = taken + tl.cumsum(ch32, 0) - 1
                        taken += tl.sum(ch32, 0)
                        eq_seen += tl.sum(eq.to(tl.int32), 0)
                        tl.store(vic_row + v, s, mask=chosen)
                        newp = tl.load(mpos_row + v, mask=chosen, other=-1, cache_modifier=".cg")
                        tl.store(hp_row + s, newp, mask=chosen)
                        tl.store(hl_row + s, stamp + tl.zeros_like(key), mask=chosen)
                tl.debug_barrier()
                _stamp_phase(dbg_ptr, r64, 4, TIMING)
                # the copy needs only the miss list and the victims: the copy programs start
                # now, while this program writes the locations and resets the scratch
                _publish(meta_ptr, flag_addr, r64, nv, ncopy, 2 * epoch + 2, COPY_PROGRAMS)
                # -- phase D: locations in selection order ------------------------------
                for q0 in range(0, QK, QBLK):
                    i = q0 + offs_q
                    mi = i < QK
                    loc = tl.load(loc_row + i, mask=mi, other=-1, cache_modifier=".cg")
                    pend = mi & (loc == -3)
                    p = tl.load(sel_row + i, mask=pend, other=0)
                    sc = tl.load(scr_row + p, mask=pend, other=0, cache_modifier=".cg")
                    idx = sc & 0x0FFFFFFF
                    is_hit = pend & ((sc & 0x30000000) == 0x10000000)
                    is_miss = pend & ~is_hit
                    in_cache = idx < nv
                    vs = tl.load(
                        vic_row + idx, mask=is_miss & in_cache, other=0, cache_modifier=".cg"
                    )
                    if HAS_STAGING:
                        oloc = stg_base + (idx - nv)
                    else:
                        oloc = tl.zeros_like(idx) - 2
                    newloc = tl.where(
                        is_hit, hot_base + idx, tl.where(in_cache, hot_base + vs, oloc)
                    )
                    tl.store(loc_row + i, newloc, mask=pend)
                    n_hsel += tl.sum(is_hit.to(tl.int32), 0)
                    n_msel += tl.sum(is_miss.to(tl.int32), 0)
                tl.debug_barrier()
                _stamp_phase(dbg_ptr, r64, 5, TIMING)
                # -- reset the scratch entries this call touched ------------------------
                for q0 in range(0, QK, QBLK):
                    i = q0 + offs_q
                    mi = i < QK
                    p = tl.load(sel_row + i, mask=mi, other=-1)
                    tl.store(
                        scr_row + p, tl.zeros_like(p) + 0x7FFFFFFF, mask=mi & (p >= 0) & (p < W)
                    )
                    if BITMAP:  # every set bit of this row came from this call's selections
                        tl.store(bm_row + (p >> 5), tl.zeros_like(p), mask=mi & (p >= 0) & (p < W))

            cbase = counters_ptr + r64 * 4
            c0 = n_dir.to(tl.int64)
            c1 = n_hsel.to(tl.int64)
            c2 = n_msel.to(tl.int64)
            c3 = ncopy.to(tl.int64)
            if ACCUM:
                c0 += tl.load(cbase + 0)
                c1 += tl.load(cbase + 1)
                c2 += tl.load(cbase + 2)
                c3 += tl.load(cbase + 3)
            tl.store(cbase + 0, c0)
            tl.store(cbase + 1, c1)
            tl.store(cbase + 2, c2)
            tl.store(cbase + 3, c3)
            tl.store(overflow_ptr + r64, ovf)
            if n_pend == 0:  # nothing to copy: release the copy programs at once
                _publish(meta_ptr, flag_addr, r64, nv, ncopy, 2 * epoch + 2, COPY_PROGRAMS)
            _stamp_phase(dbg_ptr, r64, 6, TIMING)
        else:
            if COPY_PROGRAMS:
                # EARLY: the miss list is enough to start reading host rows (stage 1)
                _wait_flag(flag_addr, 2 * epoch + 2 - EARLY)

        # ======================= copy phase (every program) ===========================
        # DEFER_COPY: the miss list, victims and meta stay in the workspace for
        # _copy_grid_kernel, a second launch on a fixed grid
        if not DEFER_COPY:
            nv_c = tl.load(meta_ptr + r64 * 2, cache_modifier=".cg")
            nc = tl.load(meta_ptr + r64 * 2 + 1, cache_modifier=".cg")
            ntiles = (nc + ROWS - 1) // ROWS
            rows = tl.arange(0, ROWS)
            cols = tl.arange(0, WPAD)
            hpt_row = hpt_ptr + r64 * hpt_stride
            if EARLY:
                # the resolver program copies nothing; each copy program reads its first tile's
                # host rows (PCIe) while the victims are still being chosen, then waits for them
                # to store
                t0 = share - 1
                cstep = S - 1
                if share > 0:
                    j = t0 * ROWS + rows
                    mj = j < nc
                    hrow = _host_rows_of(mpos_row, hpt_row, j, mj, page_size)
                    val0, m2 = _load_tile(host_ptr, hrow, mj, cols, WORDS, HSTRIDE)
                    _wait_flag(flag_addr, 2 * epoch + 2)
                    _store_tile(
                        kv_ptr,
                        vic_row,
                        hot_base,
                        stg_base,
                        j,
                        mj,
                        nv_c,
                        val0,
                        m2,
                        cols,
                        WORDS,
                        HAS_STAGING,
                    )
                    t0 += cstep
                else:
                    t0 = ntiles
            else:
                t0 = share
                cstep = S
            # num_stages=1: software pipelining of the copy loop measured slower
            for t in tl.range(t0, ntiles, cstep, num_stages=1):
                _copy_tile(
                    kv_ptr,
                    host_ptr,
                    mpos_row,
                    hpt_row,
                    vic_row,
                    hot_base,
                    stg_base,
                    t,
                    nc,
                    nv_c,
                    page_size,
                    rows,
                    cols,
                    ROWS,
                    WORDS,
                    HSTRIDE,
                    HAS_STAGING,
                )
            if share == 0:
                _stamp_phase(dbg_ptr, r64, 7, TIMING)

        if COPY_PROGRAMS and PID_ROLES:
            if share > 0:
                # the request's last copy program to finish re-arms its flag for the next launch
                # (every copy program has passed its waits by then; the resolver wrote its last)
                done = tl.atomic_add(pdone_ptr + r64 * 32, 1)
                if done == S - 2:
                    tl.atomic_xchg(flag_addr, 0)
                    tl.atomic_xchg(pdone_ptr + r64 * 32, 0)
        elif COPY_PROGRAMS:
            done = tl.atomic_add(ctrl_ptr + 1, 1)
            if done == R * S - 1:
                # last program of the launch: re-arm tickets, advance the epoch
                tl.atomic_xchg(ctrl_ptr, 0)
                tl.atomic_xchg(ctrl_ptr + 1, 0)
                tl.atomic_add(ctrl_ptr + 2, 1)

    @triton.jit
    def _copy_grid_kernel(
        kv_ptr,
        host_ptr,
        hpt_ptr,
        hpt_stride,
        hot_base_ptr,
        stg_base_ptr,
        mpos_ptr,
        vic_ptr,
        list_stride,
        meta_ptr,
        R,
        page_size,
        HAS_STAGING: tl.constexpr,
        WORDS: tl.constexpr,
        WPAD: tl.constexpr,
        ROWS: tl.constexpr,
        HSTRIDE: tl.constexpr,
        REQ_BLK: tl.constexpr,
    ):
        """The copy of a ``copy_grid`` call, launched after the resolver (DEFER_COPY) on a fixed
        grid of G programs: the batch's (request, tile of ROWS miss rows) pairs, numbered request
        by request, go round-robin to the programs (global tile u to program u % G). Each block of
        REQ_BLK requests' tile counts is read once as a vector; a program then visits only its own
        tiles, finding each tile's request by a count over the block's prefix sums."""
        pid = tl.program_id(0)
        G = tl.num_programs(0)
        offs_r = tl.arange(0, REQ_BLK)
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, WPAD)
        g = tl.zeros([], tl.int32)  # global index of the block's first tile
        for r0 in range(0, R, REQ_BLK):
            rr = r0 + offs_r
            nc_v = tl.load(meta_ptr + rr.to(tl.int64) * 2 + 1, mask=rr < R, other=0)
            nt_v = (nc_v + ROWS - 1) // ROWS
            end_v = g + tl.cumsum(nt_v, 0)  # global index past each request's last tile
            g_end = g + tl.sum(nt_v, 0)
            # this program's first tile of the block: the first u >= g with u % G == pid
            u0 = g + (pid - g % G + G) % G
            for u in range(u0, g_end, G):
                # tile u belongs to the block's first request whose tiles end past it
                k = tl.sum((end_v <= u).to(tl.int32), 0)
                t = u - tl.sum(tl.where(offs_r == k, end_v - nt_v, 0), 0)
                r64 = (r0 + k).to(tl.int64)
                nv = tl.load(meta_ptr + r64 * 2)
                nc = tl.load(meta_ptr + r64 * 2 + 1)
                hot_base = tl.load(hot_base_ptr + r64)
                if HAS_STAGING:
                    stg_base = tl.load(stg_base_ptr + r64)
                else:
                    stg_base = hot_base * 0
                _copy_tile(
                    kv_ptr,
                    host_ptr,
                    mpos_ptr + r64 * list_stride,
                    hpt_ptr + r64 * hpt_stride,
                    vic_ptr + r64 * list_stride,
                    hot_base,
                    stg_base,
                    t,
                    nc,
                    nv,
                    page_size,
                    rows,
                    cols,
                    ROWS,
                    WORDS,
                    HSTRIDE,
                    HAS_STAGING,
                )
            g = g_end


# --------------------------------------------------------------------------------------
# Workspace
# --------------------------------------------------------------------------------------


class ResolverWorkspace:
    """Device scratch reused across calls (grown, never shrunk; never memset after growth).

    scratch int32 [R, W] (sentinel-filled, self-cleaning), bitmap int32 [R, ceil(W / 32)] (zero,
    self-cleaning), mpos / victims int32 [R, QK], meta int32 [R, 2], flags int64 [R],
    pflags int64 [R * 16] / pdone int32 [R * 32] (one 128-byte line per request), ctrl int64 [3].
    One workspace must not be used by two calls that may run concurrently. ``fixed()`` stops
    growth: CUDA graphs hold the buffers' addresses, so a fixed workspace asked for more raises
    instead of moving under them."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.is_fixed = False
        self.R = self.W = self.QK = 0
        self.scratch = self.bitmap = self.mpos = self.victims = None
        self.meta = self.flags = self.pflags = self.pdone = None
        # ctrl persists for the workspace's lifetime (epoch must never go back)
        self.ctrl = torch.zeros(3, dtype=torch.int64, device=self.device)

    def ensure(self, R: int, W: int, QK: int) -> ResolverWorkspace:
        """Grow to R requests, W positions and QK selections per request."""
        dev = self.device
        if self.is_fixed and (R > self.R or W > self.W or QK > self.QK):
            raise RuntimeError(
                f"resolver workspace fixed at {self.R} requests x {self.W} positions x "
                f"{self.QK} selections (captured graphs hold its addresses), asked for "
                f"{R} x {W} x {QK}"
            )
        if R > self.R or W > self.W:
            nR, nW = max(R, self.R), max(W, self.W)
            self.scratch = torch.full((nR, nW), _SENT, dtype=torch.int32, device=dev)
            self.bitmap = torch.zeros((nR, (nW + 31) // 32), dtype=torch.int32, device=dev)
            self.W = nW
        if R > self.R or QK > self.QK:
            nR, nQ = max(R, self.R), max(QK, self.QK)
            self.mpos = torch.empty((nR, nQ), dtype=torch.int32, device=dev)
            self.victims = torch.empty((nR, nQ), dtype=torch.int32, device=dev)
            self.QK = nQ
        if R > self.R:
            self.meta = torch.zeros((R, 2), dtype=torch.int32, device=dev)
            # flags start at 0 <= epoch: a helper only proceeds once its producer publishes
            self.flags = torch.zeros((R,), dtype=torch.int64, device=dev)
            # pid_roles: a flag and a done counter per request, each on its own 128-byte line;
            # zero between launches (each launch's last copy program of a request resets them)
            self.pflags = torch.zeros((R * 16,), dtype=torch.int64, device=dev)
            self.pdone = torch.zeros((R * 32,), dtype=torch.int32, device=dev)
            self.R = R
        return self

    def fixed(self) -> ResolverWorkspace:
        """No growth from now on (see the class docstring)."""
        self.is_fixed = True
        return self

    def nbytes(self) -> int:
        ts = [
            self.scratch,
            self.bitmap,
            self.mpos,
            self.victims,
            self.meta,
            self.flags,
            self.pflags,
            self.pdone,
            self.ctrl,
        ]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


_WORKSPACES: dict = {}


def _default_workspace(device: torch.device) -> ResolverWorkspace:
    if device.type == "cuda":
        key = (device.type, device.index, torch.cuda.current_stream(device).cuda_stream)
    else:
        key = (device.type, device.index, 0)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = ResolverWorkspace(device)
    return ws


def _pow2(n: int, lo: int = 16, hi: int | None = None) -> int:
    v = max(lo, 1 << max(0, (int(n) - 1).bit_length()))
    return min(v, hi) if hi is not None else v


def _word_view(row_bytes: int, kv_pool: torch.Tensor, host_pool: torch.Tensor):
    for dt, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2), (torch.uint8, 1)):
        if (
            row_bytes % size == 0
            and kv_pool.data_ptr() % size == 0
            and host_pool.data_ptr() % size == 0
            and host_pool.stride(0) % size == 0
        ):
            return dt, row_bytes // size
    raise AssertionError("unreachable")


def default_copy_programs(R: int, Q: int = 2, num_sms: int | None = None) -> int:
    """Copy programs per request. Plain decode (Q == 1) moves few rows per request (the paper's
    77 misses): with EARLY_COPY, the first S of DECODE_COPY_PROGRAMS whose R x S programs fit the
    ``num_sms`` multiprocessors (None: _NOMINAL_SMS), programs that start reading host rows before
    the victims are chosen; else one program per request (no helpers, no spinning). Verification
    (Q > 1) can move up to Q*k rows per request: about 64 copy programs per call, 1..8 per request
    (the paper's copy grid scales with the batch, 4 to 32 thread blocks)."""
    if Q <= 1:
        if not EARLY_COPY:
            return 1
        if num_sms is None:
            # CPU: the interpreter runs the programs one after another, so the same path (early
            # copy, roles by program id) with the smallest copy grid keeps the CPU tests short
            S = min(DECODE_COPY_PROGRAMS)
            return S if R * S <= _NOMINAL_SMS else 1
        return next((S for S in DECODE_COPY_PROGRAMS if R * S <= num_sms), 1)
    return max(1, min(8, -(-64 // max(1, R))))


def scan_settings(
    R: int,
    B: int,
    W: int,
    *,
    scan_tile: int | None = None,
    keys_in_registers: bool | None = None,
    pending_bitmap: bool | None = None,
    scan_stages: int | None = None,
) -> dict:
    """The scan / victim-selection settings a call of R requests, B slots and W positions runs
    with: each argument as given, or the kernel's default for that shape (the benchmark records
    these, so a sweep row says what it measured whatever the defaults are when it ran)."""
    if scan_tile is None:
        scan_tile = SCAN_TILE if B <= SCAN_TILE and R < SCAN_WIDE_BATCH else SCAN_TILE_MULTI
    if not (scan_tile >= 16 and scan_tile & (scan_tile - 1) == 0):
        raise ValueError(f"scan_tile must be a power of two >= 16, got {scan_tile}")
    reg_keys = B <= scan_tile if keys_in_registers is None else bool(keys_in_registers)
    if reg_keys and B > scan_tile:
        raise ValueError(
            f"keys_in_registers needs B <= scan_tile (one scan tile), got B = {B}, "
            f"scan_tile = {scan_tile}"
        )
    if pending_bitmap is None:
        pending_bitmap = R >= SCAN_WIDE_BATCH and R * W * 4 > PENDING_BITMAP_BYTES
    if scan_stages is None:  # pipelining needs more than one scan tile
        scan_stages = SCAN_STAGES_MULTI if B > scan_tile else 1
    if int(scan_stages) < 1:
        raise ValueError(f"scan_stages must be >= 1, got {scan_stages}")
    return dict(
        scan_tile=int(scan_tile),
        keys_in_registers=bool(reg_keys),
        pending_bitmap=bool(pending_bitmap),
        scan_stages=int(scan_stages),
    )


def copy_settings(
    R: int,
    Q: int,
    *,
    copy_programs_per_request: int | None = None,
    early_copy: bool | None = None,
    pid_roles: bool | None = None,
    num_sms: int | None = None,
    copy_grid: int | None = None,
) -> dict:
    """How a call of R requests x Q queries copies its misses: each argument as given, or the
    kernel's default (the benchmark records these beside scan_settings). ``copy_grid`` G: no copy
    programs, the copy is a second launch of G programs (``copy_grid`` is None otherwise). Raises
    on a combination the kernel cannot run."""
    if copy_grid is not None:
        if int(copy_grid) < 1:
            raise ValueError(f"copy_grid must be >= 1 programs, got {copy_grid}")
        if copy_programs_per_request not in (None, 1):
            raise ValueError(
                "copy_grid copies in a second launch, without copy programs beside the "
                f"resolvers: copy_programs_per_request must be None or 1, got "
                f"{copy_programs_per_request}"
            )
        for knob, on in (("early_copy", early_copy), ("pid_roles", pid_roles)):
            if on:
                raise ValueError(
                    f"{knob} hands out work to copy programs beside the resolvers; copy_grid "
                    "has none"
                )
        return dict(
            copy_programs_per_request=1, early_copy=False, pid_roles=False, copy_grid=int(copy_grid)
        )
    S = (
        int(copy_programs_per_request)
        if copy_programs_per_request
        else default_copy_programs(R, Q, num_sms)
    )
    S = max(1, S)
    if early_copy is None:  # measured for plain decode only
        early_copy = EARLY_COPY and S > 1 and Q == 1
    elif early_copy and S < 2:
        raise ValueError(
            "early_copy hands the copy to the copy programs: it needs "
            f"copy_programs_per_request >= 2, got {S}"
        )
    # pid_roles: roles from the program id (no tickets) where that cannot deadlock: with fewer
    # waiting copy programs than multiprocessors, a resolver (which never waits) always finds one
    fits = num_sms is None or R * (S - 1) < num_sms
    # (asked for where it does not fit, the call takes tickets: the returned settings say which)
    pid_roles = (
        (PID_ROLES and early_copy if pid_roles is None else bool(pid_roles)) and S > 1 and fits
    )
    return dict(
        copy_programs_per_request=S,
        early_copy=bool(early_copy),
        pid_roles=bool(pid_roles) and S > 1,
        copy_grid=None,
    )


_SM_COUNT: dict = {}


def num_sms(dev) -> int | None:
    """Multiprocessors of a CUDA device (a torch.device or its name; cached): what
    ``copy_settings`` / ``default_copy_programs`` take. None on CPU, where the interpreter runs the
    programs one after another in program-id order (a resolver before its copy programs)."""
    dev = torch.device(dev)
    if dev.type != "cuda":
        return None
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def resolve_triton(
    selections,
    tail_start,
    tail_loc,
    hot_pos,
    hot_lru,
    hot_loc_base,
    host_page_table,
    kv_pool,
    host_pool,
    stamp,
    *,
    page_size,
    direct_page_table=None,
    staging_loc_base=None,
    hot_rows=None,
    out=None,
    accumulate_counters=False,
    workspace: ResolverWorkspace | None = None,
    copy_programs_per_request: int | None = None,
    num_warps: int = 8,
    radix_tile: int = RADIX_TILE,
    radix_bits: int = RADIX_DIGIT_BITS,
    scan_tile: int | None = None,
    keys_in_registers: bool | None = None,
    copy_rows: int | None = None,
    pending_bitmap: bool | None = None,
    scan_stages: int | None = None,
    early_copy: bool | None = None,
    pid_roles: bool | None = None,
    copy_grid: int | None = None,
    phase_times: torch.Tensor | None = None,
    check: bool = True,
) -> ResolveResult:
    """Launch the fused resolver kernel once (and the copy kernel after it with ``copy_grid``).
    Same arguments/semantics as ``resolve_reference``; every tuning argument gives the same
    result (the benchmark sweeps them), None takes the default for the call's shape:
    ``radix_tile`` / ``radix_bits`` -- slots per tile (a power of two) and digit width (1..12) of
    the victim selection; ``scan_tile`` -- slots per tile of the B-slot scan and the victim
    assignment (a power of two); ``keys_in_registers`` -- keep the victim keys in registers between
    the scan and the victim selection (needs B <= scan_tile), else rebuild them from the slot
    state; ``pending_bitmap`` -- test slot positions against a bit per pending position instead of
    the position scratch; ``scan_stages`` -- software-pipelining depth of the multi-tile scan;
    ``copy_rows`` -- host rows per copy tile (a power of two; default 4096 words' worth);
    ``copy_programs_per_request`` / ``early_copy`` / ``pid_roles`` -- the copy grid, whether its
    copy programs read their first tile before the victims are known (needs >= 2 programs per
    request), and whether roles come from the program id (only where R x (S - 1) is below the
    multiprocessor count; tickets otherwise); ``copy_grid`` -- copy in a second launch of this many
    programs instead (the HiSparse baseline's fixed copy grid; one resolver program per request, no
    copy programs). ``phase_times`` (int64 [R, 8] on the device, GPU only) receives each request's
    phase boundaries in ns (PHASE_NAMES, ``copy_done`` not written with ``copy_grid``;
    benchmarks/bench_resolver.py --phase-times)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    if check:
        _check_args(
            selections,
            tail_start,
            tail_loc,
            hot_pos,
            hot_lru,
            hot_loc_base,
            host_page_table,
            kv_pool,
            host_pool,
            page_size,
            direct_page_table,
            staging_loc_base,
            hot_rows,
        )
    dev = kv_pool.device
    interpret = not isinstance(_resolver_kernel, triton.runtime.jit.JITFunction)
    if dev.type == "cuda":
        capturing = torch.cuda.is_current_stream_capturing()
        if check and host_pool.device.type == "cpu" and not capturing and not host_pool.is_pinned():
            raise ValueError(
                "host_pool must be pinned (torch.empty(..., pin_memory=True)) so the "
                "kernel can read it through UVA; pageable memory cannot be read by a GPU kernel"
            )
    elif not interpret:
        raise RuntimeError(
            "the Triton resolver on CPU tensors needs TRITON_INTERPRET=1 set before "
            "triton is imported (or use impl='reference')"
        )

    R, Q, K = selections.shape
    QK = Q * K
    B = hot_pos.shape[1]
    ps = int(page_size)
    W = host_page_table.shape[1] * ps
    row_bytes = kv_pool.shape[1]
    assert QK < _HIT and B < _HIT, "Q*k and B must be < 2**28"
    st = scan_settings(
        R,
        B,
        W,
        scan_tile=scan_tile,
        keys_in_registers=keys_in_registers,
        pending_bitmap=pending_bitmap,
        scan_stages=scan_stages,
    )
    scan_tile, reg_keys, pending_bitmap = (
        st["scan_tile"],
        st["keys_in_registers"],
        st["pending_bitmap"],
    )
    scan_stages = st["scan_stages"]
    if not (1 <= radix_bits <= 12 and radix_tile >= 16 and radix_tile & (radix_tile - 1) == 0):
        raise ValueError(
            f"radix_bits must be 1..12 and radix_tile a power of two >= 16, "
            f"got {radix_bits}, {radix_tile}"
        )
    if phase_times is not None:
        if interpret:
            raise ValueError(
                "phase_times reads the GPU's global timer: not available under TRITON_INTERPRET"
            )
        if (
            phase_times.dtype != torch.int64
            or tuple(phase_times.shape) != (R, len(PHASE_NAMES))
            or not phase_times.is_contiguous()
            or phase_times.device != dev
        ):
            raise ValueError(
                f"phase_times must be a contiguous int64 [{R}, {len(PHASE_NAMES)}] tensor on {dev}"
            )

    if out is None:
        locations = torch.empty((R, Q, K), dtype=torch.int32, device=dev)
        counters = (torch.zeros if accumulate_counters else torch.empty)(
            (R, 4), dtype=torch.int64, device=dev
        )
        overflow = torch.empty((R,), dtype=torch.int32, device=dev)
    else:
        locations, counters, overflow = out
        assert locations.is_contiguous() and counters.is_contiguous() and overflow.is_contiguous()
    if R == 0:
        return ResolveResult(locations, counters, overflow)

    ws = workspace if workspace is not None else _default_workspace(dev)
    ws.ensure(R, W, QK)

    sel = selections if selections.is_contiguous() else selections.contiguous()

    for t, n in (
        (tail_loc, "tail_loc"),
        (host_page_table, "host_page_table"),
        (hot_pos, "hot_pos"),
        (hot_lru, "hot_lru"),
    ):
        if t.stride(1) != 1:
            raise ValueError(f"{n} must have unit stride in its last dimension")
    if direct_page_table is not None and direct_page_table.stride(1) != 1:
        raise ValueError("direct_page_table must have unit stride in its last dimension")
    if not kv_pool.is_contiguous():
        raise ValueError("kv_pool must be contiguous")
    if host_pool.stride(1) != 1 or host_pool.stride(0) < row_bytes:
        raise ValueError(
            "host_pool must be [rows, row_bytes] with unit stride in its last dimension "
            "(a row stride of row_bytes or more: a padded host store is a column slice)"
        )

    wdt, words = _word_view(row_bytes, kv_pool, host_pool)
    kv_w = kv_pool.view(wdt)
    host_w = host_pool.view(wdt)
    wpad = _pow2(words, lo=1)
    rows = max(1, min(64, 4096 // wpad)) if copy_rows is None else int(copy_rows)
    if rows < 1 or rows & (rows - 1) or rows > 256:
        raise ValueError(f"copy_rows must be a power of two in 1..256, got {copy_rows}")

    if torch.is_tensor(stamp):
        stamp_arg, stamp_is_ptr = stamp, True
    else:
        stamp_arg, stamp_is_ptr = int(stamp), False
        assert 0 <= stamp_arg < _MAX_STAMP, "stamp out of range"

    cs = copy_settings(
        R,
        Q,
        copy_programs_per_request=copy_programs_per_request,
        early_copy=early_copy,
        pid_roles=pid_roles,
        num_sms=num_sms(dev),
        copy_grid=copy_grid,
    )
    S, early_copy = cs["copy_programs_per_request"], cs["early_copy"]
    dpt = direct_page_table if direct_page_table is not None else host_page_table
    stg = staging_loc_base if staging_loc_base is not None else hot_loc_base

    grid = (R * S,)
    _resolver_kernel[grid](
        sel,
        locations,
        tail_start,
        tail_loc,
        tail_loc.stride(0),
        tail_loc.shape[1],
        dpt,
        dpt.stride(0),
        host_page_table,
        host_page_table.stride(0),
        hot_pos,
        hot_pos.stride(0),
        hot_lru,
        hot_lru.stride(0),
        hot_rows if hot_rows is not None else hot_loc_base,
        hot_loc_base,
        stg,
        kv_w,
        host_w,
        counters,
        overflow,
        stamp_arg,
        ws.scratch,
        ws.scratch.stride(0),
        W,
        ws.bitmap,
        ws.bitmap.stride(0),
        ws.mpos,
        ws.victims,
        ws.mpos.stride(0),
        ws.meta,
        ws.flags,
        ws.ctrl,
        ws.pflags,
        ws.pdone,
        R,
        QK,
        B,
        ps,
        S,
        HAS_DIRECT=direct_page_table is not None,
        HAS_STAGING=staging_loc_base is not None,
        HAS_HOT_ROWS=hot_rows is not None,
        STAMP_IS_PTR=stamp_is_ptr,
        ACCUM=bool(accumulate_counters),
        COPY_PROGRAMS=S > 1,
        WORDS=words,
        WPAD=wpad,
        ROWS=rows,
        HSTRIDE=host_w.stride(0),
        QBLK=_pow2(QK, 16, 1024),
        BBLK=_pow2(B, 16, scan_tile),
        RBLK=_pow2(B, 16, radix_tile),
        DIGIT=radix_bits,
        NBINS=1 << radix_bits,
        REG_KEYS=reg_keys,
        BITMAP=bool(pending_bitmap),
        SCAN_STAGES=scan_stages,
        EARLY=bool(early_copy),
        PID_ROLES=cs["pid_roles"],
        DEFER_COPY=cs["copy_grid"] is not None,
        dbg_ptr=phase_times if phase_times is not None else counters,
        TIMING=phase_times is not None,
        num_warps=num_warps,
    )
    if cs["copy_grid"] is not None:  # same stream: runs once every request's victims are known
        _copy_grid_kernel[(cs["copy_grid"],)](
            kv_w,
            host_w,
            host_page_table,
            host_page_table.stride(0),
            hot_loc_base,
            stg,
            ws.mpos,
            ws.victims,
            ws.mpos.stride(0),
            ws.meta,
            R,
            ps,
            HAS_STAGING=staging_loc_base is not None,
            WORDS=words,
            WPAD=wpad,
            ROWS=rows,
            HSTRIDE=host_w.stride(0),
            REQ_BLK=_pow2(R, 16, COPY_GRID_REQ_BLOCK),
            num_warps=num_warps,
        )
    return ResolveResult(locations, counters, overflow)


def aot_compile(arch: int = 90, num_warps: int = 8, word_type: str = "i64", **constexprs):
    """Compile the kernel for an NVIDIA target without a GPU (Triton bundles ptxas), with
    real-launch alignment hints. Catches compile-mode errors the interpreter does not see.
    Needs a process where TRITON_INTERPRET is unset. Returns the compiled kernel (``.asm``
    holds ttir/ttgir/llir/ptx/cubin)."""
    c = dict(
        HAS_DIRECT=True,
        HAS_STAGING=True,
        HAS_HOT_ROWS=True,
        STAMP_IS_PTR=False,
        ACCUM=False,
        COPY_PROGRAMS=True,
        WORDS=82,
        WPAD=128,
        ROWS=32,
        QBLK=1024,
        BBLK=1024,
        RBLK=RADIX_TILE,
        DIGIT=RADIX_DIGIT_BITS,
        NBINS=1 << RADIX_DIGIT_BITS,
        REG_KEYS=False,
        BITMAP=False,
        SCAN_STAGES=1,
        TIMING=False,
        EARLY=False,
        PID_ROLES=False,
        DEFER_COPY=False,
    )
    c.update(constexprs)
    ptr64 = {
        "hot_lru_ptr",
        "hot_rows_ptr",
        "counters_ptr",
        "flags_ptr",
        "ctrl_ptr",
        "pflags_ptr",
        "dbg_ptr",
    }
    stamp = {"stamp_arg": "*i64" if c["STAMP_IS_PTR"] else "i64"}
    return _aot(_resolver_kernel, c, word_type, arch, num_warps, ptr64, stamp)


def aot_compile_copy(arch: int = 90, num_warps: int = 8, word_type: str = "i64", **constexprs):
    """``aot_compile`` for ``_copy_grid_kernel`` (the ``copy_grid`` launch)."""
    c = dict(HAS_STAGING=True, WORDS=82, WPAD=128, ROWS=32, REQ_BLK=COPY_GRID_REQ_BLOCK)
    c.update(constexprs)
    return _aot(_copy_grid_kernel, c, word_type, arch, num_warps)


def _aot(fn, c: dict, word_type: str, arch: int, num_warps: int, ptr64=(), scalars=None):
    """Compile ``fn`` with constexprs ``c``: the pool pointers as ``word_type`` words, the
    pointers in ``ptr64`` to int64, the others to int32, ``scalars`` as given."""
    from systems.kernels.aot import compile_for_nvidia

    c.setdefault("HSTRIDE", c["WORDS"])  # unpadded host rows unless asked
    types = dict(scalars or {})
    for name in fn.arg_names:
        if name in ("kv_ptr", "host_ptr"):
            types[name] = "*" + word_type
        elif name.endswith("_ptr"):
            types[name] = "*i64" if name in ptr64 else "*i32"
    return compile_for_nvidia(fn, c, types, arch, num_warps)


def resolve(
    selections,
    tail_start,
    tail_loc,
    hot_pos,
    hot_lru,
    hot_loc_base,
    host_page_table,
    kv_pool,
    host_pool,
    stamp,
    *,
    page_size,
    direct_page_table=None,
    staging_loc_base=None,
    impl: str = "triton",
    out=None,
    accumulate_counters: bool = False,
    workspace: ResolverWorkspace | None = None,
    copy_programs_per_request: int | None = None,
    hot_rows=None,
    copy_grid: int | None = None,
) -> ResolveResult:
    """Resolve selected positions to device locations (see the module docstring).

    Args (R requests, Q queries, k selections per query, B hot slots, T tail rows,
    P pages in the page tables):
        selections int32 [R, Q, k]; tail_start int32 [R]; tail_loc int32 [R, T];
        hot_pos int32 [R, B] (in/out); hot_lru int64 [R, B] (in/out); hot_loc_base int32 [R];
        host_page_table int32 [R, P]; kv_pool uint8 [N, row_bytes] (in/out);
        host_pool uint8 [H, row_bytes] (pinned on GPU runs); stamp int or int64 tensor [1];
        page_size int; direct_page_table int32 [R, P] or None;
        staging_loc_base int32 [R] or None; hot_rows int64 [R] or None: when given, hot_pos /
        hot_lru are tables of any number of rows and request r owns row hot_rows[r] (updated
        in place, no gathered copy); out optional preallocated
        (locations, counters, overflow); accumulate_counters adds into ``out[1]``;
        copy_grid: copy the misses in a second launch of this many programs (Triton only, see
        ``resolve_triton``; the reference's result is the same either way).
    Returns ResolveResult(locations int32 [R, Q, k], counters int64 [R, 4], overflow int32 [R]).
    """
    kw = dict(
        page_size=page_size,
        direct_page_table=direct_page_table,
        staging_loc_base=staging_loc_base,
        out=out,
        accumulate_counters=accumulate_counters,
    )
    if impl not in ("triton", "reference"):
        raise ValueError(f"unknown resolver impl {impl!r}")
    state = [hot_pos, hot_lru]
    if impl == "reference" and hot_rows is not None:  # the same semantics on gathered rows
        _check_hot_rows(hot_rows, selections.shape[0])
        state = [hot_pos[hot_rows], hot_lru[hot_rows]]
    args = (selections, tail_start, tail_loc, *state, hot_loc_base, host_page_table, kv_pool)
    args += (host_pool, stamp)
    if impl == "triton":
        return resolve_triton(
            *args,
            workspace=workspace,
            copy_programs_per_request=copy_programs_per_request,
            hot_rows=hot_rows,
            copy_grid=copy_grid,
            **kw,
        )
    res = resolve_reference(*args, **kw)
    if hot_rows is not None:
        hot_pos[hot_rows], hot_lru[hot_rows] = state
    return res
