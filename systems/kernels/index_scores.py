"""Indexer scores over a request's paged index keys, read in place (one launch per selecting layer).

The reference (``index_scores_reference``) gathers every visible index key of every request into a
new (B, L, di) tensor, widens it to float32 and multiplies: two full copies of the history's keys
per selecting layer and step. This kernel walks the page table and reads each key once.

Contract (identical to the reference)
    iq          float32 [B, Q, di]   index queries (already normalized / blended by the model)
    pool        [M, di]              one index source's paged keys (bf16, or float32)
    page_table  int32 [S, P]         page id per logical page of each request slot (-1: none)
    slots       int [B]              the slot of each request
    L           int                  positions scored: 0 .. L-1 (L <= P * page_size)
    scores      float32 [B, Q, L]    iq . key(position), float32 products and sums; positions on
                                     a page without an id read row 0 (the reference's
                                     ``clamp_min(0)``); the caller masks positions past each
                                     query's own (they are never selected)

Bytes moved: B x L x di x itemsize (keys, once per request and call, whatever Q is) + B x Q x L x 4
(scores) + B x ceil(L / page_size) x 4 (page ids). Float32 products, no TF32: scores agree with
the reference to float32 rounding (summation order differs), not bit for bit.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False


def index_scores_reference(iq, pool, page_table, slots, L: int, page_size: int) -> torch.Tensor:
    """Plain PyTorch: gather the keys of positions 0..L-1, then a float32 einsum."""
    pos = torch.arange(L, device=pool.device)
    pages = page_table[slots.long()][:, pos // page_size].long()  # [B, L]
    loc = (pages * page_size + pos % page_size).clamp_min(0)
    keys = pool[loc]  # [B, L, di]
    return torch.einsum("bqd,bld->bql", iq.float(), keys.float())


if _HAVE_TRITON:

    @triton.jit
    def _index_scores_kernel(
        iq_ptr,
        pool_ptr,
        pt_ptr,
        slots_ptr,
        out_ptr,
        Q,
        L,
        pt_stride,
        page_size,
        DI: tl.constexpr,
        DI_P: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_L: tl.constexpr,
        FMA: tl.constexpr,
    ):
        # one program per (request, block of queries, block of positions): the block's keys
        # are read once for all its queries
        b = tl.program_id(0).to(tl.int64)
        q0 = tl.program_id(1) * BLOCK_Q
        l0 = tl.program_id(2) * BLOCK_L
        qq = q0 + tl.arange(0, BLOCK_Q)
        ll = l0 + tl.arange(0, BLOCK_L)
        dd = tl.arange(0, DI_P)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        lm = ll < L
        page = tl.load(pt_ptr + slot * pt_stride + ll // page_size, mask=lm, other=0)
        row = tl.maximum(page.to(tl.int64) * page_size + ll % page_size, 0)
        keys = tl.load(
            pool_ptr + row[:, None] * DI + dd[None, :],
            mask=lm[:, None] & (dd[None, :] < DI),
            other=0.0,
        ).to(tl.float32)
        if FMA:
            # few queries (decode: 1, verification: up to 8): one float32 multiply-add row per
            # query on the keys in registers; a dot would pad the queries to 16 rows and route
            # both operands through shared memory
            for i in tl.static_range(BLOCK_Q):
                q = q0 + i
                iqv = tl.load(iq_ptr + (b * Q + q) * DI + dd, mask=(dd < DI) & (q < Q), other=0.0)
                s1 = tl.sum(keys * iqv.to(tl.float32)[None, :], axis=1)  # [BLOCK_L]
                tl.store(out_ptr + (b * Q + q) * L + ll, s1, mask=lm & (q < Q))
        else:
            qm = qq < Q
            iq = tl.load(
                iq_ptr + (b * Q + qq[:, None]) * DI + dd[None, :],
                mask=qm[:, None] & (dd[None, :] < DI),
                other=0.0,
            ).to(tl.float32)
            s = tl.dot(iq, tl.trans(keys), input_precision="ieee")  # [BLOCK_Q, BLOCK_L]
            tl.store(
                out_ptr + (b * Q + qq[:, None]) * L + ll[None, :], s, mask=qm[:, None] & lm[None, :]
            )


def _p2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << max(0, (int(n) - 1).bit_length()))


# Queries per program of the multiply-add form; more queries per call take more programs.
FMA_MAX_QUERIES = 8
# The default form. H200, 128 requests x 16,384 positions, block_l 128, 4 warps
# (bench_attention, docs/design.md): one query 75 us (3.6 TB/s of keys,
# the HBM copy rate is 4.22) with "fma" against 616 us with "dot"; four queries 105 against
# 622 us. A float32 tl.dot without TF32 runs on the CUDA cores with both operands staged
# through shared memory, padded to 16 query rows.
INDEX_FORM = "fma"


def index_scores_triton(
    iq,
    pool,
    page_table,
    slots,
    L: int,
    page_size: int,
    block_l: int = 128,
    num_warps: int = 4,
    form: str | None = None,
) -> torch.Tensor:
    """``form`` (default INDEX_FORM): "dot" (the queries of a program as one float32 tl.dot,
    padded to 16 rows) or "fma" (a float32 multiply-add row per query, up to FMA_MAX_QUERIES
    per program); both read
    each key once per program and compute float32 products and sums."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    form = INDEX_FORM if form is None else form
    if form not in ("dot", "fma"):
        raise ValueError(f"index scores form must be dot or fma, got {form!r}")
    B, Q, di = iq.shape
    assert pool.shape[1] == di and pool.is_contiguous() and page_table.stride(1) == 1
    out = torch.empty((B, Q, L), dtype=torch.float32, device=iq.device)
    if B == 0 or Q == 0 or L == 0:
        return out
    if form == "fma":
        bq = min(FMA_MAX_QUERIES, 1 << max(0, (Q - 1).bit_length()))
    else:
        bq = 16 if Q <= 16 else 32  # tl.dot needs >= 16 rows; verification blocks are <= 16
    grid = (B, triton.cdiv(Q, bq), triton.cdiv(L, block_l))
    _index_scores_kernel[grid](
        iq.float().contiguous(),
        pool,
        page_table,
        slots.contiguous(),
        out,
        Q,
        L,
        page_table.stride(0),
        page_size,
        DI=di,
        DI_P=_p2(di),
        BLOCK_Q=bq,
        BLOCK_L=block_l,
        FMA=form == "fma",
        num_warps=num_warps,
    )
    return out


def index_scores(
    iq, pool, page_table, slots, L: int, page_size: int, impl: str = "triton"
) -> torch.Tensor:
    """[B, Q, L] float32 scores of positions 0..L-1 (see the module docstring)."""
    if impl == "triton":
        return index_scores_triton(iq, pool, page_table, slots, L, page_size)
    if impl == "reference":
        return index_scores_reference(iq, pool, page_table, slots, L, page_size)
    raise ValueError(f"unknown index scores impl {impl!r}")


def aot_compile(arch: int = 90, num_warps: int = 4, pool_type: str = "bf16", **constexprs):
    """Compile for an NVIDIA target without a GPU (see resolver.aot_compile)."""
    from systems.kernels.aot import compile_for_nvidia

    c = dict(DI=64, DI_P=64, BLOCK_Q=16, BLOCK_L=128, FMA=False)
    c.update(constexprs)
    ptrs = {
        "iq_ptr": "*fp32",
        "pool_ptr": "*" + pool_type,
        "pt_ptr": "*i32",
        "slots_ptr": "*i64",
        "out_ptr": "*fp32",
    }
    return compile_for_nvidia(_index_scores_kernel, c, ptrs, arch, num_warps)
