"""The guard of a captured region: no op may read device data on the host there.

A CUDA graph capture fails (or bakes a stale value) when captured work syncs with the host. On a
machine without CUDA the engine's emulated capture runs the step under ``no_host_sync``, which
raises on such ops; code that syncs on purpose (the CPU reference resolver) says so with
``allow_host_sync``. It lives below both the engine and the KV backends, which use it.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read device data on the host (or build tensors from host data): illegal while a
# stream is capturing. ``allow_host_sync`` lets the CPU reference resolver use them knowingly.
_SYNC_OPS = {
    "aten._local_scalar_dense",
    "aten.nonzero",
    "aten.lift_fresh",
    "aten.item",
    "aten.equal",
    "aten.is_nonzero",
    "aten.masked_select",
    "aten.unique_consecutive",
    "aten._unique2",
    "aten.repeat_interleave",
}
_allow_depth = 0


@contextlib.contextmanager
def allow_host_sync():
    """Code that syncs on purpose (the CPU reference resolver) inside an emulated capture."""
    global _allow_depth
    _allow_depth += 1
    try:
        yield
    finally:
        _allow_depth -= 1


class HostSyncInCapture(RuntimeError):
    """A captured region read device data on the host; a real capture would fail or bake it."""


class no_host_sync(TorchDispatchMode):
    """Raise on any op in ``_SYNC_OPS`` (outside ``allow_host_sync``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _allow_depth == 0 and str(func.overloadpacket) in _SYNC_OPS:
            raise HostSyncInCapture(f"{func} inside a captured step")
        return func(*args, **(kwargs or {}))


def to_device(values, device, dtype=None):
    """Host values (a list of numbers, or a CPU tensor) on ``device`` without waiting for the
    device.

    ``torch.tensor(values, device=cuda)`` copies from pageable memory, which waits for
    everything queued on the stream: under overlap scheduling that is the step in flight, and
    one such call per step serializes the host with the GPU again (docs/engine.md). A pinned
    buffer's copy is queued instead; the caching host allocator keeps the buffer until the copy
    has run."""
    t = values.to(dtype) if torch.is_tensor(values) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


class CounterSnapshot:
    """Device counters read on the host without waiting for the device. ``take`` (the engine
    thread, between steps) queues a copy of the counters into a fresh pinned buffer and records
    an event; ``latest`` (any thread: the HTTP server's /metrics) returns the newest copy whose
    event has completed, ``initial`` (the counters' starting values) before the first. A fresh
    buffer per copy: a reader never sees one being written; a lock, so that the newest landed
    copy only moves forward. On a CPU device there is nothing to wait for: ``latest`` is None
    and the caller reads the counters themselves."""

    def __init__(self, device, initial: torch.Tensor):
        self.on = torch.device(device).type == "cuda"
        self._lock = threading.Lock()
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self._done: torch.Tensor | None = initial.cpu() if self.on else None

    def take(self, counters) -> bool:
        """Queue a copy of ``counters()`` (a callable: nothing is built when no copy is
        queued); False when the previous copy has not landed yet (one at a time) or there is no
        device to wait for."""
        if not self.on:
            return False
        with self._lock:
            self._retire()
            if self._pending is not None:
                return False  # the previous copy is still queued behind a step
            counters = counters()
            host = torch.empty(counters.shape, dtype=counters.dtype, pin_memory=True)
            host.copy_(counters, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._pending = (host, ev)
            return True

    def latest(self) -> torch.Tensor | None:
        with self._lock:
            self._retire()
            return self._done

    def _retire(self) -> None:
        if self._pending is not None and self._pending[1].query():
            self._done, self._pending = self._pending[0], None


class UniformValues:
    """Per-step host values on the device, where a batch whose values are all one (every
    request's temperature, a round's verification width) reuses a cached tensor of that value:
    no pinned copy per step. The tensors are only read by kernels (never written), so reusing
    one while a step that reads it is in flight is safe. Mixed values go through ``to_device``."""

    MAX_ENTRIES = 512  # batch sizes x values: bounded in practice; cleared past it

    def __init__(self, device, dtype):
        self.device, self.dtype = device, dtype
        self._cache: dict = {}

    def __call__(self, values) -> torch.Tensor:
        vals = list(values)
        if vals and all(v == vals[0] for v in vals):
            key = (len(vals), vals[0])
            t = self._cache.get(key)
            if t is None:
                if len(self._cache) >= self.MAX_ENTRIES:
                    self._cache.clear()
                t = torch.full((len(vals),), vals[0], dtype=self.dtype, device=self.device)
                self._cache[key] = t
            return t
        return to_device(vals, self.device, self.dtype)


# (pinned host tensor, event) of readbacks whose kernel may still be storing: held here so the
# caching host allocator cannot hand the memory out again before the kernel is done, even when
# the reader drops its step unread (a failed round). The allocator only tracks uses by copies.
_pending_readbacks: list = []


def start_readback(t):
    """Queue ``t``'s copy to the host without waiting: returns (host tensor, CUDA event recorded
    after the copy, or None on CPU where the copy is already done). On a GPU the copy is a kernel
    storing into pinned memory (systems/kernels/readback.py): an asynchronous memcpy would queue
    behind a handoff's history backup on the device-to-host copy engine. Without Triton it is
    that memcpy."""
    if t.device.type != "cuda":
        return t.clone(), None
    from systems.kernels.readback import readback, readback_available

    src = t.contiguous()
    host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    readback(src.view(-1), host.view(-1), impl="triton" if readback_available() else "reference")
    done = torch.cuda.Event()
    done.record()
    _pending_readbacks[:] = [(h, e) for h, e in _pending_readbacks if not e.query()]
    _pending_readbacks.append((host, done))
    return host, done
