"""The KV contract every cache policy implements, and the parts all of them share.

A backend owns the device storage of request histories for one engine. Per decode step the model
runner calls, in order:

    begin_step(slots, positions[, widths])  # which requests run, at which query positions
                                        # (B, Q); widths: queries each request verifies
    write_kv / write_index              # the new rows of the step (once per writing layer;
                                        # kv_write_target: the model encodes them in place)
    index_scores(source, iq)            # indexer scores of the visible history (keys on device)
    locate(layer, selections, q0, ...)  # -> resolve(...) -> device locations (gather: the rows)
    end_step()                          # counters, backups that became possible
    commit(slots, num_committed)        # rows up to num_committed are immutable history

Admission (``admit``) imports a prepared prefix (the handoff); ``release`` returns everything.
``memory_report`` gives eq. 3's terms (M_req + M_opt + M_res <= M) and ``check_integrity`` checks
the backend's invariants (no page both free and in use, accounting sums to capacity, ...).

Index keys always stay on the device: they are paged here, for every backend, so a selection can
score the whole logical history wherever the payload lives.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from profiling.ranges import HANDOFF, nvtx_range
from systems.cuda_streams import shared_stream
from systems.host_sync import to_device
from systems.kernels.backup import copy_rows
from systems.kernels.index_scores import index_scores
from systems.kernels.selfcheck import resolve_impl
from systems.models.config import LayerSpec, ModelConfig

GiB = 1 << 30


@dataclass(frozen=True)
class KVOptions:
    """A backend's own knobs (``system.kv``). Backends subclass it next to their ``@register``;
    the resident backend has none. ``resolved`` turns ``auto`` / 0-means-derived values into
    concrete ones; it is called once, by ``systems.engine.config.resolve``."""

    def resolved(self, model: ModelConfig, device: str, max_queries_per_step: int) -> KVOptions:
        return self


@dataclass
class KVConfig:
    """What every backend is sized by (the deployment), plus the backend's own options."""

    backend: str = "resident"
    kv_pool_gib: float = 0.05  # M: capacity of the KV pools (payload + index) on the device
    max_running_requests: int = 64  # request slots (SGLang --max-running-requests)
    max_total_tokens: int = 0  # per request: prompt + output cap; 0 = model.max_context_len
    host_pool_gib: float = 1.0  # host budget for the pinned backing store
    # queries per step: 1, or K_max with speculation (a block is written past the frontier)
    max_queries_per_step: int = 1
    options: KVOptions = field(default_factory=KVOptions)


@dataclass
class PrefixKV:
    """A prompt's history as the prefill side hands it over."""

    num_tokens: int
    kv: torch.Tensor  # (S, T, row_bytes) uint8
    index: dict[int, torch.Tensor]  # index source -> (T, di)


@dataclass
class MemoryReport:
    capacity: int  # M, bytes
    required: int  # M_req
    optional: int = 0  # M_opt
    reserve: int = 0  # M_res
    components: dict[str, int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.capacity - self.required - self.optional - self.reserve


class PagePool:
    """Free list of fixed-size pages; page ids index rows [id*P, (id+1)*P) of a pool tensor."""

    def __init__(self, num_pages: int, name: str):
        self.num_pages = num_pages
        self.name = name
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def alloc(self, n: int) -> list[int]:
        """n pages in ascending id order. Why ascending: a request's adjacent pages then tend to
        be adjacent in the pool, and the host backup moves each run of adjacent pages with one
        DMA. (Handing out the last freed pages in pop order reversed every request's pages
        after the first wave: one DMA per page and source, 6,656 for a 16K-token glm53_mini
        request.)"""
        if n > len(self._free):
            raise MemoryError(f"{self.name}: asked for {n} pages, {len(self._free)} free")
        cut = len(self._free) - n
        out = sorted(self._free[cut:])  # the pages pop() would hand out, without a pop each
        del self._free[cut:]
        self._used.update(out)
        return out

    def alloc_for(self, slot: int, n: int) -> list[int]:
        """n pages for ``slot``'s history (any free ones here)."""
        return self.alloc(n)

    def free(self, pages: list[int]) -> None:
        # set operations, not a loop per page: a 125K-token request frees ~2,000 pages, which
        # took ~1 ms of the engine thread one page at a time (the landing step's host profile)
        given = set(pages)
        if len(given) != len(pages):
            raise AssertionError(f"{self.name}: a page freed twice in one call: {pages}")
        if not given <= self._used:
            p = next(p for p in pages if p not in self._used)
            raise AssertionError(f"{self.name}: page {p} freed twice or never allocated")
        self._used.difference_update(given)
        # pop() then hands them out lowest first, in a run
        self._free.extend(sorted(pages, reverse=True))

    def check(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), f"{self.name}: duplicate page in free list"
        assert not (free & self._used), f"{self.name}: page both free and in use"
        assert len(free) + len(self._used) == self.num_pages, f"{self.name}: pages lost"


class RegionPagePool(PagePool):
    """Pages laid out per slot: slot s's history takes the first pages of its own region
    [s * region, (s + 1) * region), so no free list is kept (taking a region costs its own
    pages, not a pass over every free one: ~41,000 index pages on glm53_h200)."""

    def __init__(self, num_pages: int, name: str, region: int):
        self.num_pages = num_pages
        self.name = name
        self.region = region
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return self.num_pages - len(self._used)

    def alloc(self, n: int) -> list[int]:
        raise TypeError(f"{self.name}: pages belong to slots (alloc_for)")

    def alloc_for(self, slot: int, n: int) -> list[int]:
        if n > self.region:
            raise MemoryError(
                f"{self.name}: asked for {n} pages, a slot's region has {self.region}"
            )
        pages = list(range(slot * self.region, slot * self.region + n))
        if (pages and pages[-1] >= self.num_pages) or not self._used.isdisjoint(pages):
            raise MemoryError(f"{self.name}: slot {slot}'s pages {pages[:4]}... are not all free")
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        if len(set(pages)) != len(pages) or not set(pages) <= self._used:
            raise AssertionError(f"{self.name}: a page freed twice or never taken: {pages[:4]}...")
        self._used.difference_update(pages)

    def check(self) -> None:
        assert all(0 <= p < self.num_pages for p in self._used), f"{self.name}: page out of range"


class KVBackend(ABC):
    """Base class: request slots, the paged index-key store, and the step protocol.

    The padding slot. A CUDA graph is captured for one batch size; a step whose size has no
    graph yet may replay a larger one with padding rows (systems/engine/cuda_graph.py), as
    SGLang pads to its captured batch sizes. A padding row is a query at positions 0 .. Q-1 of
    ``pad_slot``, a slot no request ever holds: its tables point at memory of its own, index
    pages for Q positions and (a hierarchy backend) one payload page outside
    ``kv.kv_pool_gib``, so its writes and its reads touch no request's rows, and it never
    commits. Its outputs are dropped; the counters a backend exports leave its rows out.
    ``pad_slot`` is None for a backend without one (no padding)."""

    name = "base"
    pad_slot: int | None = None

    def __init__(self, model_cfg: ModelConfig, kv_cfg: KVConfig, device: torch.device | str):
        self.mcfg = model_cfg
        self.kcfg = kv_cfg
        self.device = torch.device(device)
        self.P = model_cfg.page_size
        self._page_offsets = torch.arange(self.P, device=self.device)
        self.max_total_tokens = kv_cfg.max_total_tokens or model_cfg.max_context_len
        if self.max_total_tokens > model_cfg.max_context_len:
            raise ValueError(
                f"kv.max_total_tokens={self.max_total_tokens} exceeds "
                f"model.max_context_len={model_cfg.max_context_len}"
            )
        if kv_cfg.max_running_requests < 1:
            raise ValueError("kv.max_running_requests must be >= 1")
        if kv_cfg.kv_pool_gib <= 0:
            raise ValueError(f"kv.kv_pool_gib must be > 0, got {kv_cfg.kv_pool_gib}")
        self.capacity = int(kv_cfg.kv_pool_gib * GiB)
        self.num_slots = kv_cfg.max_running_requests
        self.q_max = int(kv_cfg.max_queries_per_step)
        self.max_pages_per_req = math.ceil((self.max_total_tokens + self.q_max) / self.P)
        self.index_src_ids = {s: i for i, s in enumerate(model_cfg.index_sources)}
        # the indexer's scan follows model.attention_impl (auto: the kernel on a GPU)
        impl = resolve_impl(model_cfg.attention_impl, self.device)
        self.index_impl = "triton" if impl.startswith("triton") else impl
        # row copies (handoff imports, backups, restores): the word-wide kernel on a GPU, where
        # it reads or writes the pinned host store through UVA
        self.copy_impl = "triton" if self.device.type == "cuda" else "reference"
        # the row-copy kernel's blocks per launch for copies on the handoff stream (None: one
        # per row and source); a backend with the option sets it. Whether copies are being
        # queued there now
        self.side_copy_programs: int | None = None
        self._side_copies = False
        self.slot_len = [0] * self.num_slots  # committed positions per slot (host-side)
        self.free_slots = list(range(self.num_slots - 1, -1, -1))
        self.active_slots: set[int] = set()
        self._step: dict[str, Any] | None = None
        # asynchronous handoffs: slot -> the event after its history's copies (handoff stream)
        self.importing: dict[int, Any] = {}
        # host seconds of admit()'s two halves (/metrics: dhs_handoff_phase_seconds_total), the
        # split of the scheduler's "handoff" admission phase: which half holds the engine thread
        self.handoff_seconds = {"reserve": 0.0, "import": 0.0}
        # query blocks a slot may have queued beyond its last commit: 2 when the engine launches
        # a speculative round before committing the previous one (overlap scheduling)
        self.blocks_in_flight = 1

    def set_blocks_in_flight(self, n: int) -> None:
        """Query blocks a slot may have queued beyond its last commit (the engine's overlap
        scheduling decides); a backend that keeps uncommitted rows in a bounded buffer checks
        it can hold them."""
        self.blocks_in_flight = n

    def _set_num_slots(self, n: int) -> None:
        """Lower the slot count before any slot is used (a backend whose pool holds fewer
        sessions than kv.max_running_requests)."""
        if self.active_slots or not 1 <= n <= self.num_slots:
            raise RuntimeError(
                f"slot count can only come down to 1..{self.num_slots} before "
                f"any slot is used, got {n}"
            )
        self.num_slots = n
        self.slot_len = [0] * n
        self.free_slots = list(range(n - 1, -1, -1))

    # ------------------------------------------------------------------ index store (shared)
    def _init_index_pool(self, num_pages: int, storage: torch.Tensor | None = None) -> None:
        """``num_pages`` for the slots' histories, then ``pad_pages`` for the padding slot (see
        ``pad_slot``); ``storage``: zeroed bytes the store lives in (the adaptive backend's
        shared arena, whose unused index history can carry optional KV pages; at least
        ``index_store_bytes(num_pages)``), its own allocation if None. Every backend calls it
        once its slot count is final."""
        nI = len(self.index_src_ids)
        # a store shared with optional history is laid out per slot (adaptive.py lends the
        # regions of free slots)
        self.index_pages = (
            PagePool(num_pages, "index")
            if storage is None
            else RegionPagePool(num_pages, "index", self.max_pages_per_req)
        )
        shape = (nI, (num_pages + self.pad_pages) * self.P, self.mcfg.index_dim)
        if storage is None:
            self.index_pool = torch.zeros(shape, dtype=torch.bfloat16, device=self.device)
        else:
            self.index_pool = storage.view(-1)[: self.index_store_bytes(num_pages)]
            self.index_pool = self.index_pool.view(torch.bfloat16).view(shape)
        # one table row per slot, then the padding slot's: its pages lie past the pool's
        self.pad_slot = self.num_slots
        self.req_to_index_page = torch.full(
            (self.num_slots + 1, self.max_pages_per_req), -1, dtype=torch.int32, device=self.device
        )
        self.req_to_index_page[self.pad_slot, : self.pad_pages] = torch.arange(
            num_pages, num_pages + self.pad_pages, dtype=torch.int32
        )
        self._slot_index_pages: dict[int, list[int]] = {}

    @property
    def pad_pages(self) -> int:
        """Pages of the padding slot: its positions 0 .. Q-1 for Q up to max_queries_per_step."""
        return -(-self.q_max // self.P)

    def index_store_bytes(self, num_pages: int) -> int:
        """Bytes of an index store of ``num_pages`` pages and the padding slot's."""
        return (num_pages + self.pad_pages) * self.index_page_bytes

    @property
    def index_page_bytes(self) -> int:
        return self.P * len(self.index_src_ids) * self.mcfg.index_row_bytes

    def _alloc_index(self, slot: int, num_tokens: int) -> None:
        pages = self.index_pages.alloc_for(slot, math.ceil(num_tokens / self.P))
        self._slot_index_pages[slot] = pages
        self.req_to_index_page[slot, : len(pages)] = to_device(pages, self.device, torch.int32)

    def _free_index(self, slot: int) -> None:
        self.index_pages.free(self._slot_index_pages.pop(slot, []))
        self.req_to_index_page[slot] = -1

    def _token_locs(
        self, table: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Paged lookup: (B,) slots, (B, ...) positions -> locations (-1 where position is -1)."""
        pos = positions.long()
        shp = pos.shape
        flat = pos.reshape(shp[0], -1)
        pages = torch.gather(table[slots.long()], 1, (flat.clamp_min(0) // self.P))
        loc = pages.long() * self.P + flat.clamp_min(0) % self.P
        loc = torch.where(flat < 0, -1, loc)
        return loc.reshape(shp)

    def _history_locs(self, slot: int, T: int) -> torch.Tensor:
        """Locations of positions 0 .. T-1 of ``slot`` in the paged stores: the slot's first
        pages in order, each page's rows expanded on the device from the page table (no
        position arange of the whole history)."""
        pages = self.req_to_index_page[slot, : math.ceil(T / self.P)].long()
        return (pages.unsqueeze(1) * self.P + self._page_offsets).reshape(-1)[:T]

    def _import_index(self, slot: int, prefix: PrefixKV) -> None:
        """The prompt's index keys into the slot's pages, a row-copy launch per index source
        (word-wide: an indexed assignment moves an element per thread, SM time taken from the
        decode steps a handoff runs beside)."""
        T = prefix.num_tokens
        loc = self._history_locs(slot, T)
        rows = torch.arange(T, device=self.device)
        for s, i in self.index_src_ids.items():
            keys = prefix.index[s].to(self.device, torch.bfloat16).contiguous()
            copy_rows(
                keys.unsqueeze(0),
                self.index_pool[i].unsqueeze(0),
                rows,
                loc,
                self.copy_impl,
                self._copy_programs(),
            )

    # ------------------------------------------------------------------ slots
    def _take_slot(self) -> int:
        slot = self.free_slots.pop()
        self.active_slots.add(slot)
        return slot

    def _return_slot(self, slot: int) -> None:
        # every release ends here, before anything reuses the memory it freed: a handoff still
        # copying into that memory must finish first
        done = self.importing.pop(slot, None)
        if done is not None:
            done.synchronize()
        self.active_slots.discard(slot)
        self.slot_len[slot] = 0
        self.free_slots.append(slot)

    # ------------------------------------------------------------------ admission (abstract)
    @abstractmethod
    def can_admit(self, num_prompt_tokens: int, max_new_tokens: int) -> tuple[bool, str]:
        """Whether a request fits now; the reason names what is missing when it does not."""

    @abstractmethod
    def reserve(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool = False) -> int:
        """Take a slot and the memory the request needs and set its tables; the first half
        of a handoff. Runs on the decode stream: it may change other requests' state (the
        adaptive backend reclaims their optional pages here; ``asynchronous``, as ``admit``'s,
        lets it run their backups off the decode stream). Atomic: on failure nothing is held.
        Returns the slot."""

    @abstractmethod
    def import_history(self, slot: int, prefix: PrefixKV) -> None:
        """Copy the prefix's history into the slot's memory; the second half of a handoff,
        the bytes. Writes only memory that ``reserve`` gave this slot, so it may run on a side
        stream while steps of other requests run."""

    def admit(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool = False) -> int:
        """Reserve a slot and import the prefix's history (the handoff). Returns the slot.

        ``asynchronous`` (on a GPU): the import's copies are queued on the handoff stream,
        after everything queued on the decode stream so far, and the call returns at once;
        the slot must not join a step before ``import_done(slot)`` says so (releasing it
        earlier, an abort, waits for its copies). As a disaggregated decode node receives a
        prefill node's KV while it keeps decoding."""
        with nvtx_range(HANDOFF):  # what admission queues, on every stream (docs/profiling.md)
            return self._admit(prefix, max_new_tokens, asynchronous)

    def _admit(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool) -> int:
        t0 = time.perf_counter()
        slot = self.reserve(prefix, max_new_tokens, asynchronous)
        t1 = time.perf_counter()
        self.handoff_seconds["reserve"] += t1 - t0
        stream = self._handoff(asynchronous)
        try:
            self._on_stream(stream, lambda: self.import_history(slot, prefix))
            if stream is not None:
                done = self._copies_done(stream)
                # the prefix's tensors were allocated on the decode stream: keep their memory
                # from being reused there before the copies have read it
                for t in (prefix.kv, *prefix.index.values()):
                    if t.device.type == "cuda":
                        t.record_stream(stream)
                self.importing[slot] = done
        except BaseException:
            if stream is not None:
                stream.synchronize()  # nothing may still write the memory released below
            self.release(slot)
            raise
        finally:
            self.handoff_seconds["import"] += time.perf_counter() - t1
        return slot

    def _on_stream(self, stream, copies) -> None:
        """Queue ``copies()`` on ``stream`` (the handoff stream), after everything queued on
        the decode stream so far; where ``stream`` is None, in order on the current stream."""
        if stream is None:
            copies()
            return
        stream.wait_stream(torch.cuda.current_stream(self.device))
        outer, self._side_copies = self._side_copies, True
        try:
            with torch.cuda.stream(stream):
                copies()
        finally:
            self._side_copies = outer

    def _copies_done(self, stream):
        """What says the copies queued on ``stream`` so far are done: a CUDA event recorded
        there; None where ``stream`` is None (the copies ran in order on the current stream)."""
        if stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def _copy_programs(self) -> int | None:
        """The row-copy grid for copies queued now: bounded on the handoff stream, where the
        copy shares the SMs with the decode steps running beside it."""
        return self.side_copy_programs if self._side_copies else None

    def _handoff(self, asynchronous: bool):
        return self._side_stream("handoff", asynchronous)

    def _side_stream(self, role: str, wanted: bool):
        """The process's ``role`` stream for copies beside the decode steps, where ``wanted``
        and on a GPU, else None (they run in order on the current stream). At the default
        priority whatever the decode stream's: the copies yield to steps."""
        if not wanted or self.device.type != "cuda":
            return None
        return shared_stream(self.device, role, priority=0)

    def import_done(self, slot: int, wait: bool = False) -> bool:
        """Whether the slot's history has arrived (``wait``: block until it has). Once it
        has, the decode stream is ordered after its copies."""
        done = self.importing.get(slot)
        if done is None:
            return True
        if wait:
            done.synchronize()
        elif not done.query():
            return False
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).wait_event(done)
        del self.importing[slot]
        return True

    @abstractmethod
    def release(self, slot: int) -> None:
        """Return everything the request holds. Safe at any point after admit."""

    # ------------------------------------------------------------------ step protocol
    def begin_step(
        self,
        slots: torch.Tensor,
        positions: torch.Tensor,
        max_len: int | None = None,
        widths: torch.Tensor | None = None,
    ) -> None:
        """slots (B,) int, positions (B, Q) int: the positions of this step's queries.

        ``max_len``: how many history positions the index scans (>= max(positions) + 1; the
        caller knows it on the host, which spares a device sync; a captured graph passes its
        bucket). ``widths`` (B,) int on the device, 1..Q: a verification pass where request b
        verifies only its first widths[b] queries (DSpark's K_r); None: every query counts.
        Equivalent to ``host_prepare()`` followed by ``device_prepare(...)``.
        """
        self.host_prepare()
        self.device_prepare(slots, positions, max_len, widths)

    def host_prepare(self) -> None:
        """Hook, eager part of a step's preparation: host-side bookkeeping that must run before
        every step, captured or not (the adaptive backend publishes finished populations)."""

    def device_prepare(
        self,
        slots: torch.Tensor,
        positions: torch.Tensor,
        max_len: int | None = None,
        widths: torch.Tensor | None = None,
    ) -> None:
        """Device part of a step's preparation: only device work on (slots, positions) and
        persistent device state, no host sync, so a CUDA graph can capture it with the
        forward (systems/engine/cuda_graph.py)."""
        if max_len is None:
            max_len = int(positions.max().item()) + 1 if positions.numel() else 0
        self._step = {"slots": slots, "positions": positions, "L": max_len}
        if widths is not None:
            q = torch.arange(positions.shape[1], device=positions.device)
            self._step["verified"] = q.unsqueeze(0) < widths.to(positions.device).unsqueeze(1)
        self._prepare_step()

    def verified_queries(self) -> torch.Tensor | None:
        """(B, Q) bool: the step's queries whose selections count (a request's first K_r);
        None when every query does."""
        return self._step.get("verified")

    def _prepare_step(self) -> None:
        """Hook: the step's tables (write locations, tails), device-only. Here: where each
        query's index key goes; a backend adds its own, or computes them all at once."""
        st = self._step
        st["index_write_loc"] = self._token_locs(
            self.req_to_index_page, st["slots"], st["positions"]
        )

    def finish_forward(self) -> None:
        """Hook, the device-side end of a step (joins side streams); part of a captured graph.
        ``end_step`` calls it too, so an eager step needs nothing else."""

    @property
    def graph_capturable(self) -> bool:
        """Whether ``device_prepare`` + forward + ``finish_forward`` may be captured."""
        return True

    @property
    def max_scan_len(self) -> int:
        """Largest history an index scan may cover (the last page of a request's table)."""
        return self.max_pages_per_req * self.P

    def write_index(self, source: int, keys: torch.Tensor) -> None:
        loc = self._step["index_write_loc"]
        self.index_pool[self.index_src_ids[source]][loc.reshape(-1)] = keys.reshape(
            -1, keys.shape[-1]
        ).to(torch.bfloat16)

    def index_scores(self, source: int, iq: torch.Tensor) -> torch.Tensor:
        """(B, Qc, L) float32 scores of every visible position over the paged index store:
        the Triton kernel reads keys in place, the reference gathers them first."""
        st = self._step
        return index_scores(
            iq,
            self.index_pool[self.index_src_ids[source]],
            self.req_to_index_page,
            st["slots"],
            st["L"],
            self.P,
            impl=self.index_impl,
        )

    @abstractmethod
    def write_kv(self, source: int, rows: torch.Tensor) -> None: ...

    def kv_write_target(self, source: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the step's new rows of ``source`` go (KVContext.kv_write_target); None: the
        backend takes them through ``write_kv``."""
        return None

    @abstractmethod
    def resolve(self, layer: LayerSpec, selections: torch.Tensor, q0: int) -> torch.Tensor:
        """(B, Qc, k) positions -> (B, Qc, k) integer locations (int32 or int64) into
        ``kv_buffer(source)``."""

    @abstractmethod
    def kv_buffer(self, source: int) -> torch.Tensor:
        """(num_locations, row_bytes) uint8 device storage that locations index."""

    def locate(
        self, layer: LayerSpec, selections: torch.Tensor, q0: int, inherit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(buffer, locations): where the selected rows are; attention reads them in place."""
        cache = self._step.setdefault("loc", {})
        key = (layer.source, q0)
        if inherit and key in cache:
            loc = cache[key]  # Reuse layer: same source, same selection -> same locations
        else:
            loc = self.resolve(layer, selections, q0)
            cache[key] = loc
        return self.kv_buffer(layer.source), loc

    def gather(
        self, layer: LayerSpec, selections: torch.Tensor, q0: int, inherit: bool
    ) -> torch.Tensor:
        buf, loc = self.locate(layer, selections, q0, inherit)
        return buf[loc.clamp_min(0)]

    def end_step(self) -> None:
        self.finish_forward()
        self._step = None

    def commit(self, slots: list[int], lengths: list[int]) -> None:
        """Rows of positions < lengths[i] are committed history of slots[i]."""
        for s, n in zip(slots, lengths):
            self.slot_len[s] = n

    # ------------------------------------------------------------------ reporting
    @abstractmethod
    def memory_report(self) -> MemoryReport: ...

    def check_integrity(self) -> None:
        rep = self.memory_report()
        assert rep.required >= 0 and rep.optional >= 0 and rep.reserve >= 0
        assert rep.required + rep.optional + rep.reserve <= rep.capacity, f"eq. 3 violated: {rep}"
        assert len(self.free_slots) + len(self.active_slots) == self.num_slots
        assert not (set(self.free_slots) & self.active_slots)
        self.index_pages.check()

    def snapshot_counters(self) -> bool:
        """Queue a host copy of the device-side counters, which ``metrics(sync=False)``
        reports (the engine thread calls it between steps); False when none was queued (none
        here)."""
        return False

    def metrics(self, sync: bool = True) -> dict[str, float]:
        """The backend's counters and gauges. ``sync=False`` (the HTTP server's /metrics,
        on the event loop) must not wait for the device: device-side counters come from the
        last ``snapshot_counters`` copy that has landed."""
        rep = self.memory_report()
        return {
            "dhs_kv_pool_capacity_bytes": rep.capacity,
            "dhs_kv_pool_required_bytes": rep.required,
            "dhs_kv_pool_optional_bytes": rep.optional,
            "dhs_kv_pool_used_ratio": (rep.required + rep.optional) / max(1, rep.capacity),
            "dhs_num_allocated_slots": len(self.active_slots),
            "dhs_num_slots": self.num_slots,
            **{
                f'dhs_handoff_phase_seconds_total{{phase="{k}"}}': v
                for k, v in dict(self.handoff_seconds).items()  # (another thread: a copy)
            },
        }

    @property
    def is_empty(self) -> bool:
        return not self.active_slots
