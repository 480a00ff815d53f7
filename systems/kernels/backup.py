"""Row copies between the device payload pool and the pinned host store, in one launch.

Contract (either direction)
    src        uint8 [S, NS, rb]   rows to read: the device payload pool (a backup) or the host
                                   store (a restore)
    dst        uint8 [S, ND, rb]   where they land; the host store is pinned CPU memory on a GPU,
                                   read or written through UVA
    src_rows   int64 [N]           rows to copy (the same row index in every source)
    dst_rows   int64 [N]           where each lands
    effect     dst[s, dst_rows[i]] = src[s, src_rows[i]] for every s, i

``backup_rows`` copies device rows to the host store (HiSparse's commit, when a tail cannot take
the next block; adaptive reclaim); ``restore_rows`` copies host rows into device pages (adaptive
population). Why a kernel: the per-request path issued one asynchronous copy per KV source and
run of host pages (26 sources x every request whose tail filled: ~400 copies and ~8 ms of a
batch-32 speculative round on the H200), each paying the driver's launch cost for 656 bytes x a
few rows; and a copy of a [S, n, rb] slice across devices is strided, which PyTorch stages
through contiguous temporaries on both sides. The kernel's loads or stores go straight over
PCIe, ordered on the stream with everything that later reads those rows.

Bytes moved: N x S x rb read on one side and written on the other (8.7 MB for 32 requests x 16
rows x 26 sources x 656 bytes: ~0.2 ms at 50 GB/s).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False


def copy_rows_reference(src, dst, src_rows, dst_rows) -> None:
    rows = src[:, src_rows.to(src.device)]  # (S, N, rb)
    dst[:, dst_rows.to(dst.device)] = rows.to(dst.device)


if _HAVE_TRITON:

    @triton.jit
    def _copy_rows_kernel(
        src_ptr,
        dst_ptr,
        src_rows_ptr,
        dst_rows_ptr,
        src_stride,
        dst_stride,
        N,
        TILES,
        S,
        W: tl.constexpr,
        W_P: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        # P programs share the S x TILES (source, tile) pairs: program p copies pairs p, p + P, ...,
        # a tile being BLOCK_R rows of W words (P = S x N, BLOCK_R = 1: a program per row and source)
        rr = tl.arange(0, BLOCK_R)
        ww = tl.arange(0, W_P)
        for f in range(tl.program_id(0), S * TILES, tl.num_programs(0)):
            s = (f // TILES).to(tl.int64)
            i = (f % TILES) * BLOCK_R + rr
            mi = i < N
            a = tl.load(src_rows_ptr + i, mask=mi, other=0)
            b = tl.load(dst_rows_ptr + i, mask=mi, other=0)
            m = mi[:, None] & (ww < W)[None, :]
            x = tl.load(src_ptr + s * src_stride + a[:, None] * W + ww[None, :], mask=m)
            tl.store(dst_ptr + s * dst_stride + b[:, None] * W + ww[None, :], x, mask=m)


# rows per tile of a bounded grid: 8 rows x 164 words (a 656-byte GLM row) per iteration
_TILE_ROWS = 8


def _words(t: torch.Tensor) -> torch.Tensor:
    """The widest integer view whose words tile a row (rows stay aligned: 656 = 164 x 4)."""
    rb = t.shape[-1]
    for dt, size in ((torch.int32, 4), (torch.int16, 2)):
        if rb % size == 0 and t.data_ptr() % size == 0:
            return t.view(dt)
    return t


def copy_rows_triton(src, dst, src_rows, dst_rows, programs: int | None = None) -> None:
    """``programs``: the launch's thread blocks, each looping over (source, tile of rows) pairs
    (None: one block per row and source). Copies queued beside decode steps take a few: a block
    per row fills every SM with the copy's blocks (1.3M of them for a 50K-token, 26-source
    import), and the step's kernels wait for SMs behind them. A bounded grid holds at most
    ``programs`` SMs for the copy's duration, whatever the number of sources."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use the reference")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("both pools must be contiguous [S, rows, row_bytes]")
    if src.shape[0] != dst.shape[0] or src.shape[2] != dst.shape[2]:
        raise ValueError(f"pools disagree: {tuple(src.shape)} vs {tuple(dst.shape)}")
    if programs is not None and programs < 1:
        raise ValueError(f"programs must be None or >= 1, got {programs}")
    N = src_rows.numel()
    if N == 0:
        return
    s_words, d_words = _words(src), _words(dst)
    if s_words.dtype != d_words.dtype:
        s_words, d_words = src, dst
    W = s_words.shape[-1]
    block = 1 if programs is None else _TILE_ROWS
    S = src.shape[0]
    tiles = triton.cdiv(N, block)
    if S * tiles >= 2**31:  # the kernel's (source, tile) index is 32-bit
        raise ValueError(f"{S} sources x {tiles} tiles of rows exceed one launch's index")
    grid = S * tiles if programs is None else min(programs, S * tiles)
    _copy_rows_kernel[(grid,)](
        s_words,
        d_words,
        src_rows,
        dst_rows,
        s_words.stride(0),
        d_words.stride(0),
        N,
        tiles,
        S,
        W=W,
        W_P=triton.next_power_of_2(W),
        BLOCK_R=block,
    )


def copy_rows(
    src, dst, src_rows, dst_rows, impl: str = "reference", programs: int | None = None
) -> None:
    """``dst[s, dst_rows[i]] = src[s, src_rows[i]]`` for every source s (see the module);
    ``programs`` bounds the kernel's grid (``copy_rows_triton``)."""
    if impl == "triton":
        return copy_rows_triton(src, dst, src_rows, dst_rows, programs)
    if impl == "reference":
        return copy_rows_reference(src, dst, src_rows, dst_rows)
    raise ValueError(f"unknown row-copy impl {impl!r}")


def backup_rows(
    kv_pool, host_pool, dev_rows, host_rows, impl: str = "reference", programs: int | None = None
) -> None:
    """Device pool rows to the host store."""
    copy_rows(kv_pool, host_pool, dev_rows, host_rows, impl, programs)


def restore_rows(
    host_pool, kv_pool, host_rows, dev_rows, impl: str = "reference", programs: int | None = None
) -> None:
    """Host store rows into device pool rows."""
    copy_rows(host_pool, kv_pool, host_rows, dev_rows, impl, programs)
