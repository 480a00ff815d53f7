"""Device-to-host copies of a block of rows for every KV source in one call.

A handoff's history backup moves, for each of S sources, the same run of rows of the prompt's
KV (S, T, row_bytes) on the GPU into the same run of rows of the pinned host store
(S, rows, row_bytes). Both sides are then S blocks of equal length a fixed stride apart: one
``cudaMemcpy2DAsync``, one DMA the copy engine walks, where PyTorch needs a ``copy_`` per source
(its strided cross-device copy goes through temporaries, synchronously). The engine thread
queues a 16K-token glm53_h200 history in one call instead of 26 (benchmarks/bench_host_copy.py
measures both).

The runtime is the one PyTorch already loaded (found among the process's mapped libraries), so
the copy runs in PyTorch's context on PyTorch's stream. Where it cannot be found, or a pitch
passes the device's limit (a host store of more than ~2 GiB per source), the copies go one
source at a time, with a warning once.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

log = logging.getLogger("dhs.kv")

_D2H = 2  # cudaMemcpyDeviceToHost
_MAX_PITCH_ATTR = 11  # cudaDevAttrMaxPitch


@functools.cache
def _cudart():
    """(cudaMemcpy2DAsync, the device's max pitch, cudaGetLastError) from the loaded libcudart,
    or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = [p.split()[-1] for p in f if "libcudart.so" in p and len(p.split()) >= 6]
    except OSError:
        return None
    for path in paths:
        if not os.path.basename(path).startswith("libcudart.so"):
            continue
        lib = ctypes.CDLL(path)
        copy = lib.cudaMemcpy2DAsync
        copy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        copy.argtypes += [ctypes.c_size_t] * 3 + [ctypes.c_int, ctypes.c_void_p]
        copy.restype = ctypes.c_int
        attr = lib.cudaDeviceGetAttribute
        attr.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        attr.restype = ctypes.c_int
        clear = lib.cudaGetLastError  # a failed call also leaves the thread's last error set
        clear.restype = ctypes.c_int
        pitch = ctypes.c_int(0)
        if attr(ctypes.byref(pitch), _MAX_PITCH_ATTR, torch.cuda.current_device()):
            clear()
            return None
        return copy, pitch.value, clear
    return None


@functools.cache
def _warn_once(why: str) -> None:
    log.warning("history backups go one KV source at a time: %s", why)


def pitches(dst: torch.Tensor, src: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(dst pitch, src pitch, width, height) in bytes and blocks for a 2-D copy of ``src`` into
    ``dst`` when each is S blocks of contiguous rows a stride apart, else None."""
    if dst.dtype != src.dtype or src.dim() != 3 or dst.shape != src.shape or src.shape[0] < 1:
        return None
    row, item = src.shape[2], src.element_size()
    for t in (src, dst):
        if t.stride(2) != 1 or (t.shape[1] > 1 and t.stride(1) != row):
            return None
        if t.shape[0] > 1 and t.stride(0) < t.shape[1] * row:  # blocks would overlap
            return None
    return dst.stride(0) * item, src.stride(0) * item, src.shape[1] * row * item, src.shape[0]


def copy_blocks_to_host(dst: torch.Tensor, src: torch.Tensor) -> int:
    """``dst.copy_(src)``, asynchronously on the current stream, where ``src`` (S, n, row) is on
    the GPU and ``dst`` a view of the same shape into pinned host memory. Returns the calls
    queued (1, or S one source at a time)."""
    if src.numel() == 0:
        return 0
    one = src.device.type == "cuda" and dst.device.type == "cpu"
    args = pitches(dst, src) if one else None
    rt = _cudart() if args is not None else None
    if args is not None and rt is None:
        _warn_once("no libcudart.so among the process's libraries")
    elif rt is not None and max(args[0], args[1]) > rt[1]:
        _warn_once(f"a pitch passes the device's limit of {rt[1]} bytes")
    elif rt is not None:
        copy, _, clear = rt
        dpitch, spitch, width, height = args
        stream = torch.cuda.current_stream(src.device).cuda_stream
        rc = copy(dst.data_ptr(), dpitch, src.data_ptr(), spitch, width, height, _D2H, stream)
        if rc:
            clear()  # else PyTorch's next launch check would raise it in an unrelated step
            raise RuntimeError(f"cudaMemcpy2DAsync failed with CUDA error {rc}")
        return 1
    if src.device == dst.device:  # the CPU tests: one strided copy
        dst.copy_(src)
        return 1
    for s in range(src.shape[0]):
        dst[s].copy_(src[s], non_blocking=True)
    return src.shape[0]
