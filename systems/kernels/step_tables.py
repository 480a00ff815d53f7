"""A HiSparse step's tables in one launch: where each request's new rows go and where its tail,
hot cache, host pages and ready optional pages are, per KV source.

Why: the plain-PyTorch preparation (``step_tables_reference``) dispatches 34 small kernels per step (41
with the adaptive backend's direct table), each a launch of a few microseconds inside a step of
~2 ms that is bound by its launches (docs/engine.md). One program per request computes them all.

Contract (B requests, Q queries each, S sources; every table indexed by slot)
    slots            int64 [B]        the requests' slots
    positions        int64 [B, Q]     query positions; the engine passes no negative one (a
                                      negative one gets index row -1 and a tail row wrapped
                                      modulo T, as the reference computes them)
    index_pages      int32 [*, PI]    index page id per logical page (page size ``index_page``)
    tail_start       int32 [*]        first position each slot's tail ring holds
    slot_page        int32 [*]        each slot's hot/tail page (rows page*G .. page*G + G - 1)
    host_pages       int32 [*, PH]    host page table (copied per request)
    direct_pages     int32 [S, *, PD] or None  ready optional pages, per source as a G-row unit
                                      of the flat pool (rows unit*G ..; -1: not ready)
    G, hot, T        page rows, hot-cache rows (the tail follows them), tail rows
    NG               rows of one source's region of the flat pool (source s starts at s * NG)
Returns a dict (the step's tables, as ``HiSparseBackend._prepare_tables`` keeps them):
    index_write_loc  int64 [B, Q]     index pool row of each query's key
    write_loc        int64 [B, Q]     payload row of each query's new KV row (within a source)
    tail_start       int32 [B]
    tail_loc         int32 [S, B, T]  flat-pool row of tail entry j: s*NG + page*G + hot +
                                      (tail_start + j) % T
    host_pt          int32 [B, PH]
    hot_base         int32 [S, B]     s*NG + page*G
    direct           int32 [S, B, PD] the requests' rows of ``direct_pages``; None without it
Bytes: the tables read once per request and written once (S x (T + PD) + PH + 2Q words).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False


def step_tables_reference(
    slots, positions, index_pages, index_page, tail_start, slot_page, host_pages, direct_pages,
    *, S, NG, G, hot, T,
) -> dict:  # fmt: skip
    dev = slots.device
    sl = slots.long()
    pos = positions.long()
    flat = pos.reshape(pos.shape[0], -1)
    ipg = torch.gather(index_pages[sl], 1, flat.clamp_min(0) // index_page)
    iloc = ipg.long() * index_page + flat.clamp_min(0) % index_page
    out = {"index_write_loc": torch.where(flat < 0, -1, iloc).reshape(pos.shape)}
    ts = tail_start[sl]
    page = slot_page[sl].long()
    ar = torch.arange(T, device=dev)
    off = (torch.arange(S, device=dev) * NG).unsqueeze(1)  # (S, 1): each source's first row
    tail = (page.unsqueeze(1) * G + hot + (ts.long().unsqueeze(1) + ar) % T).to(torch.int32)
    out["tail_start"] = ts
    out["write_loc"] = page.unsqueeze(1) * G + hot + pos % T
    out["host_pt"] = host_pages[sl]
    out["hot_base"] = (page.unsqueeze(0) * G + off).to(torch.int32)
    out["tail_loc"] = tail.unsqueeze(0) + off.unsqueeze(2).to(torch.int32)
    direct = None
    if direct_pages is not None:
        direct = direct_pages[:, sl].to(torch.int32)
    out["direct"] = direct
    return out


if _HAVE_TRITON:

    @triton.jit
    def _step_tables_kernel(
        slots_ptr, pos_ptr, ipg_ptr, ipg_stride, index_page, ts_ptr, page_ptr,
        hpt_ptr, hpt_stride, dpt_ptr, dpt_stride, dpt_sstride,
        iwl_ptr, wl_ptr, ts_out, tail_out, hpt_out, hot_out, dir_out,
        B, Q, S, NG, G, HOT, T, PH, PD,
        HAS_DIRECT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_T: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        slot = tl.load(slots_ptr + b)
        ts = tl.load(ts_ptr + slot)
        page = tl.load(page_ptr + slot).to(tl.int64)
        tl.store(ts_out + b, ts)
        # the queries' rows: index pool (paged) and payload (the tail ring)
        qq = tl.arange(0, BLOCK_Q)
        qm = qq < Q
        p = tl.load(pos_ptr + b * Q + qq, mask=qm, other=0)
        pc = tl.maximum(p, 0)
        ipg = tl.load(ipg_ptr + slot * ipg_stride + pc // index_page, mask=qm, other=0)
        iloc = ipg.to(tl.int64) * index_page + pc % index_page
        tl.store(iwl_ptr + b * Q + qq, tl.where(p < 0, -1, iloc), mask=qm)
        # % rounds toward zero here and down in torch: the same for a negative position
        tl.store(wl_ptr + b * Q + qq, page * G + HOT + (p % T + T) % T, mask=qm)
        # per source: hot base and the tail ring's rows
        jj = tl.arange(0, BLOCK_T)
        jm = jj < T
        ring = page * G + HOT + (ts.to(tl.int64) + jj) % T
        zero = page * 0  # int64: s * NG in 64 bits whether s is a loop tensor or an int
        for s in range(S):
            off = (zero + s) * NG
            tl.store(hot_out + s * B + b, (page * G + off).to(tl.int32))
            tl.store(tail_out + (s * B + b) * T + jj, (ring + off).to(tl.int32), mask=jm)
        # host pages, and each source's ready optional pages
        for p0 in range(0, PH, BLOCK_P):
            pp = p0 + tl.arange(0, BLOCK_P)
            pm = pp < PH
            tl.store(
                hpt_out + b * PH + pp, tl.load(hpt_ptr + slot * hpt_stride + pp, mask=pm), mask=pm
            )
        if HAS_DIRECT:
            for p0 in range(0, PD, BLOCK_P):
                pp = p0 + tl.arange(0, BLOCK_P)
                pm = pp < PD
                for s in range(S):
                    d = tl.load(
                        dpt_ptr + (zero + s) * dpt_sstride + slot * dpt_stride + pp,
                        mask=pm,
                        other=-1,
                    )
                    tl.store(dir_out + (s * B + b) * PD + pp, d, mask=pm)


def step_tables_triton(
    slots, positions, index_pages, index_page, tail_start, slot_page, host_pages, direct_pages,
    *, S, NG, G, hot, T,
) -> dict:  # fmt: skip
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    B, Q = positions.shape
    dev = positions.device
    for name, t in (
        ("index_pages", index_pages),
        ("host_pages", host_pages),
        ("direct_pages", direct_pages),
    ):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if direct_pages is not None and (direct_pages.dim() != 3 or direct_pages.shape[0] != S):
        raise ValueError(
            f"direct_pages must be [S={S}, slots, pages], got {tuple(direct_pages.shape)}"
        )
    if tail_start.stride(0) != 1 or slot_page.stride(0) != 1:
        raise ValueError("tail_start and slot_page must be contiguous")
    PH = host_pages.shape[1]
    PD = direct_pages.shape[2] if direct_pages is not None else 0
    out = {
        "index_write_loc": torch.empty((B, Q), dtype=torch.int64, device=dev),
        "write_loc": torch.empty((B, Q), dtype=torch.int64, device=dev),
        "tail_start": torch.empty((B,), dtype=tail_start.dtype, device=dev),
        "tail_loc": torch.empty((S, B, T), dtype=torch.int32, device=dev),
        "host_pt": torch.empty((B, PH), dtype=host_pages.dtype, device=dev),
        "hot_base": torch.empty((S, B), dtype=torch.int32, device=dev),
        "direct": (
            torch.empty((S, B, PD), dtype=torch.int32, device=dev)
            if direct_pages is not None
            else None
        ),
    }
    if B == 0:
        return out
    # not read without it
    dpt = direct_pages if direct_pages is not None else host_pages.unsqueeze(0)
    _step_tables_kernel[(B,)](
        slots.contiguous(),
        positions.contiguous(),
        index_pages,
        index_pages.stride(0),
        index_page,
        tail_start,
        slot_page,
        host_pages,
        host_pages.stride(0),
        dpt,
        dpt.stride(1),
        dpt.stride(0),
        out["index_write_loc"],
        out["write_loc"],
        out["tail_start"],
        out["tail_loc"],
        out["host_pt"],
        out["hot_base"],
        out["direct"] if direct_pages is not None else out["hot_base"],
        B,
        Q,
        S,
        NG,
        G,
        hot,
        T,
        PH,
        PD,
        HAS_DIRECT=direct_pages is not None,
        BLOCK_Q=triton.next_power_of_2(max(Q, 1)),
        BLOCK_T=triton.next_power_of_2(max(T, 1)),
        BLOCK_P=min(1024, triton.next_power_of_2(max(PH, PD, 1))),
    )
    return out


def step_tables(*args, impl: str = "triton", **kw) -> dict:
    """The step's tables (see the module docstring)."""
    if impl == "triton":
        return step_tables_triton(*args, **kw)
    if impl == "reference":
        return step_tables_reference(*args, **kw)
    raise ValueError(f"unknown step tables impl {impl!r}")
