"""Sparse attention over selected KV rows, read in place from the KV pool (one launch per layer).

The model's reference path (``SparseModel.attend`` after ``decode_rows``) gathers the k selected
rows of every query into a new tensor, decodes them (FP8 -> float, bf16 rounding), widens rows and
queries to float32, and runs two einsums with a softmax between: about fifteen kernels per layer
and several float32 copies of the (queries x k x kv_dim) rows. This kernel reads each selected row
once from the pool by its location (one program per query and head), decodes it in registers
with exactly the reference's rounding, and runs an online softmax over the k rows.

Contract (identical to the reference ``sparse_attention_reference`` below)
    q           [N, H, d]    queries (N = requests x queries), float32 or bf16
    kv          uint8 [M, row_bytes]  the pool the locations index (rows are opaque bytes in the
                             ``kv_format`` of systems/models/kv_format.py)
    selections  int [N, k]   positions, -1 = padding (masked)
    locations   int [N, k]   row of each selection in ``kv`` (read only where selection >= 0;
                             a negative location there reads row 0, as the reference's
                             ``clamp_min(0)`` gather does)
    out         [N, H, d]    softmax(q . rows / sqrt(d)) @ rows per head, in q's dtype
    Rows are decoded to float32 and rounded to ``row_dtype`` (the model dtype) before use, as
    ``decode_rows(..., dtype)`` does; products and sums are float32. A query whose selections are
    all padding gets zeros (the reference gives NaN; the model never asks for it: a query always
    selects its own position).

Bytes moved per call: N*k*row_bytes (rows, the term that matters) + N*k*(4+8) (selections and
locations) + 2*N*H*d*itemsize (q in, out). No intermediate tensor.

Numerics: float32 throughout (no TF32, no tensor cores); the summation order differs
from the reference's einsums, so results agree to float32 rounding, not bit for bit (tests use
tolerances; backends still agree with each other bit for bit, since they hand the kernel
identical bytes).
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - triton is a dependency; keep the reference usable
    _HAVE_TRITON = False

FP8_BLOCK = 128  # values per float32 scale (systems/models/kv_format.py)


def sparse_attention_reference(
    q,
    kv,
    selections,
    locations,
    *,
    kv_format: str,
    kv_dim: int,
    rope_dim: int,
    row_dtype: torch.dtype,
) -> torch.Tensor:
    """Plain PyTorch, the model's reference path: gather, decode, attend."""
    from systems.models.kv_format import decode_rows

    class _Fmt:  # the three fields decode_rows reads
        pass

    fmt = _Fmt()
    fmt.kv_format, fmt.kv_dim, fmt.kv_rope_dim, fmt.row_bytes = (
        kv_format,
        kv_dim,
        rope_dim,
        kv.shape[1],
    )
    rows = decode_rows(kv[locations.long().clamp_min(0)], fmt, row_dtype)  # [N, k, d]
    s = torch.einsum("nhd,nkd->nhk", q.float(), rows.float()) / math.sqrt(kv_dim)
    s = s.masked_fill((selections < 0).unsqueeze(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("nhk,nkd->nhd", p, rows.float()).to(q.dtype)


if _HAVE_TRITON:

    @triton.jit
    def _softmax_tile(s, m, l_sum):
        """One tile of an online softmax over rows of scores: s [M, N] float32 (-inf where a
        key is masked), m / l_sum [M] the running maximum and sum. Returns the new maximum, the
        rescale of what was accumulated before (1 while a row has seen nothing: no -inf - -inf)
        and the tile's probabilities p [M, N] (0 where masked), and the new sum."""
        m_new = tl.maximum(m, tl.max(s, 1))
        live = m_new > float("-inf")
        base = tl.where(live, m_new, 0.0)
        alpha = tl.where(live, tl.exp(m - base), 1.0)
        p = tl.exp(s - base[:, None])
        return m_new, alpha, p, l_sum * alpha + tl.sum(p, 1)

    @triton.jit
    def _dot_p(p, x, BF16: tl.constexpr):
        """p [M, N] float32 @ x [N, D]: with bf16 x, p split into two bf16 terms (hi + lo,
        ~2^-16 relative: float32-level agreement) on tensor cores; else IEEE float32 dots."""
        if BF16:
            p_hi = p.to(tl.bfloat16)
            p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
            out = tl.dot(p_hi, x) + tl.dot(p_lo, x)
        else:
            out = tl.dot(p, x, input_precision="ieee")
        return out

    @triton.jit
    def _round_to_bf16(x):
        """float32 -> nearest bf16 (ties to even), kept in float32: torch's rounding for finite
        values, written with integer ops so it is exact everywhere (the interpreter too)."""
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _load_tile(
        sel_ptr,
        loc_ptr,
        kv_u8,
        kv_f32,
        kv_bf16,
        base,
        k0,
        k_hi,
        row_bytes,
        jn,
        NOPE: tl.constexpr,
        FP8: tl.constexpr,
        ROUND_BF16: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """Selections k0 .. k0 + BLOCK_K (below k_hi) of one query: (valid, pool row, the rows'
        nope parts decoded to float32 [BLOCK_K, NOPE_P]: fp8 x its block scale, or bf16; with
        ROUND_BF16 rounded to bf16 values as decode_rows(..., bfloat16) gives the reference)."""
        kk = k0 + tl.arange(0, BLOCK_K)
        inb = kk < k_hi
        sel = tl.load(sel_ptr + base + kk, mask=inb, other=-1)
        valid = sel >= 0
        row = tl.maximum(tl.load(loc_ptr + base + kk, mask=inb, other=0), 0).to(tl.int64)
        nmask = valid[:, None] & (jn[None, :] < NOPE)
        if FP8:
            raw = tl.load(kv_u8 + row[:, None] * row_bytes + jn[None, :], mask=nmask, other=0)
            xn = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            # each row's NOPE / 128 scales, loaded once per row and spread over their blocks
            # by selects (a gather of the scale per value issued 128 times the loads)
            sc = tl.zeros(xn.shape, dtype=tl.float32)
            for blk in tl.static_range(NOPE // 128):
                s_b = tl.load(
                    kv_f32 + row * (row_bytes // 4) + NOPE // 4 + blk, mask=valid, other=0.0
                )
                sc = tl.where(jn[None, :] // 128 == blk, s_b[:, None], sc)
            xn = xn * sc
        else:
            xn = tl.load(
                kv_bf16 + row[:, None] * (row_bytes // 2) + jn[None, :], mask=nmask, other=0.0
            ).to(tl.float32)
        if ROUND_BF16:
            xn = _round_to_bf16(xn)
        return valid, row, xn

    @triton.jit
    def _load_rope(kv_bf16, row, valid, jr, row_bytes, NOPE: tl.constexpr, ROPE: tl.constexpr):
        """The rows' bf16 rope tails [BLOCK_K, ROPE_P], stored after the nope bytes and their
        float32 scales (fp8 rows), as bf16 values."""
        r0 = (NOPE + 4 * (NOPE // 128)) // 2  # in bf16 units
        return tl.load(
            kv_bf16 + row[:, None] * (row_bytes // 2) + r0 + jr[None, :],
            mask=valid[:, None] & (jr[None, :] < ROPE),
            other=0.0,
        )

    @triton.jit
    def _sparse_attention_kernel(
        q_ptr,
        sel_ptr,
        loc_ptr,
        kv_u8,
        kv_f32,
        kv_bf16,
        out_ptr,
        m_ptr,
        l_ptr,
        acc_ptr,
        K,
        CHUNK,
        row_bytes,
        sm_scale,
        q_stride,
        H: tl.constexpr,
        D: tl.constexpr,
        NOPE: tl.constexpr,
        ROPE: tl.constexpr,
        FP8: tl.constexpr,
        ROUND_BF16: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NOPE_P: tl.constexpr,
        ROPE_P: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        # one program per (query, head, chunk of CHUNK selections): heads are few (4 here), so a
        # dot product over padded heads would waste most of its multiplies (an all-heads variant
        # with float32 dots measured 10x slower, docs/design.md); the head
        # programs of one query meet the same rows in L2. Chunks (split-K, SPLIT_ROWS rows each)
        # give a small batch more programs; with SPLIT they leave their online-softmax state for
        # _combine_kernel, else the single chunk writes the output.
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        c = tl.program_id(2)
        jn = tl.arange(0, NOPE_P)
        qb = q_ptr + n * q_stride + h * D  # q rows may be a column slice of a wider GEMM output
        qn = tl.load(qb + jn, mask=jn < NOPE, other=0.0).to(tl.float32)
        if ROPE > 0:
            jr = tl.arange(0, ROPE_P)
            qr = tl.load(qb + NOPE + jr, mask=jr < ROPE, other=0.0).to(tl.float32)
            acc_r = tl.zeros([ROPE_P], dtype=tl.float32)
        # running max and sum as 1-element tensors: loop-carried values keep one type
        m = tl.full([1], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([1], dtype=tl.float32)
        acc_n = tl.zeros([NOPE_P], dtype=tl.float32)
        k_hi = tl.minimum(c * CHUNK + CHUNK, K)
        for k0 in range(c * CHUNK, k_hi, BLOCK_K):
            valid, row, xn = _load_tile(
                sel_ptr,
                loc_ptr,
                kv_u8,
                kv_f32,
                kv_bf16,
                n * K,
                k0,
                k_hi,
                row_bytes,
                jn,
                NOPE,
                FP8,
                ROUND_BF16,
                BLOCK_K,
            )
            s = tl.sum(xn * qn[None, :], 1)  # [BLOCK_K]
            if ROPE > 0:
                xr = _load_rope(kv_bf16, row, valid, jr, row_bytes, NOPE, ROPE).to(tl.float32)
                s += tl.sum(xr * qr[None, :], 1)
            s = tl.where(valid, s * sm_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            live = m_new > float("-inf")  # some row seen so far (else nothing to accumulate)
            alpha = tl.where(live, tl.exp(m - tl.where(live, m_new, 0.0)), 1.0)  # no -inf - -inf
            p = tl.where(valid, tl.exp(s - tl.where(live, m_new, 0.0)), 0.0)  # [BLOCK_K]
            l_sum = l_sum * alpha + tl.sum(p, 0)
            acc_n = acc_n * alpha + tl.sum(p[:, None] * xn, 0)
            if ROPE > 0:
                acc_r = acc_r * alpha + tl.sum(p[:, None] * xr, 0)
            m = m_new
        if SPLIT:  # this chunk's state: running max, sum and unnormalised accumulator
            part = (n * tl.num_programs(2) + c) * H + h
            z = tl.arange(0, 1)
            tl.store(m_ptr + part + z, m)
            tl.store(l_ptr + part + z, l_sum)
            ab = acc_ptr + part * D
            tl.store(ab + jn, acc_n, mask=jn < NOPE)
            if ROPE > 0:
                tl.store(ab + NOPE + jr, acc_r, mask=jr < ROPE)
        else:
            inv = tl.where(l_sum > 0, 1.0 / l_sum, 0.0)
            ob = out_ptr + (n * H + h) * D
            tl.store(ob + jn, (acc_n * inv).to(out_ptr.dtype.element_ty), mask=jn < NOPE)
            if ROPE > 0:
                tl.store(ob + NOPE + jr, (acc_r * inv).to(out_ptr.dtype.element_ty), mask=jr < ROPE)

    @triton.jit
    def _sparse_attention_mma_kernel(
        q_ptr,
        sel_ptr,
        loc_ptr,
        kv_u8,
        kv_f32,
        kv_bf16,
        out_ptr,
        m_ptr,
        l_ptr,
        acc_ptr,
        K,
        CHUNK,
        row_bytes,
        sm_scale,
        q_stride,
        H: tl.constexpr,
        HP: tl.constexpr,
        D: tl.constexpr,
        NOPE: tl.constexpr,
        ROPE: tl.constexpr,
        FP8: tl.constexpr,
        ROUND_BF16: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NOPE_P: tl.constexpr,
        ROPE_P: tl.constexpr,
        SPLIT: tl.constexpr,
        BF16_MMA: tl.constexpr,
    ):
        # one program per (query, chunk of CHUNK selections) for all heads: each row is decoded
        # once, and both products run as tensor-core dots over heads padded to HP >= 16 rows
        # (no cross-thread reductions). BF16_MMA (bf16 queries, rows rounded to bf16): q . x is
        # exact per product in bf16 x bf16 -> fp32; p @ x splits p into two bf16 terms (hi + lo),
        # ~2^-16 relative, i.e. float32-level agreement with the reference. Otherwise (float32,
        # the interpreter) IEEE float32 dots. Partials use the per-head kernel's layout, so
        # _combine_kernel merges both.
        n = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        hh = tl.arange(0, HP)
        hm = hh < H
        jn = tl.arange(0, NOPE_P)
        qrow = q_ptr + n * q_stride + hh * D
        qn = tl.load(
            qrow[:, None] + jn[None, :], mask=hm[:, None] & (jn[None, :] < NOPE), other=0.0
        )
        if not BF16_MMA:
            qn = qn.to(tl.float32)
        if ROPE > 0:
            jr = tl.arange(0, ROPE_P)
            qr = tl.load(
                qrow[:, None] + NOPE + jr[None, :],
                mask=hm[:, None] & (jr[None, :] < ROPE),
                other=0.0,
            )
            if not BF16_MMA:
                qr = qr.to(tl.float32)
            acc_r = tl.zeros([HP, ROPE_P], dtype=tl.float32)
        m = tl.full([HP], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([HP], dtype=tl.float32)
        acc_n = tl.zeros([HP, NOPE_P], dtype=tl.float32)
        k_hi = tl.minimum(c * CHUNK + CHUNK, K)
        for k0 in range(c * CHUNK, k_hi, BLOCK_K):
            valid, row, xn = _load_tile(
                sel_ptr,
                loc_ptr,
                kv_u8,
                kv_f32,
                kv_bf16,
                n * K,
                k0,
                k_hi,
                row_bytes,
                jn,
                NOPE,
                FP8,
                ROUND_BF16,
                BLOCK_K,
            )
            if BF16_MMA:
                xn = xn.to(tl.bfloat16)  # exact: xn is already a bf16 value
                s = tl.dot(qn, tl.trans(xn))
            else:
                s = tl.dot(qn, tl.trans(xn), input_precision="ieee")  # [HP, BLOCK_K]
            if ROPE > 0:
                xr = _load_rope(kv_bf16, row, valid, jr, row_bytes, NOPE, ROPE)
                if BF16_MMA:
                    s += tl.dot(qr, tl.trans(xr))
                else:
                    xr = xr.to(tl.float32)
                    s += tl.dot(qr, tl.trans(xr), input_precision="ieee")
            s = tl.where(valid[None, :], s * sm_scale, float("-inf"))
            m, alpha, p, l_sum = _softmax_tile(s, m, l_sum)
            acc_n = acc_n * alpha[:, None] + _dot_p(p, xn, BF16_MMA)
            if ROPE > 0:
                acc_r = acc_r * alpha[:, None] + _dot_p(p, xr, BF16_MMA)
        if SPLIT:
            part = (n * tl.num_programs(1) + c) * H + hh
            tl.store(m_ptr + part, m, mask=hm)
            tl.store(l_ptr + part, l_sum, mask=hm)
            ab = acc_ptr + part[:, None] * D
            tl.store(ab + jn[None, :], acc_n, mask=hm[:, None] & (jn[None, :] < NOPE))
            if ROPE > 0:
                tl.store(ab + NOPE + jr[None, :], acc_r, mask=hm[:, None] & (jr[None, :] < ROPE))
        else:
            inv = tl.where(l_sum > 0, 1.0 / l_sum, 0.0)
            ob = out_ptr + (n * H + hh[:, None]) * D
            tl.store(
                ob + jn[None, :],
                (acc_n * inv[:, None]).to(out_ptr.dtype.element_ty),
                mask=hm[:, None] & (jn[None, :] < NOPE),
            )
            if ROPE > 0:
                tl.store(
                    ob + NOPE + jr[None, :],
                    (acc_r * inv[:, None]).to(out_ptr.dtype.element_ty),
                    mask=hm[:, None] & (jr[None, :] < ROPE),
                )

    @triton.jit
    def _combine_kernel(
        m_ptr,
        l_ptr,
        acc_ptr,
        out_ptr,
        NS,
        H: tl.constexpr,
        D: tl.constexpr,
        NSP: tl.constexpr,
        DP: tl.constexpr,
    ):
        # merge the chunks' online-softmax states of one (query, head): rescale each chunk's sum
        # and accumulator to the common maximum (a chunk of padding only has max -inf, weight 0)
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        cs = tl.arange(0, NSP)
        cm = cs < NS
        part = (n * NS + cs) * H + h
        mc = tl.load(m_ptr + part, mask=cm, other=float("-inf"))
        lc = tl.load(l_ptr + part, mask=cm, other=0.0)
        mx = tl.max(mc, 0)
        w = tl.where(mc > float("-inf"), tl.exp(mc - tl.where(mx > float("-inf"), mx, 0.0)), 0.0)
        lt = tl.sum(w * lc, 0)
        inv = tl.where(lt > 0, 1.0 / lt, 0.0)
        jd = tl.arange(0, DP)
        a = tl.load(
            acc_ptr + part[:, None] * D + jd[None, :],
            mask=cm[:, None] & (jd[None, :] < D),
            other=0.0,
        )
        o = tl.sum(w[:, None] * a, 0) * inv
        tl.store(out_ptr + (n * H + h) * D + jd, o.to(out_ptr.dtype.element_ty), mask=jd < D)


def _p2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << max(0, (int(n) - 1).bit_length()))


# Rows of selections per split-K chunk. A fixed size, as SGLang's deterministic mode fixes its
# split-KV size: the chunk count depends on k alone, never on how many queries share the
# launch, so a query's merge order -- and its bits -- do not depend on the requests or the CUDA
# graph padding rows beside it (docs/engine.md, batch invariance). 128 rows (8 chunks at
# k = 1,024) is the measured balance on the H200 at glm53_h200's geometry (16 heads; the all-heads
# kernel, results/attention/h200-glm53_h200-split-sweep.json): 38 / 39 / 50 / 176 us at 1 / 16 /
# 32 / 128 queries, against 62 / 64 / 65 / 161 us with 4 chunks and 24 / 32 / 56 / 202 us with 16:
# a small batch needs programs, a large one pays for each chunk's float32 partials.
SPLIT_ROWS = 128


def split_count(K: int, block_k: int, rows: int | None = None) -> int:
    """Chunks per (query, head) for k = ``K`` selections: chunks of ``rows`` (default
    SPLIT_ROWS) rounded up to whole tiles of ``block_k``, whatever the number of queries."""
    rows = SPLIT_ROWS if rows is None else int(rows)
    chunk = -(-max(rows, 1) // block_k) * block_k
    return max(1, -(-max(K, 1) // chunk))


def sparse_attention_triton(
    q,
    kv,
    selections,
    locations,
    *,
    kv_format: str,
    kv_dim: int,
    rope_dim: int,
    row_dtype: torch.dtype,
    block_k: int | None = None,
    num_warps: int = 4,
    splits: int | None = None,
    kernel: str = "per_head",
) -> torch.Tensor:
    """``splits``: chunks of selections per (query, head), merged by a second small launch;
    default ``split_count`` (a function of k alone: batch invariant). ``kernel``: ``per_head`` (one
    program per query, head and chunk) or ``mma`` (all heads of a query per program, tensor-core
    dots; see _sparse_attention_mma_kernel)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    N, H, d = q.shape
    assert d == kv_dim and selections.shape == locations.shape and selections.shape[0] == N
    K = selections.shape[1]
    fp8 = kv_format == "fp8"
    nope, rope = (kv_dim - rope_dim, rope_dim) if fp8 else (kv_dim, 0)
    row_bytes = kv.shape[1]
    assert kv.is_contiguous() and row_bytes % 4 == 0, "rows must be whole float32 words"
    if q.stride(2) != 1 or q.stride(1) != d:  # heads packed in a row; rows may be strided
        q = q.contiguous()
    out = torch.empty((N, H, d), dtype=q.dtype, device=q.device)
    if N == 0:
        return out
    if kernel not in ("per_head", "mma"):
        raise ValueError(f"unknown sparse attention kernel {kernel!r}")
    bf16 = q.dtype == torch.bfloat16 and row_dtype == torch.bfloat16
    # the mma kernel's float32 dots (non-bf16 inputs) need ~234 KB of shared memory per program
    # on sm_90 (limit 227 KB): they are for the interpreter; a GPU takes the per-head kernel
    mma = kernel == "mma" and (bf16 or not q.is_cuda)
    if block_k is None:  # H200 tile sweeps (docs/engine.md): 32 rows for both kernels
        block_k = 32
    ns = int(splits) if splits else split_count(K, block_k)
    chunk = -(-max(K, 1) // ns)
    chunk = -(-chunk // block_k) * block_k  # whole tiles per chunk
    ns = max(1, -(-K // chunk))
    if ns > 1:
        m = torch.empty(N * ns * H, dtype=torch.float32, device=q.device)
        l_ = torch.empty_like(m)
        acc = torch.empty(N * ns * H * d, dtype=torch.float32, device=q.device)
    else:
        m = l_ = acc = out  # unused
    args = (
        q,
        selections.contiguous(),
        locations.contiguous(),
        kv,
        kv.view(torch.float32),
        kv.view(torch.bfloat16),
        out,
        m,
        l_,
        acc,
        K,
        chunk,
        row_bytes,
        1.0 / math.sqrt(kv_dim),
        q.stride(0),
    )
    common = dict(
        H=H,
        D=d,
        NOPE=nope,
        ROPE=rope,
        FP8=fp8,
        ROUND_BF16=row_dtype == torch.bfloat16,
        BLOCK_K=block_k,
        NOPE_P=_p2(nope),
        ROPE_P=_p2(rope) if rope else 16,
        SPLIT=ns > 1,
        num_warps=num_warps,
    )
    if mma:
        _sparse_attention_mma_kernel[(N, ns)](*args, HP=_p2(H), BF16_MMA=bf16, **common)
    else:
        _sparse_attention_kernel[(N, H, ns)](*args, **common)
    if ns > 1:
        _combine_kernel[(N, H)](m, l_, acc, out, ns, H=H, D=d, NSP=_p2(ns, 2), DP=_p2(d))
    return out


def sparse_attention(
    q,
    kv,
    selections,
    locations,
    *,
    kv_format: str,
    kv_dim: int,
    rope_dim: int,
    row_dtype: torch.dtype,
    impl: str = "triton",
) -> torch.Tensor:
    """Attention of q [N, H, d] over the selected rows of kv (see the module docstring)."""
    kw = dict(kv_format=kv_format, kv_dim=kv_dim, rope_dim=rope_dim, row_dtype=row_dtype)
    if impl == "triton":
        return sparse_attention_triton(q, kv, selections, locations, **kw)
    if impl == "triton_mma":
        return sparse_attention_triton(q, kv, selections, locations, kernel="mma", **kw)
    if impl == "reference":
        return sparse_attention_reference(q, kv, selections, locations, **kw)
    raise ValueError(f"unknown sparse attention impl {impl!r}")


def aot_compile(
    arch: int = 90,
    num_warps: int = 4,
    fp8: bool = True,
    q_type: str = "bf16",
    kernel: str = "per_head",
    **constexprs,
):
    """Compile the kernel for an NVIDIA target without a GPU (Triton bundles ptxas): catches
    compile-mode errors the interpreter does not see. Needs a process where TRITON_INTERPRET
    is unset. Returns the compiled kernel (``.asm`` holds ttir/ttgir/llir/ptx/cubin)."""
    from systems.kernels.aot import compile_for_nvidia

    fn = _sparse_attention_kernel if kernel == "per_head" else _sparse_attention_mma_kernel
    c = dict(
        H=4,
        D=576,
        NOPE=512,
        ROPE=64,
        FP8=fp8,
        ROUND_BF16=True,
        BLOCK_K=32,
        NOPE_P=512,
        ROPE_P=64,
        SPLIT=True,
    )
    if not fp8:
        c.update(D=576, NOPE=576, ROPE=0, NOPE_P=1024, ROPE_P=16)
    if kernel == "mma":
        c.update(HP=16, BF16_MMA=q_type == "bf16")
    c.update(constexprs)
    ptrs = {
        "q_ptr": "*" + q_type,
        "sel_ptr": "*i64",
        "loc_ptr": "*i64",
        "kv_u8": "*u8",
        "kv_f32": "*fp32",
        "kv_bf16": "*bf16",
        "out_ptr": "*" + q_type,
        "m_ptr": "*fp32",
        "l_ptr": "*fp32",
        "acc_ptr": "*fp32",
    }
    ptrs["sm_scale"] = "fp32"
    return compile_for_nvidia(fn, c, ptrs, arch, num_warps)
