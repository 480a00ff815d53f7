"""Named profiler ranges of the engine, and the context manager that opens them.

``nvtx_range(name)`` opens one range that both profilers see:

* ``torch.profiler.record_function(name)`` -- torch.profiler (the ``kernels`` collector) records
  it as a ``user_annotation``; every kernel whose launch happens inside it inherits the range's
  family in ``profiling.kernel_timeline``;
* ``torch.cuda.nvtx.range_push/pop`` on CUDA -- Nsight Systems / Nsight Compute see it.

Ranges cost nothing that matters when no profiler wants them: ``nvtx_range`` checks one module
flag and returns a shared no-op context manager (measured by ``range_overhead_ns``: about as
cheap as entering ``contextlib.nullcontext``). The flag is switched on by the collectors that
read ranges (``maybe_profile`` with ``kernels`` or ``nsight``), by ``enable_ranges(True)``, or by
the environment variable ``DHS_NVTX=1`` for an external ``nsys``/``ncu`` run of the whole
server.

Range names (constants below) are the contract between the engine, which opens them, and the
classifier, which maps them to kernel families (``RANGE_FAMILY``). Where the engine should open
them is listed in docs/profiling.md.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

# ------------------------------------------------------------------ range names
PREFIX = "dhs::"
STEP = "dhs::step"  # one decode step / verification round (window)
RESOLVER = "dhs::resolver"  # the fused resolver of a selecting layer
FOLLOWER_PREFETCH = "dhs::follower_prefetch"  # GLM-like: resolves/copies of follower layers
BACKUP = "dhs::backup"  # tail -> host backup, backup before reclaim
POPULATE = "dhs::populate"  # host -> optional device pages (population)
BOOKKEEPING = "dhs::bookkeeping"  # page tables, direct table, slot state
HANDOFF = "dhs::handoff"  # admission: import of a prepared prefix
MLP = "dhs::mlp"  # expert / MLP matrix products
PROJ = "dhs::proj"  # dense projections (q, kv, o, index keys)
SELECT = "dhs::select"  # indexer: scores + top-k
ATTEND = "dhs::attend"  # sparse attention over gathered rows

# ------------------------------------------------------------------ families
RESOLVER_FAMILY = "resolver"
FOLLOWER_COPY = "follower_copy"
HOST_BACKUP = "host_backup"
PAGE_BOOKKEEPING = "page_bookkeeping"
HANDOFF_FAMILY = "handoff"
EXPERT_MLP = "expert_mlp_matmul"
DENSE_PROJ = "dense_projection"
INDEXING_ATTENTION = "indexing_attention"
OTHER_MODEL = "other_model"

CACHE_FAMILIES: tuple[str, ...] = (
    RESOLVER_FAMILY,
    FOLLOWER_COPY,
    HOST_BACKUP,
    PAGE_BOOKKEEPING,
    HANDOFF_FAMILY,
)
MODEL_FAMILIES: tuple[str, ...] = (EXPERT_MLP, DENSE_PROJ, INDEXING_ATTENTION, OTHER_MODEL)
FAMILIES: tuple[str, ...] = CACHE_FAMILIES + MODEL_FAMILIES

# A kernel launched inside one of these ranges belongs to the family. Population is the
# residency machinery's other host transfer: it is counted with the host backups.
RANGE_FAMILY: dict[str, str] = {
    RESOLVER: RESOLVER_FAMILY,
    FOLLOWER_PREFETCH: FOLLOWER_COPY,
    BACKUP: HOST_BACKUP,
    POPULATE: HOST_BACKUP,
    BOOKKEEPING: PAGE_BOOKKEEPING,
    HANDOFF: HANDOFF_FAMILY,
    MLP: EXPERT_MLP,
    PROJ: DENSE_PROJ,
    SELECT: INDEXING_ATTENTION,
    ATTEND: INDEXING_ATTENTION,
}

# When ranges nest, the innermost one decides, except that a range of higher priority wins over
# anything inside it: a follower layer's transfer calls the resolver, and the paper counts it as
# a follower-layer copy (Fig. 10a), not as a resolver call.
RANGE_PRIORITY: dict[str, int] = {FOLLOWER_PREFETCH: 1, HANDOFF: 1}

# ------------------------------------------------------------------ switch
_enabled: bool = os.environ.get("DHS_NVTX", "0") not in ("", "0")
_NULL = contextlib.nullcontext()


def ranges_enabled() -> bool:
    return _enabled


def enable_ranges(on: bool = True) -> bool:
    """Switch range emission on or off; returns the previous state."""
    global _enabled
    prev, _enabled = _enabled, bool(on)
    return prev


class _Range:
    __slots__ = ("name", "_rf", "_nvtx")

    def __init__(self, name: str):
        self.name = name
        self._rf = None
        self._nvtx = False

    def __enter__(self):
        if torch.cuda.is_initialized():  # cheap flag check; true only where CUDA is in use
            torch.cuda.nvtx.range_push(self.name)
            self._nvtx = True
        self._rf = torch.profiler.record_function(self.name)
        self._rf.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self._rf.__exit__(*exc)
        finally:
            if self._nvtx:
                torch.cuda.nvtx.range_pop()
        return False


def nvtx_range(name: str) -> contextlib.AbstractContextManager:
    """A profiler range named ``name`` (use the constants above); a shared no-op when ranges are
    off. Safe inside CUDA-graph capture: record_function and NVTX issue no device work."""
    if not _enabled:
        return _NULL
    return _Range(name)


def range_overhead_ns(n: int = 20000, enabled: bool | None = None) -> float:
    """Mean cost of one ``with nvtx_range(...)`` block in nanoseconds (no profiler running)."""
    prev = enable_ranges(enabled) if enabled is not None else _enabled
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with nvtx_range(RESOLVER):
                pass
        return (time.perf_counter_ns() - t0) / n
    finally:
        if enabled is not None:
            enable_ranges(prev)
