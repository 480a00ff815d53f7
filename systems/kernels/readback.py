"""A step's small outputs copied to pinned host memory by a kernel, not by a copy engine.

Why: a decode step reads back a few bytes per request (the sampled tokens; a speculative round's
accepted lengths, next tokens and drafts). As an asynchronous memcpy that copy queues on the
device-to-host copy engine behind whatever is already there, and a handoff's history backup puts
hundreds of megabytes there (four 16K-token glm53_mini arrivals back up ~1.1 GB: ~20 ms of PCIe).
The step's readback then waits for the backups, and the decode loop with it. A kernel's stores
into pinned memory (through its UVA address) travel over PCIe beside the bulk copies instead of
behind them, ordered on the step's stream like any kernel.

Contract
    src     [N]   device tensor, contiguous (any dtype; the step's are int64)
    dst     [N]   pinned (page-locked) host tensor of src's dtype: a kernel can store to its
                  address. The caching host allocator does not see a kernel's use of its memory:
                  the caller keeps dst alive until the kernel is done (host_sync.start_readback)
    effect  dst[:] = src, once the stream reaches the launch
Bytes: N x itemsize read from HBM and written over PCIe (a few hundred bytes per step).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover
    _HAVE_TRITON = False

BLOCK = 1024

if _HAVE_TRITON:

    @triton.jit
    def _readback_kernel(src_ptr, dst_ptr, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < N
        tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=m), mask=m)


def readback_available() -> bool:
    return _HAVE_TRITON


def readback_reference(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)


def readback_triton(src: torch.Tensor, dst: torch.Tensor) -> None:
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed; use the reference")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(
            f"readback {tuple(src.shape)} {src.dtype} -> {tuple(dst.shape)} {dst.dtype}"
        )
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("readback needs contiguous tensors")
    if dst.device.type == "cpu" and src.is_cuda and not dst.is_pinned():
        raise ValueError("a kernel can only store to pinned host memory")
    n = src.numel()
    if n:
        _readback_kernel[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK)


def readback(src: torch.Tensor, dst: torch.Tensor, impl: str = "triton") -> None:
    """``dst[:] = src`` queued on the current stream (see the module docstring)."""
    if impl == "triton":
        return readback_triton(src, dst)
    if impl == "reference":
        return readback_reference(src, dst)
    raise ValueError(f"unknown readback impl {impl!r}")
