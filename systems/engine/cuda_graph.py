"""CUDA graphs for the target forward of a step (SGLang's CudaGraphRunner, vLLM's cudagraphs).

Why: the eager step of the mini presets is bound by Python and kernel launches (about 40 ms for
26 layers on the H200 against a byte floor under 1 ms; docs/design.md). A graph replays the
whole device side of a step with one launch: the KV backend's device preparation, every layer,
the resolver launches and the follower prefetch on its side stream.

What one graph holds, per key (batch size, queries per request, scan-length bucket):

    backend.device_prepare(slots, positions, L); model(tokens, positions, backend);
    backend.finish_forward()

Everything a step does on the host stays outside: ``backend.host_prepare()`` before the replay;
sampling, ``end_step`` and ``commit`` (host backups, population) after. Inputs are copied into
the graph's static buffers; the outputs (logits, hidden) are static buffers, valid until the next
replay. The backend keeps everything a replay must see change -- tail starts, the LRU clock,
counters, direct tables -- in persistent device tensors updated in place.

Graphs are captured lazily at a key's ``capture_after``-th use: that step runs eagerly on the
capture stream (which also compiles kernels and warms cuBLAS), then the capture records the same
work without executing it, so nothing runs twice. The least recently used graph is dropped
beyond ``max_graphs``; all graphs share one memory pool (they replay one at a time).

Padding. A step whose batch size has no graph (yet) replays the smallest captured larger one,
with padding rows on the backend's padding slot (``KVBackend.pad_slot``: memory of its own, so
its rows touch no request's), as SGLang pads a batch to its captured sizes; the outputs keep
the real rows. Why: a closed-loop run meets each batch size of its ramp-up and drain a few times
only, and an eager step costs ten or more replays (results/cuda_graph/check-async-h200.json),
while a padding row adds at most a row's share of a step. A size off the ladder never gets a
graph of its own, as in SGLang: in a served closed loop the batch wanders over the sizes below
its load, and capturing each recurring one (an eager step plus the recording, ~100 ms on
glm53_h200) took 7 % of Adaptive DHiSparse's engine time inside fig4_h200's measured window,
where its ~3 padding rows cost an estimated 2-3 % of a round (the batch-32 step's per-row cost).
Padding never goes past the next size of a ladder (``engine.cuda_graph_bs``; by default SGLang's
1, 2, 4, 8, then every 8): a padding row scans, selects and resolves like a real one. Where no
larger graph exists, a size off the ladder runs as the ladder's next size, so a batch that ramps
up captures the ladder's sizes rather than every size it passes. Kernels are batch invariant, so
padding rows leave the real rows' tokens bit for bit.

Scan length: the indexer scores ``L`` history positions and a graph fixes ``L``, so the captured
length is the step's need rounded up to ``l_step`` (capped at the page table's reach). Positions
past a request's history are masked before the top-k, so the selections are those of an exact
scan. The eager path uses the same bucket whenever graphs are on, so a replay reproduces the
eager step bit for bit (checked on the GPU by benchmarks/check_cuda_graph.py).

On a machine without CUDA, ``emulate=True`` exercises the same protocol (static buffers, host /
device split, buckets) without capture, and checks that the captured region never syncs with the
host (``no_host_sync``); the CPU tests run the golden tokens through it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from systems.cuda_streams import shared_stream
from systems.host_sync import no_host_sync

log = logging.getLogger("dhs.cuda_graph")


def ladder(batch_sizes) -> list[int]:
    """``engine.cuda_graph_bs`` checked: its sizes, ascending, without repeats."""
    if isinstance(batch_sizes, str | int) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in batch_sizes
    ):
        raise ValueError(
            f"engine.cuda_graph_bs: a list of batch sizes >= 1 (or null), got {batch_sizes!r}"
        )
    return sorted(set(batch_sizes))


@dataclass
class _Graph:
    inputs: tuple[torch.Tensor, ...]  # static input buffers
    outputs: tuple[torch.Tensor, ...] = ()  # static outputs
    graph: object = None  # torch.cuda.CUDAGraph, None when emulated


class GraphCache:
    """Graphs of one region function, keyed by shape, captured lazily, LRU-bounded.

    ``run(key, fn, *inputs)`` returns ``fn(*inputs)``. A key met fewer than ``capture_after``
    times runs ``fn`` eagerly; at its ``capture_after``-th use ``fn`` runs eagerly on the capture
    stream (its result is returned; kernels compile, workspaces grow), then the same work is
    captured without executing; later calls copy ``inputs`` into the static buffers and replay.
    Why not capture at first sight: a capture costs an eager step plus the recording (about
    140 ms for the 26-layer preset at batch 128 on the H200, against 22 ms for a replay), and a
    closed-loop run meets most batch sizes only in passing, while the batch ramps up and drains:
    in the Fig. 4 runs at C128, capturing every size on first sight took 69-71% of the engine's
    time. Sizes that recur (the steady state) are captured on their ``capture_after``-th use;
    with a ladder (``batch_sizes``), only its sizes are (``padded_key``).
    ``fn`` returns a tuple of tensors, valid until this cache's next ``run`` (another cache has
    its own memory pool, so its replays never touch them).
    A failed capture logs a warning and sets ``broken``; callers then run eagerly.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        max_graphs: int = 64,
        emulate: bool = False,
        name: str = "graph",
        capture_after: int = 1,
        batch_sizes: tuple[int, ...] = (),
    ):
        self.device = device
        self.batch_sizes = ladder(batch_sizes)  # padding's bound (padded_key)
        self.max_graphs = int(max_graphs)
        if int(capture_after) < 1:
            raise ValueError(f"capture_after must be >= 1, got {capture_after}")
        self.capture_after = int(capture_after)
        self._seen: OrderedDict[tuple, int] = OrderedDict()  # uncaptured keys -> uses so far
        self.emulate = emulate
        self.name = name
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.stats = {
            "captures": 0,
            "replays": 0,
            "padded_replays": 0,  # replays of a larger key (padding rows; CudaGraphRunner)
            "evictions": 0,
            "eager_steps": 0,
        }
        self._pool = None if emulate else torch.cuda.graph_pool_handle()
        # captures run at the engine's stream priority (engine.decode_stream_priority): a
        # capturing step's eager run then stays ahead of the handoff copies as a replay does
        self._stream = None if emulate else shared_stream(device, "graph_capture")
        self.broken = False  # a capture failed: every later step runs eagerly

    def padded_key(self, key: tuple, at: int = 0) -> tuple | None:
        """The larger key a step of ``key`` (its batch size ``b`` at ``key[at]``) runs under
        with padding rows, or None to run ``key`` itself (it has a graph, or ``b`` is on the
        ladder ``batch_sizes`` or past it). Padding never goes past the ladder's next size up:
        every padding row scans, selects and resolves like a real one, so a much larger graph
        could cost more than an eager step. Within that bound, the smallest captured larger
        batch with the rest of the key equal is replayed; else the ladder's next size runs,
        which ``run`` captures at its own ``capture_after``-th use: a batch that ramps up
        captures the ladder's sizes, not each size it passes. A padded step's own size off the
        ladder is never captured (SGLang's cuda_graph_bs)."""
        if key in self.graphs or self.broken:
            return None
        b, rest = key[at], key[:at] + key[at + 1 :]
        up = next((s for s in self.batch_sizes if s >= b), b)
        if up == b:
            return None
        larger = [k for k in self.graphs if k[:at] + k[at + 1 :] == rest and b < k[at] <= up]
        if not larger:
            return key[:at] + (up,) + key[at + 1 :]
        self.stats["padded_replays"] += 1
        return min(larger, key=lambda k: k[at])

    def run_padded(self, key: tuple, at: int, fn, inputs, pads) -> tuple[torch.Tensor, ...]:
        """``run`` for inputs and outputs whose first dimension is the batch (``key[at]``):
        where ``padded_key`` names a larger graph, the inputs get ``pads[i](n)``'s n rows each
        and the outputs keep the real rows. ``pads`` None: no padding (exact sizes only)."""
        padded = None if pads is None else self.padded_key(key, at)
        if padded is None:
            return self.run(key, fn, *inputs)
        B, n = key[at], padded[at] - key[at]
        inputs = [torch.cat([x, pad(n)]) for x, pad in zip(inputs, pads, strict=True)]
        return tuple(o[:B] for o in self.run(padded, fn, *inputs))

    def _count(self, key: tuple) -> None:
        self._seen[key] = self._seen.pop(key, 0) + 1
        while len(self._seen) > 4 * self.max_graphs:  # forget the rarest recent keys
            self._seen.popitem(last=False)

    def run(self, key: tuple, fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        g = self.graphs.get(key)
        if g is None:
            if self._seen.get(key, 0) + 1 >= self.capture_after:
                self._seen.pop(key, None)
                t0 = time.perf_counter()
                out = self._capture(key, fn, inputs)
                # a capture while serving is an eager step plus the recording inside someone's
                # TPOT: the server log names each, so a run says which keys its warm-up missed
                log.info(
                    "%s graph %s captured on its use %d (%.0f ms of host time; %d graphs, "
                    "%d evicted so far)",
                    self.name,
                    key,
                    self.capture_after,
                    1e3 * (time.perf_counter() - t0),
                    len(self.graphs),
                    self.stats["evictions"],
                )
                return out
            self._count(key)
            self.stats["eager_steps"] += 1
            with no_host_sync() if self.emulate else contextlib.nullcontext():
                return tuple(fn(*inputs))
        self.graphs.move_to_end(key)
        for buf, x in zip(g.inputs, inputs):
            buf.copy_(x)
        if g.graph is None:  # emulated replay: the captured region, run again on static inputs
            with no_host_sync():
                g.outputs = tuple(fn(*g.inputs))
        else:
            g.graph.replay()
        self.stats["replays"] += 1
        return g.outputs

    def capture(self, key: tuple, fn, *inputs: torch.Tensor) -> bool:
        """Capture ``key`` now (a start-up warm-up), running ``fn`` once on ``inputs``; False
        when it already has a graph, the cache is broken, or the capture failed. Warm-up graphs
        come on top of ``max_graphs``, which bounds the graphs captured while serving: a
        drafter's warm-up (proposal and catch-up at every ladder size: 70 keys for 249 slots)
        cut at the bound left out its largest sizes, the steady state's, which were then
        captured inside the measured window and evicted the smallest, recaptured as the batch
        drained."""
        if key in self.graphs or self.broken:
            return False
        self._seen.pop(key, None)
        self.max_graphs += 1
        self._capture(key, fn, inputs)
        return key in self.graphs

    def _capture(self, key, fn, inputs):
        dev = self.device
        g = _Graph(inputs=tuple(x.to(dev).clone() for x in inputs))
        if self.emulate:
            with no_host_sync():
                out = tuple(fn(*g.inputs))
            g.outputs = out
        else:
            cur = torch.cuda.current_stream(dev)
            self._stream.wait_stream(cur)
            with torch.cuda.stream(self._stream):
                # this call's result, eagerly; copied out before the capture reuses the pool
                out = tuple(t.clone() for t in fn(*g.inputs))
            cur.wait_stream(self._stream)
            for t in out:
                t.record_stream(cur)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(
                    graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
                ):
                    g.outputs = tuple(fn(*g.inputs))
            except Exception as e:  # never lose the step: its eager result is in hand
                # with the traceback: the op that raises is often later than the one that
                # invalidated the capture, and the frames narrow it down
                log.warning(
                    "CUDA graph capture of %s %s failed (%s: %s); running eagerly from "
                    "now on (engine.disable_cuda_graph=true silences this)",
                    self.name,
                    key,
                    type(e).__name__,
                    e,
                    exc_info=True,
                )
                self.broken = True
                return out
            g.graph = graph
        self.graphs[key] = g
        self.stats["captures"] += 1
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
            self.stats["evictions"] += 1
        return out


class CudaGraphRunner:
    """The target forward of a step through a ``GraphCache`` keyed by (batch, queries, scan
    bucket); ``drafter`` is a second cache (own pool) for the speculative decoder's drafter."""

    def __init__(
        self,
        model,
        backend,
        device: torch.device,
        *,
        max_bs: int = 256,
        batch_sizes: tuple[int, ...] | None = None,
        l_step: int = 2048,
        max_graphs: int = 64,
        emulate: bool = False,
        capture_after: int = 1,
    ):
        self.model = model
        self.backend = backend
        self.device = device
        self.max_bs = int(max_bs)
        self.l_step = max(int(l_step), backend.P)
        self.emulate = emulate
        if batch_sizes is None:  # SGLang's default ladder, in steps of 8 past 8
            batch_sizes = (1, 2, 4, 8, *range(16, self.max_bs + 1, 8))
        # A step never has more rows than the backend has slots, so the ladder ends there: a
        # padded replay or a warm-up capture past it would make the backend's per-row scratch
        # (sized by its slots, its address held by every graph captured before) grow, leaving
        # those graphs on freed memory.
        top = min(self.max_bs, backend.num_slots)
        sizes = ladder(batch_sizes)
        capped = [b for b in sizes if b < top] + ([top] if sizes and sizes[-1] >= top else [])
        kw = dict(
            max_graphs=max_graphs,
            emulate=emulate,
            capture_after=capture_after,
            batch_sizes=capped,
        )
        self.cache = GraphCache(device, name="target", **kw)
        self.drafter = GraphCache(device, name="drafter", **kw)
        self.stats = self.cache.stats
        self._pad_positions = torch.arange(backend.q_max, device=device)

    @property
    def graphs(self):
        return self.cache.graphs

    @property
    def broken(self) -> bool:
        return self.cache.broken

    # ------------------------------------------------------------------ keys
    def scan_len(self, need: int) -> int:
        """The bucketed scan length for a step whose largest query position is need - 1."""
        cap = self.backend.max_scan_len
        return min(cap, -(-need // self.l_step) * self.l_step)

    def can_run(self, bs: int) -> bool:
        return 0 < bs <= self.max_bs and self.backend.graph_capturable and not self.broken

    # ------------------------------------------------------------------ run
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        max_len: int,
        widths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step's target forward. ``backend.host_prepare()`` must have run. Returns
        (logits, hidden), static until the next call. ``widths``: each request's verified
        queries (``KVBackend.begin_step``), an input of graphs of their own."""
        B, Q = tokens.shape
        L = self.scan_len(max_len)
        inputs = (tokens.long(), positions.long(), slots.long())
        key = (B, Q, L)
        if widths is not None:
            inputs += (widths.long(),)
            key += ("widths",)
        pads = self.pad_rows(Q, widths is not None)
        return self.cache.run_padded(key, 0, self._region(L), inputs, pads)

    def _region(self, L: int):
        be = self.backend

        def region(tok, pos, sl, *widths):
            be.device_prepare(sl, pos, L, *widths)
            out = self.model(tok, pos, be)
            be.finish_forward()
            return out

        return region

    def ladder_up_to(self, bs: int) -> list[int]:
        """The ladder's sizes a batch of at most ``bs`` requests can run as: those below
        ``bs`` and the first at or above it (capped by ``max_bs``)."""
        sizes = self.cache.batch_sizes
        top = next((s for s in sizes if s >= bs), sizes[-1] if sizes else 0)
        return [s for s in sizes if s <= top]

    def warm_up(
        self, batch_sizes, queries: int, max_lens: tuple[int, int], widths: bool = False
    ) -> int:
        """Capture the target graphs of ``batch_sizes`` at ``queries`` queries per request for
        every scan bucket a step of ``max_lens`` (lowest, highest need) meets, with padding rows
        only, before any request arrives, as SGLang captures its batch sizes at start-up: a
        closed-loop run then replays its ramp-up and drain sizes from its first step instead of
        capturing them inside the measured window (each capture is an eager step plus the
        recording). ``widths``: the graphs of passes that name each request's verified
        queries (``forward``'s). Returns the graphs captured."""
        be = self.backend
        if be.pad_slot is None or not be.graph_capturable or self.broken:
            return 0
        lo, hi = max_lens
        buckets = sorted({self.scan_len(x) for x in [*range(lo, hi, self.l_step), hi]})
        tag = ("widths",) if widths else ()
        keys = [(b, queries, L, *tag) for L in buckets for b in batch_sizes if self.can_run(b)]
        pads = self.pad_rows(queries, widths)
        n = 0
        for key in keys:
            b, _, L = key[:3]
            inputs = tuple(make(b).contiguous() for make in pads)
            be.host_prepare()
            try:
                n += self.cache.capture(key, self._region(L), *inputs)
            finally:
                be.end_step()
        return n

    def pad_rows(self, Q: int, widths: bool = False):
        """Makers of n padding rows of (tokens, positions, slots[, widths]) with Q queries
        each: token 0 at positions 0 .. Q-1 of the backend's padding slot, every query verified
        (None without a padding slot)."""
        dev, pad = self.device, self.backend.pad_slot
        if pad is None:
            return None
        makers = (
            lambda n: torch.zeros(n, Q, dtype=torch.long, device=dev),
            lambda n: self._pad_positions[:Q].expand(n, Q),
            lambda n: torch.full((n,), pad, dtype=torch.long, device=dev),
        )
        if widths:
            makers += (lambda n: torch.full((n,), Q, dtype=torch.long, device=dev),)
        return makers
