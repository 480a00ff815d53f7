"""Page-locked host memory for the KV host store, allocated at its exact size and quickly.

``torch.empty(..., pin_memory=True)`` goes through PyTorch's caching host allocator, which rounds
every request up to a power of two and pins it with one ``cudaHostAlloc``. For the Fig. 4 preset's
37 GB store that pins 64 GB, and on the H200 machine (a VM whose memory grows as it is touched)
it took 35.6 s of a 46 s server start (server.log, 2026-11-30). A bundled server starts once per
system and sweep setting, so this was most of a Fig. 9 call's device time.

``pinned_empty`` instead maps exactly the bytes asked for, touches the pages from all intra-op
threads (the page faults are the slow part and parallelize), and page-locks the range with
``cudaHostRegister`` (mapped, portable), so a Triton kernel reads it through UVA like any pinned
tensor. The mapping is unregistered when the last tensor or view over it is freed, before it is
unmapped. Any failure falls back to ``torch.empty(..., pin_memory=True)`` with a warning; set
``DHS_HOST_ALLOC=torch`` to take that path always.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import time
import warnings
from collections.abc import Callable

import torch

log = logging.getLogger("dhs.kv")

_REGISTER_FLAGS = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


class _RegisteredMap(mmap.mmap):
    """An anonymous mapping that undoes its page-locking when it is freed.

    A tensor made over it by ``torch.frombuffer`` keeps a strong reference to it (its storage's
    deleter drops that reference), so this object lives as long as the last tensor or view over
    it; ``__del__`` then runs before the mapping is unmapped (a subclass finalizer runs ahead of
    the base type's deallocation). Nothing else may hold or ``close()`` it."""

    unregister: Callable[[int], None] | None = None
    address: int = 0

    def __del__(self):
        fn, self.unregister = self.unregister, None
        if fn is not None:
            try:
                fn(self.address)
            except Exception:  # interpreter shutdown: the process exit releases the pages
                pass


def _cuda_register(ptr: int, nbytes: int) -> None:
    cudart = torch.cuda.cudart()
    torch.cuda.check_error(cudart.cudaHostRegister(ptr, nbytes, _REGISTER_FLAGS))


def _cuda_unregister(ptr: int) -> None:
    # a backup copy or a resolver read of this memory may still be in flight on a stream
    torch.cuda.synchronize()
    torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(ptr))


def _touch(flat: torch.Tensor) -> None:
    """Fault every page in, from all intra-op threads (``fill_`` is parallel over the tensor)."""
    flat.fill_(0)


def pinned_empty(
    shape,
    dtype: torch.dtype,
    *,
    register: Callable[[int, int], None] = _cuda_register,
    unregister: Callable[[int], None] = _cuda_unregister,
) -> torch.Tensor:
    """A page-locked CPU tensor of exactly ``shape`` (zero-filled when registered; the
    fallback's contents are undefined). ``register`` / ``unregister`` are the page-locking
    calls (CUDA's by default; tests pass fakes)."""
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0 or os.environ.get("DHS_HOST_ALLOC", "register") == "torch":
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    t0 = time.perf_counter()
    try:
        mm = _RegisteredMap(
            -1,
            nbytes,
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
        if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)  # fewer faults and page mappings where THP allows
        flat = torch.frombuffer(mm, dtype=torch.uint8)
        t_map = time.perf_counter()
        _touch(flat)
        t_touch = time.perf_counter()
        register(flat.data_ptr(), nbytes)
        mm.address, mm.unregister = flat.data_ptr(), unregister
    except Exception as e:  # pragma: no cover - depends on the driver
        # release the touched mapping before the fallback asks for as much again
        flat = mm = None  # noqa: F841
        warnings.warn(
            f"registering {nbytes / 2**30:.1f} GiB of host memory failed ({e}); "
            f"falling back to torch's pinned allocator",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    t_reg = time.perf_counter()
    log.info(
        "host store: %.1f GiB page-locked in %.1f s (map %.1f, touch %.1f, register %.1f)",
        nbytes / 2**30,
        t_reg - t0,
        t_map - t0,
        t_touch - t_map,
        t_reg - t_touch,
    )
    del mm  # the tensor's reference keeps the mapping alive from here
    return flat.view(dtype).view(shape)


def host_empty(shape, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """The host store's allocation: page-locked when a GPU reads it, else plain memory."""
    return pinned_empty(shape, dtype) if pin else torch.empty(tuple(shape), dtype=dtype)
