"""Tail backup: committed rows copied from the device payload pool to the pinned host store in
one launch for the whole batch (HiSparse's commit, when a tail cannot take the next block).

Contract
    kv_pool    uint8 [S, NG, rb]   device payload pool (hot caches and tails of every source)
    host_pool  uint8 [S, NH, rb]   host store: pinned CPU memory on a GPU (written through UVA)
    dev_rows   int64 [N]           pool rows to copy (the same row index in every source)
    host_rows  int64 [N]           where each lands in the host store
    effect     host_pool[s, host_rows[i]] = kv_pool[s, dev_rows[i]] for every s, i

Why a kernel: the per-request path issued one asynchronous copy per KV source and run of host
pages (26 sources x every request whose tail filled: ~400 copies and ~8 ms of a batch-32
speculative round on the H200), each paying the driver's launch cost for 656 bytes x a few
rows. The kernel's stores go straight over PCIe into the pinned store, ordered on the stream
with everything that later reads those rows.

Bytes moved: N x S x rb read from device memory + the same written over PCIe (8.7 MB for 32
requests x 16 rows x 26 sources x 656 bytes: ~0.2 ms at 50 GB/s).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False


def backup_rows_reference(kv_pool, host_pool, dev_rows, host_rows) -> None:
    rows = kv_pool[:, dev_rows.to(kv_pool.device)]  # (S, N, rb)
    host_pool[:, host_rows.to(host_pool.device)] = rows.to(host_pool.device)


if _HAVE_TRITON:

    @triton.jit
    def _backup_kernel(
        src_ptr,
        dst_ptr,
        dev_rows_ptr,
        host_rows_ptr,
        src_stride,
        dst_stride,
        W: tl.constexpr,
        W_P: tl.constexpr,
    ):
        # one program per (row, source): W words of one row
        i = tl.program_id(0)
        s = tl.program_id(1).to(tl.int64)
        d = tl.load(dev_rows_ptr + i)
        h = tl.load(host_rows_ptr + i)
        ww = tl.arange(0, W_P)
        m = ww < W
        x = tl.load(src_ptr + s * src_stride + d * W + ww, mask=m)
        tl.store(dst_ptr + s * dst_stride + h * W + ww, x, mask=m)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The widest integer view whose words tile a row (rows stay aligned: 656 = 164 x 4)."""
    rb = t.shape[-1]
    for dt, size in ((torch.int32, 4), (torch.int16, 2)):
        if rb % size == 0 and t.data_ptr() % size == 0:
            return t.view(dt)
    return t


def backup_rows_triton(kv_pool, host_pool, dev_rows, host_rows) -> None:
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use the reference")
    if not (kv_pool.is_contiguous() and host_pool.is_contiguous()):
        raise ValueError("kv_pool and host_pool must be contiguous [S, rows, row_bytes]")
    if kv_pool.shape[0] != host_pool.shape[0] or kv_pool.shape[2] != host_pool.shape[2]:
        raise ValueError(f"pools disagree: {tuple(kv_pool.shape)} vs {tuple(host_pool.shape)}")
    N = dev_rows.numel()
    if N == 0:
        return
    src, dst = _words(kv_pool), _words(host_pool)
    if src.dtype != dst.dtype:
        src, dst = kv_pool, host_pool
    W = src.shape[-1]
    _backup_kernel[(N, kv_pool.shape[0])](
        src,
        dst,
        dev_rows,
        host_rows,
        src.stride(0),
        dst.stride(0),
        W=W,
        W_P=triton.next_power_of_2(W),
    )


def backup_rows(kv_pool, host_pool, dev_rows, host_rows, impl: str = "reference") -> None:
    if impl == "triton":
        return backup_rows_triton(kv_pool, host_pool, dev_rows, host_rows)
    if impl == "reference":
        return backup_rows_reference(kv_pool, host_pool, dev_rows, host_rows)
    raise ValueError(f"unknown backup impl {impl!r}")
