"""A batch-invariant GEMM for the decode step: ``x @ w`` whose rows keep their bits whatever M is.

Why: cuBLAS chooses its kernel by the problem's shape, M included, and two kernels may sum a
row's products in different orders. On the H200, glm53_h200's fused input projections change a
row's bits from M = 17 rows and its attention output from 64
(``benchmarks/check_gemm_invariance.py``, results/cuda_graph/gemm-invariance-h200.json), so a
request's greedy tokens can depend on the requests beside it and on a CUDA graph's padding rows.
Here every launch uses one tile shape (BLOCK_M x BLOCK_N x BLOCK_K, the same warps) and splits K
into a number of chunks fixed by the weight's shape (K, N) alone, merged in chunk order: a row's
products are summed in the same order for any M, as the fixed-tile Triton matmuls of vLLM's and
SGLang's batch-invariant modes do. ``model.gemm_impl: triton`` runs the model's projections
through it; cuBLAS stays the default until this kernel is timed against it on the GPU.

Contract: ``mm(x (..., K), w (K, N)) -> (..., N)`` in x's dtype, float32 accumulation; w
row-major (the model's weights as drawn). Bytes: K x N x itemsize of weights (a decode GEMM's
floor) + M x (K + N) x itemsize, and with S chunks 2 x S x M x N x 4 of float32 partials
(up to SPLIT_MAX_ROWS rows; a prefill's longer products run unsplit). float32 inputs multiply
in full precision (no TF32).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64
# about two programs per SM of an H200 when N's tiles alone are fewer; a chunk never under
# MIN_CHUNK of K (partials cost 8 bytes per output per chunk)
TARGET_PROGRAMS = 264
MIN_CHUNK = 512
# products of more rows (a prompt's prefill, tens of thousands) run unsplit: their partials
# would take gigabytes, and no decode step (at most max_bs x k_max rows) reaches this many
SPLIT_MAX_ROWS = 4096


def mm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The plain product, in float32, rounded to x's dtype."""
    return (x.float() @ w.float()).to(x.dtype)


def split_k(K: int, N: int) -> int:
    """Chunks of K for a (K, N) weight: a function of the weight alone (batch invariance)."""
    tiles_n = -(-N // BLOCK_N)
    return max(1, min(K // MIN_CHUNK, -(-TARGET_PROGRAMS // tiles_n)))


if _HAVE_TRITON:

    @triton.jit(do_not_specialize=["M"])
    def _mm_kernel(
        x_ptr,
        w_ptr,
        out_ptr,  # (M, N) in x's dtype when SPLIT == 1, else (SPLIT, M, N) float32
        M,
        N,
        K,
        CHUNK,  # K per program (whole BLOCK_K tiles)
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr,
        PRECISION: tl.constexpr,  # "ieee" for float32 inputs (no TF32), else "tf32" (unused)
    ):
        # one program per (N tile, M tile, K chunk); the tile shape never depends on M, and M
        # is not specialized on, so a row meets the same instructions in the same order
        pn = tl.program_id(0)
        pm = tl.program_id(1)
        ps = tl.program_id(2)
        rm = (pm * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k0 = ps * CHUNK
        for kk in range(0, CHUNK, BLOCK_K):
            rk = k0 + kk + tl.arange(0, BLOCK_K)
            a = tl.load(
                x_ptr + rm[:, None] * K + rk[None, :],
                mask=(rm[:, None] < M) & (rk[None, :] < K),
                other=0.0,
            )
            b = tl.load(
                w_ptr + rk[:, None].to(tl.int64) * N + rn[None, :],
                mask=(rk[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        keep = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT == 1:
            tl.store(
                out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), keep
            )
        else:
            base = out_ptr + ps.to(tl.int64) * M * N
            tl.store(base + rm[:, None] * N + rn[None, :], acc, keep)

    @triton.jit
    def _merge_kernel(part_ptr, out_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        # the chunks' partial sums of each output, added in chunk order
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        MN = MN.to(tl.int64)  # SPLIT x M x N may pass 2**31
        keep = i < MN
        acc = tl.load(part_ptr + i, mask=keep, other=0.0)
        for s in range(1, SPLIT):
            acc += tl.load(part_ptr + s * MN + i, mask=keep, other=0.0)
        tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), keep)


def mm_triton(x: torch.Tensor, w: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """``x @ w`` with the fixed tiles and ``split_k(K, N)`` chunks (``splits`` overrides it:
    tests and benchmarks)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use gemm_impl='cublas'")
    K, N = w.shape
    if x.shape[-1] != K:
        raise ValueError(f"mm: x has {x.shape[-1]} columns, w {K} rows")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    w = w if w.is_contiguous() else w.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out.reshape(*lead, N)
    s = int(splits) if splits else (split_k(K, N) if M <= SPLIT_MAX_ROWS else 1)
    chunk = -(-K // s)
    chunk = -(-chunk // BLOCK_K) * BLOCK_K  # whole tiles per chunk
    s = max(1, -(-K // chunk))
    part = out if s == 1 else torch.empty((s, M, N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, BLOCK_M), s)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    _mm_kernel[grid](
        x2,
        w,
        part,
        M,
        N,
        K,
        chunk,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        SPLIT=s,
        PRECISION=prec,
    )
    if s > 1:
        block = 1024
        _merge_kernel[(triton.cdiv(M * N, block),)](part, out, M * N, SPLIT=s, BLOCK=block)
    return out.reshape(*lead, N)


def mm(x: torch.Tensor, w: torch.Tensor, impl: str = "cublas") -> torch.Tensor:
    """The model's projection ``x @ w``: cuBLAS (``torch.matmul``) or the batch-invariant
    kernel."""
    if impl == "cublas":
        return x @ w
    if impl == "triton":
        return mm_triton(x, w)
    raise ValueError(f"unknown gemm impl {impl!r} (cublas or triton)")


def aot_compile(arch: int = 90, num_warps: int = 4, dtype: str = "bf16", split: int = 1):
    """Compile the GEMM kernel for an NVIDIA target without a GPU (systems/kernels/aot.py)."""
    from systems.kernels.aot import compile_for_nvidia

    c = dict(
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        SPLIT=split,
        PRECISION="ieee" if dtype == "fp32" else "tf32",
    )
    out = "*" + dtype if split == 1 else "*fp32"
    types = {"x_ptr": "*" + dtype, "w_ptr": "*" + dtype, "out_ptr": out}
    return compile_for_nvidia(_mm_kernel, c, types, arch=arch, num_warps=num_warps)
