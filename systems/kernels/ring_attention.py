"""The drafter's attention over its KV ring, read in place (systems/spec/ring.py).

A drafter block of L queries attends to its slot's ring rows (R_d rows, of which the window's
positions are allowed) and to the block's own L keys, under an additive mask in the model dtype
(``drafters._context``). The reference gathers the slot's ring rows, concatenates the block's
keys and values, and calls ``scaled_dot_product_attention``: two gathers and two concatenations
of (B, R_d + L, d) per layer, and one fused-attention program per request (the drafter has one
head), so at batch 1 a single SM reads the whole window (H200 at glm53_h200's drafter, d = 512,
R_d ~ 2K: ~0.19 ms per call, the drafter's largest kernel). This kernel reads each ring row once
through the slot's offset, in fixed chunks of ``CHUNK_ROWS`` keys per program, and the sparse
attention's combine launch merges the chunks. The chunk count depends on R_d + L alone, never on
the batch, so a query's bits do not depend on the requests or padding rows beside it
(docs/engine.md, batch invariance).

Contract (identical to ``ring_attention_reference``):
    q              [B, L, d]   queries, bf16 or float32 (contiguous)
    ring_k, ring_v [S, R, d]   every slot's ring rows (row j of slot s), contiguous
    slots          int [B]     each request's slot
    k, v           [B, L, d]   the block's own keys and values (contiguous)
    bias           [B, 1, L, >= R + L]  additive mask (0 / -inf) in q's dtype; its last dimension
                               unit-strided (it may be a view of padded rows)
    out            [B, L, d] = softmax(q . [ring_k[slot]; k]^T * scale + bias) @ [ring_v[slot]; v]
A query whose keys are all masked gets zeros (the reference gives NaN; the drafter never asks:
a block query always sees its anchor's key).

Bytes per call: B * (R + L) * d * 2 * itemsize (keys and values, the term that matters) + the
mask B * L * (R + L) * itemsize + q and out; no intermediate copy of the keys.

Numerics: bf16 inputs run q . k as bf16 tensor-core dots (exact products, float32 sums) and
p @ v with p split into two bf16 terms (hi + lo, ~2^-16 relative); float32 inputs (the
interpreter) use IEEE float32 dots. The summation order differs from the reference's kernel, so
results agree to rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from systems.kernels.sparse_attention import (
    _HAVE_TRITON,
    _combine_kernel,
    _dot_p,
    _p2,
    _softmax_tile,
)

if _HAVE_TRITON:
    import triton
    import triton.language as tl

# Keys per split-K chunk: a fixed size (batch invariance, above); 128 as the sparse attention's
# SPLIT_ROWS, which gives the ~2K-row window 17 programs per request.
CHUNK_ROWS = 128
BLOCK_N = 32  # keys per tile: the tensor-core dots' N (>= 16)


def ring_attention_reference(q, ring_k, ring_v, slots, k, v, bias, scale: float) -> torch.Tensor:
    """Plain PyTorch: gather the slots' rings, append the block, one fused attention call."""
    s = slots.long()
    keys = torch.cat([ring_k[s], k], dim=1)  # (B, R + L, d)
    vals = torch.cat([ring_v[s], v], dim=1)
    M = keys.shape[1]
    return F.scaled_dot_product_attention(
        q.unsqueeze(1), keys.unsqueeze(1), vals.unsqueeze(1), attn_mask=bias[..., :M], scale=scale
    )[:, 0]


if _HAVE_TRITON:

    @triton.jit
    def _ring_attention_kernel(
        q_ptr,
        rk_ptr,
        rv_ptr,
        slot_ptr,
        k_ptr,
        v_ptr,
        bias_ptr,
        out_ptr,
        m_ptr,
        l_ptr,
        acc_ptr,
        L,
        R,
        CHUNK,
        scale,
        bias_sb,
        bias_sl,
        D: tl.constexpr,
        LP: tl.constexpr,
        DP: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr,
        BF16: tl.constexpr,
    ):
        # one program per (request, chunk of CHUNK keys) for all L queries of the block: key j < R
        # is ring row j of the request's slot, key R + i the block's own key i
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        li = tl.arange(0, LP)
        lm = li < L
        jd = tl.arange(0, DP)
        dm = jd < D
        qrow = (b * L + li)[:, None] * D + jd[None, :]
        q = tl.load(q_ptr + qrow, mask=lm[:, None] & dm[None, :], other=0.0)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        hi = tl.minimum(c * CHUNK + CHUNK, R + L)
        m = tl.full([LP], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([LP], dtype=tl.float32)
        acc = tl.zeros([LP, DP], dtype=tl.float32)
        for j0 in range(c * CHUNK, hi, BLOCK_N):
            jn = j0 + tl.arange(0, BLOCK_N)
            jm = jn < hi
            ring = jn < R
            rrow = (slot * R + jn)[:, None] * D + jd[None, :]
            brow = (b * L + jn - R)[:, None] * D + jd[None, :]
            rmask = (jm & ring)[:, None] & dm[None, :]
            bmask = (jm & (jn >= R))[:, None] & dm[None, :]
            # masked lanes fetch nothing: each key comes from one of the two loads
            kt = tl.load(rk_ptr + rrow, mask=rmask, other=0.0) + tl.load(
                k_ptr + brow, mask=bmask, other=0.0
            )
            vt = tl.load(rv_ptr + rrow, mask=rmask, other=0.0) + tl.load(
                v_ptr + brow, mask=bmask, other=0.0
            )
            if BF16:
                s = tl.dot(q, tl.trans(kt))
            else:
                s = tl.dot(q, tl.trans(kt), input_precision="ieee")  # [LP, BLOCK_N]
            bias = tl.load(
                bias_ptr + b * bias_sb + li[:, None] * bias_sl + jn[None, :],
                mask=lm[:, None] & jm[None, :],
                other=float("-inf"),
            ).to(tl.float32)
            m, alpha, p, l_sum = _softmax_tile(s * scale + bias, m, l_sum)
            acc = acc * alpha[:, None] + _dot_p(p, vt, BF16)
        if SPLIT:  # the sparse attention's partial layout with one head: query n = b * L + l
            part = (b * L + li) * tl.num_programs(1) + c
            tl.store(m_ptr + part, m, mask=lm)
            tl.store(l_ptr + part, l_sum, mask=lm)
            tl.store(acc_ptr + part[:, None] * D + jd[None, :], acc, mask=lm[:, None] & dm[None, :])
        else:
            inv = tl.where(l_sum > 0, 1.0 / tl.where(l_sum > 0, l_sum, 1.0), 0.0)
            tl.store(
                out_ptr + qrow,
                (acc * inv[:, None]).to(out_ptr.dtype.element_ty),
                mask=lm[:, None] & dm[None, :],
            )


def chunk_count(M: int, block_n: int, rows: int | None = None) -> tuple[int, int]:
    """(chunks, keys per chunk) for M keys: chunks of ``rows`` (default CHUNK_ROWS) rounded up to
    whole tiles of ``block_n``, a function of M alone (batch invariant)."""
    rows = CHUNK_ROWS if rows is None else int(rows)
    chunk = -(-max(rows, 1) // block_n) * block_n
    return max(1, -(-max(M, 1) // chunk)), chunk


def ring_attention_triton(
    q,
    ring_k,
    ring_v,
    slots,
    k,
    v,
    bias,
    scale: float,
    *,
    chunk_rows: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """``num_stages``: software-pipelined key / value tiles; at d = 512 and 32-key tiles two
    stages take ~146 KB of shared memory, three 274 KB (past sm_90's 227 KB)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use impl='reference'")
    B, L, d = q.shape
    S, R, d2 = ring_k.shape
    assert d2 == d and ring_v.shape == ring_k.shape and k.shape == v.shape == q.shape
    assert bias.shape[:3] == (B, 1, L) and bias.shape[3] >= R + L and bias.stride(3) == 1
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    assert ring_k.is_contiguous() and ring_v.is_contiguous()
    out = torch.empty_like(q)
    if B == 0:
        return out
    block_n = BLOCK_N if block_n is None else int(block_n)
    ns, chunk = chunk_count(R + L, block_n, chunk_rows)
    if ns > 1:
        m = torch.empty(B * L * ns, dtype=torch.float32, device=q.device)
        l_ = torch.empty_like(m)
        acc = torch.empty(B * L * ns * d, dtype=torch.float32, device=q.device)
    else:
        m = l_ = acc = out  # unused
    _ring_attention_kernel[(B, ns)](
        q,
        ring_k,
        ring_v,
        slots.contiguous(),
        k,
        v,
        bias,
        out,
        m,
        l_,
        acc,
        L,
        R,
        chunk,
        float(scale),
        bias.stride(0),
        bias.stride(2),
        D=d,
        LP=_p2(L),
        DP=_p2(d),
        BLOCK_N=block_n,
        SPLIT=ns > 1,
        BF16=q.dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if ns > 1:
        _combine_kernel[(B * L, 1)](m, l_, acc, out, ns, H=1, D=d, NSP=_p2(ns, 2), DP=_p2(d))
    return out


# A program holds its block's L x d float32 accumulator in registers: blocks are verification
# sized (L <= k_max); a longer one (none today: an arrival's ring fill attends to itself alone,
# without the ring) takes the reference rather than a kernel that would spill or not compile.
# (sm_90a, d = 512, two stages: 168 KB of shared memory at L = 32, 262 KB past sm_90's 227 KB at
# 64). And its dots take bf16 on a GPU (float32 tiles would need 362 KB) or float32 in the
# interpreter; other dtypes take the reference too.
MAX_BLOCK = 32


def _kernel_runs(q) -> bool:
    dtype = torch.bfloat16 if q.is_cuda else torch.float32
    return q.dtype == dtype and q.shape[1] <= MAX_BLOCK


def ring_attention(q, ring_k, ring_v, slots, k, v, bias, scale: float, impl: str = "triton"):
    """The drafter block's attention over its slot's ring and its own keys (module docstring)."""
    if impl == "triton" and _kernel_runs(q):
        return ring_attention_triton(q, ring_k, ring_v, slots, k, v, bias, scale)
    if impl in ("triton", "reference"):
        return ring_attention_reference(q, ring_k, ring_v, slots, k, v, bias, scale)
    raise ValueError(f"unknown ring attention impl {impl!r}")


def aot_compile(
    arch: int = 90,
    num_warps: int = 4,
    d: int = 512,
    L: int = 4,
    block_n: int = 32,
    num_stages: int = 2,
):
    """Compile the kernel for an NVIDIA target without a GPU (bf16, split): compile-mode errors
    the interpreter does not see, and its shared memory (``.metadata.shared``)."""
    from systems.kernels.aot import compile_for_nvidia

    ptrs = ("q_ptr", "rk_ptr", "rv_ptr", "k_ptr", "v_ptr", "bias_ptr", "out_ptr")
    types = {n: "*bf16" for n in ptrs}
    types.update({"slot_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"})
    types.update({"scale": "fp32", "bias_sb": "i64", "bias_sl": "i64"})
    consts = dict(D=d, LP=_p2(L), DP=_p2(d), BLOCK_N=block_n, SPLIT=True, BF16=True)
    return compile_for_nvidia(_ring_attention_kernel, consts, types, arch, num_warps, num_stages)
