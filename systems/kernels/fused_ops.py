"""The small fused kernels of a decoder layer: residual add + RMSNorm, SiLU-gated product, the
fp8 encoding of new KV rows, and the indexer's query blend.

Why: a decode step of the mini presets reads under 1 GB, so its time is set by how many kernels
it launches, not by bytes (about 60 per layer in plain PyTorch: the norm alone is six
elementwise kernels, the fp8 row encoding ten). Each kernel here replaces such a chain with one
launch that reads its inputs once. The plain-PyTorch reference of each sits beside it and is
what the model runs with ``attention_impl: reference`` (the golden tokens' path).

Contracts (M rows; every tensor contiguous in its last dimension):

    add_rms_norm(x, delta)  x, delta (M, D) -> (x + delta, rms_norm(x + delta)); delta may be
                            None (then x is returned as is). The sum is rounded to x's dtype
                            before the norm reads it, as the unfused ``x = x + delta`` does.
                            Bytes: 2 reads + 2 writes of M x D.
    silu_mul(gate_up)       gate_up (M, 2F) = [gate | up] -> silu(gate) * up, (M, F).
                            Bytes: 3 x M x F.
    encode_fp8_rows(x, ...) x (M, kv_dim) -> (M, row_bytes) uint8 in kv_format.py's fp8 layout:
                            nope values as e4m3 with one float32 scale per 128, rope as bf16;
                            or written in place at rows ``out_rows`` of a pool ``out``.
                            Bytes: M x kv_dim x itemsize read, M x row_bytes written.
    blend_index_query(iq, w_sal, lam)
                            iq (..., di) bf16/float32, w_sal (di,) float32 -> float32 (..., di)
                            contiguous: (1 - lam) * iq / max(|iq|, 1e-6) + lam * w_sal per row.
                            iq may be a column view of a wider GEMM output (rows strided).
                            Bytes: M x di reads of iq's dtype + 4 x di + 4 x M x di written.

The fp8 and bf16 roundings are done with integer arithmetic (round to nearest even; fp8
saturating at 448) rather than casts: Triton's interpreter rounds both casts differently from
the GPU, and the CPU tests compare this kernel with torch's casts byte for byte.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False

RMS_EPS = 1e-6
FP8_MAX = 448.0
FP8_BLOCK = 128


# ---------------------------------------------------------------------------- references
def rms_norm_reference(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(x.dtype)


def add_rms_norm_reference(x, delta):
    if delta is not None:
        x = x + delta
    return x, rms_norm_reference(x)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def blend_index_query_reference(iq: torch.Tensor, w_sal: torch.Tensor, lam: float) -> torch.Tensor:
    iq = iq.float()
    iq = iq / iq.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return (1.0 - lam) * iq + lam * w_sal


# ---------------------------------------------------------------------------- kernels
if _HAVE_TRITON:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, d_ptr, xo_ptr, h_ptr, D, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        x = tl.load(x_ptr + row * D + cols, mask=m, other=0.0)
        if HAS_DELTA:
            d = tl.load(d_ptr + row * D + cols, mask=m, other=0.0)
            # rounded to the storage dtype first: the norm reads the residual as stored
            x = (x.to(tl.float32) + d.to(tl.float32)).to(xo_ptr.dtype.element_ty)
            tl.store(xo_ptr + row * D + cols, x, mask=m)
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
        tl.store(h_ptr + row * D + cols, (xf * r).to(h_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, Fdim, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < Fdim
        g = tl.load(gu_ptr + row * 2 * Fdim + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * Fdim + Fdim + cols, mask=m, other=0.0)
        # silu rounded to the storage dtype before the product, as F.silu(g) * u does
        s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * Fdim + cols, (s.to(tl.float32) * u.to(tl.float32)), mask=m)

    @triton.jit
    def _store_bytes(ptr, offs, word, NBYTES: tl.constexpr, mask):
        # little-endian bytes of an integer word, so the store needs no alignment
        for i in tl.static_range(NBYTES):
            tl.store(ptr + offs * NBYTES + i, ((word >> (8 * i)) & 0xFF).to(tl.uint8), mask=mask)

    @triton.jit
    def _e4m3_code(y):
        """fp32 -> e4m3fn code (int32 0..255), round to nearest even, |y| saturating at 448."""
        bits = y.to(tl.int32, bitcast=True)
        sign = (bits >> 31) & 1
        a = tl.abs(y)
        # normal range (a >= 2^-6): keep 3 of 23 mantissa bits, then rebias 127 -> 7
        ab = a.to(tl.int32, bitcast=True)
        rounded = (ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20
        normal = tl.minimum(rounded - ((127 - 7) << 3), 0x7E)
        # subnormal range: the code is a / 2^-9 rounded to nearest even (8 carries into 2^-6)
        v = a * 512.0
        f = v.to(tl.int32)
        frac = v - f.to(tl.float32)
        up = (frac > 0.5) | ((frac == 0.5) & ((f & 1) == 1))
        sub = f + up.to(tl.int32)
        code = tl.where(a < 0.015625, sub, normal)
        return code | (sign << 7)

    @triton.jit
    def _encode_fp8_kernel(
        x_ptr,
        out_ptr,
        dst_ptr,
        x_stride,
        SCATTER: tl.constexpr,
        RB: tl.constexpr,
        NOPE: tl.constexpr,
        NB: tl.constexpr,
        NB_P: tl.constexpr,
        ROPE: tl.constexpr,
        ROPE_P: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        blk = tl.arange(0, NB_P)
        j = tl.arange(0, 128)
        bm = blk < NB
        offs = blk[:, None] * 128 + j[None, :]
        m2 = bm[:, None] & (j[None, :] < 128)
        x = tl.load(x_ptr + row * x_stride + offs, mask=m2, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), 1)
        scale = tl.math.div_rn(tl.maximum(amax, 1e-8), 448.0)  # a true division, as encode_rows
        code = _e4m3_code(tl.math.div_rn(x, scale[:, None]))
        # SCATTER: row i lands at out[dst[i]] (the KV pool's row of its position), else out[i]
        o = out_ptr + (tl.load(dst_ptr + row).to(tl.int64) if SCATTER else row) * RB
        tl.store(o + offs, code.to(tl.uint8), mask=m2)
        _store_bytes(o + NOPE, blk, scale.to(tl.int32, bitcast=True), 4, bm)
        if ROPE > 0:
            r = tl.arange(0, ROPE_P)
            rm = r < ROPE
            xr = tl.load(x_ptr + row * x_stride + NOPE + r, mask=rm, other=0.0).to(tl.float32)
            # bf16 by round to nearest even on the bits (exact for inputs already in bf16)
            b = xr.to(tl.int32, bitcast=True)
            w = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
            _store_bytes(o + NOPE + 4 * NB, r, w, 2, rm)

    @triton.jit
    def _blend_index_query_kernel(
        iq_ptr, w_ptr, out_ptr, R, stride_b, stride_r, DI, a, b, BLOCK: tl.constexpr
    ):
        # rows are (b, r) of a (B, R, DI) view: two strides, so a column slice of a wider GEMM
        # output split along its middle dimension (a query chunk) is read in place
        row = tl.program_id(0).to(tl.int64)
        i = row // R
        r = row - i * R
        cols = tl.arange(0, BLOCK)
        m = cols < DI
        x = tl.load(iq_ptr + i * stride_b + r * stride_r + cols, mask=m, other=0.0)
        x = x.to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        # IEEE sqrt and division (Triton's defaults lower to the approximate ones on NVIDIA), and
        # a clamp that keeps NaN as clamp_min does; the sum of squares and the blend's fused
        # multiply-add round in their own order: the reference to float32 rounding, per row
        n = tl.maximum(tl.sqrt_rn(tl.sum(x * x, 0)), 1e-6, propagate_nan=tl.PropagateNan.ALL)
        tl.store(out_ptr + row * DI + cols, a * tl.math.div_rn(x, n) + b * w, mask=m)


# ---------------------------------------------------------------------------- wrappers
def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def add_rms_norm(x, delta, impl: str = "triton"):
    """(x + delta, rms_norm(x + delta)); ``delta`` None normalizes x alone."""
    if impl == "reference":
        return add_rms_norm_reference(x, delta)
    if impl != "triton":
        raise ValueError(f"unknown add_rms_norm impl {impl!r}")
    shape = x.shape
    x2 = _rows(x)
    M, D = x2.shape
    h = torch.empty_like(x2)
    if delta is None:
        xo, d2 = x2, x2
    else:
        if delta.shape != shape or delta.dtype != x.dtype:
            # the reference would promote a wider delta (and return that dtype): not a case the
            # model has (its deltas come from projections in x's dtype), so not one to guess
            raise ValueError(
                f"delta {tuple(delta.shape)} {delta.dtype} does not match x {tuple(shape)} "
                f"{x.dtype}"
            )
        d2 = _rows(delta)
        xo = torch.empty_like(x2)
    if M:
        _add_rms_norm_kernel[(M,)](
            x2,
            d2,
            xo,
            h,
            D,
            RMS_EPS,
            HAS_DELTA=delta is not None,
            BLOCK=triton.next_power_of_2(D),
        )
    return (x if delta is None else xo.view(shape)), h.view(shape)


def silu_mul(gate_up: torch.Tensor, impl: str = "triton") -> torch.Tensor:
    """silu(gate) * up of ``gate_up`` = [gate | up] along the last dimension."""
    if impl == "reference":
        return silu_mul_reference(gate_up)
    if impl != "triton":
        raise ValueError(f"unknown silu_mul impl {impl!r}")
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension must be even, got {gate_up.shape[-1]}")
    lead, Fdim = gate_up.shape[:-1], gate_up.shape[-1] // 2
    gu = _rows(gate_up)
    out = torch.empty(gu.shape[0], Fdim, dtype=gate_up.dtype, device=gate_up.device)
    if gu.shape[0]:
        block = min(1024, triton.next_power_of_2(Fdim))
        _silu_mul_kernel[(gu.shape[0], triton.cdiv(Fdim, block))](gu, out, Fdim, BLOCK=block)
    return out.view(*lead, Fdim)


def encode_fp8_rows(
    x: torch.Tensor,
    kv_dim: int,
    rope_dim: int,
    row_bytes: int,
    out: torch.Tensor | None = None,
    out_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """(..., kv_dim) -> (..., row_bytes) uint8, byte for byte ``kv_format.encode_rows`` (fp8).

    With ``out`` (M, row_bytes) uint8 and ``out_rows`` (N,) integer, N the number of rows of
    ``x``, row i is written to ``out[out_rows[i]]`` instead (the step's new rows straight into
    the KV pool: no encoded copy and no scatter launch), and ``out`` is returned."""
    nope = kv_dim - rope_dim
    if x.shape[-1] != kv_dim or nope % FP8_BLOCK:
        raise ValueError(
            f"rows of {x.shape[-1]} values with kv_dim={kv_dim}, rope_dim={rope_dim}: the nope "
            f"part must be a multiple of {FP8_BLOCK}"
        )
    nb = nope // FP8_BLOCK
    if row_bytes != nope + 4 * nb + 2 * rope_dim:
        raise ValueError(f"row_bytes={row_bytes} is not the fp8 layout of kv_dim={kv_dim}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, kv_dim)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    scatter = out is not None
    if scatter:
        if out_rows is None or out_rows.numel() != x2.shape[0]:
            raise ValueError("out needs out_rows, one destination row per row of x")
        if out.dtype != torch.uint8 or out.dim() != 2 or out.shape[1] != row_bytes:
            raise ValueError(f"out must be (M, {row_bytes}) uint8, got {tuple(out.shape)}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        dst = out_rows.reshape(-1)
        if dst.stride(0) != 1:
            dst = dst.contiguous()
    else:
        out = torch.empty(x2.shape[0], row_bytes, dtype=torch.uint8, device=x.device)
        dst = out  # not read
    if x2.shape[0]:
        _encode_fp8_kernel[(x2.shape[0],)](
            x2,
            out,
            dst,
            x2.stride(0),
            SCATTER=scatter,
            RB=row_bytes,
            NOPE=nope,
            NB=nb,
            NB_P=triton.next_power_of_2(nb),
            ROPE=rope_dim,
            ROPE_P=triton.next_power_of_2(max(rope_dim, 1)),
        )
    return out if scatter else out.view(*lead, row_bytes)


def blend_index_query(
    iq: torch.Tensor, w_sal: torch.Tensor, lam: float, impl: str = "triton"
) -> torch.Tensor:
    """(1 - lam) * iq / max(|iq|, 1e-6) + lam * w_sal along iq's last dimension, float32."""
    if impl == "reference":
        return blend_index_query_reference(iq, w_sal, lam)
    if impl != "triton":
        raise ValueError(f"unknown blend_index_query impl {impl!r}")
    di = iq.shape[-1]
    if w_sal.shape != (di,):
        raise ValueError(f"w_sal {tuple(w_sal.shape)} does not match iq's last dimension {di}")
    lead = iq.shape[:-1]
    # a (B, R, di) view with the row strides as they are: .contiguous() would be a copy kernel
    if iq.dim() < 3:
        x3 = iq.reshape(1, -1, di)
    else:
        x3 = iq.reshape(iq.shape[:-2].numel(), iq.shape[-2], di)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    B, R, _ = x3.shape
    out = torch.empty(B, R, di, dtype=torch.float32, device=iq.device)
    if out.numel():
        _blend_index_query_kernel[(B * R,)](
            x3,
            w_sal.float().contiguous(),
            out,
            R,
            x3.stride(0),
            x3.stride(1),
            di,
            # the two coefficients in double, rounded once, as the reference's scalars are
            1.0 - lam,
            lam,
            BLOCK=triton.next_power_of_2(di),
        )
    return out.view(*lead, di)
