"""HiSparse backend: complete history in pinned host memory, a bounded hot cache per request and
KV source, a tail for new rows, and the fused resolver (paper sec. 2.2, Fig. 2 callouts 2-3).

Device payload pool, per KV source, in pages of G = B + T rows (the same page id in every
source, like the resident backend):

    page h of a request:  [ h*G, h*G + B )       hot cache slots 0..B-1 (LRU, per source)
                          [ h*G + B, (h+1)*G )   tail ring: position p at h*G + B + p % T

Positions >= tail_start are in the tail (not yet backed up); the rest have a complete host copy
(the invariant of sec. 3.1: a row not ready on the GPU has host backing). When the tail could
not take another verification block, its committed rows are copied to host and tail_start moves.
Host pages are G rows too, so one page size serves the resolver's host and direct page tables.

Admission (the handoff) writes the prefix's history to the host store, as HiSparse's baseline
does on arrival; the hot cache starts empty. Index keys stay on the device for the whole history
(base class). GLM-like geometry: when a ``full`` layer has selected, the resolves of its follower
layers (same positions, their own bytes) start at once on a side stream and the follower waits
on an event before its attention (layer-wise prefetch). DeepSeek-like geometry: one cache state
per shared source; ``reuse`` layers inherit the location vector (base class), ``reindex`` layers
resolve a fresh top-k against the same state.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from profiling.ranges import BACKUP, BOOKKEEPING, FOLLOWER_PREFETCH, RESOLVER, nvtx_range
from systems.cuda_streams import shared_stream
from systems.host_copy import copy_blocks_to_host
from systems.host_sync import CounterSnapshot, allow_host_sync, to_device
from systems.kernels.backup import backup_rows
from systems.kernels.resolver import (
    COUNTER_DIRECT,
    COUNTER_HOST_COPIES,
    COUNTER_HOST_SEL,
    COUNTER_HOT_HIT,
    ResolverWorkspace,
    resolve,
)
from systems.kernels.step_tables import step_tables
from systems.kv.base import GiB, KVBackend, KVOptions, MemoryReport, PagePool, PrefixKV
from systems.kv.host_memory import host_empty
from systems.kv.registry import register

log = logging.getLogger("dhs.kv")


RESOLVER_IMPLS = ("auto", "triton", "reference")


@dataclass(frozen=True)
class HiSparseOptions(KVOptions):
    """``system.kv`` of the HiSparse family."""

    hot_cache_rows: int = 0  # B, per request and KV source; 0: 2k (the paper's GLM setting)
    tail_rows: int = 0  # T, the tail ring per request and source; 0: max(2 x queries, 16)
    resolver_impl: str = "auto"  # auto: the Triton kernel on a GPU, the PyTorch reference else
    prefetch_followers: bool = True  # GLM-like: a producer's selection starts follower copies
    verify_rows: bool = False  # debug: compare every resolved row with its host copy
    # false keeps every slot past what the pool holds (admission then waits for hot caches
    # instead of slots: the fault tests build that over-subscribed state)
    cap_slots_to_pool: bool = True
    # the misses' host -> device copy: 0 runs it beside the resolution on a grid that scales with
    # the batch (copy programs per request); N > 0 copies a call's misses after the resolution on
    # a fixed grid of N programs (the paper's HiSparse baseline: four thread blocks, sec. 4.2.1)
    copy_grid: int = 0
    # 0: the pools are sized for this B (one capacity: sessions = what index history, staging and
    # a hot cache each leave room for). N > 0: they keep the sizes a deployment configured for
    # B = N gave them, and only B changes (the paper's budget sweep, sec. 4.3.4): the index and
    # staging pools hold the sessions B = N allowed, the payload pool the rest, so a larger B
    # holds fewer sessions in proportion (52 at 2k -> 13 at 8k) and a smaller one no more
    pools_sized_for_rows: int = 0
    # copy programs per request beside the resolvers (copy_grid 0): 0 takes the kernel's default
    # for the call's batch and queries (systems/kernels/resolver.py: default_copy_programs); N
    # fixes it, e.g. to sweep the verification copy's width in bench_decode_step
    copy_programs_per_request: int = 0
    # thread blocks of each row-copy launch queued on the handoff stream beside the decode steps
    # (imports, background reclaims' backups), each looping over tiles of rows, so a copy holds
    # at most N SMs; 0: one block per row and source, which fills every SM and holds the steps'
    # kernels back while it runs
    handoff_copy_programs: int = 0

    def __post_init__(self) -> None:
        for f in (
            "hot_cache_rows",
            "tail_rows",
            "copy_grid",
            "pools_sized_for_rows",
            "copy_programs_per_request",
            "handoff_copy_programs",
        ):
            if int(getattr(self, f)) < 0:
                raise ValueError(f"system.kv.{f}: must be >= 0, got {getattr(self, f)}")
        if self.copy_grid and self.copy_programs_per_request > 1:
            raise ValueError(
                "system.kv.copy_programs_per_request: copy_grid copies after the resolution, "
                "without copy programs beside the resolvers; set one of the two"
            )
        if self.resolver_impl not in RESOLVER_IMPLS:
            raise ValueError(
                f"system.kv.resolver_impl: must be one of {RESOLVER_IMPLS}, got "
                f"{self.resolver_impl!r}"
            )

    def resolved(self, model, device, max_queries_per_step):
        B = int(self.hot_cache_rows) or 2 * model.index_topk
        if B < model.index_topk:
            raise ValueError(
                f"system.kv.hot_cache_rows={B} must be >= k = model.index_topk="
                f"{model.index_topk} (one query's selection must fit the hot cache)"
            )
        if self.pools_sized_for_rows and not self.cap_slots_to_pool:
            raise ValueError(
                "system.kv.pools_sized_for_rows sizes the sessions the pools hold; with "
                "cap_slots_to_pool=false every slot is kept and it would change nothing"
            )
        if 0 < self.pools_sized_for_rows < model.index_topk:
            raise ValueError(
                f"system.kv.pools_sized_for_rows={self.pools_sized_for_rows} must be >= k = "
                f"model.index_topk={model.index_topk} (a hot cache the pools could be sized for)"
            )
        impl = self.resolver_impl
        if impl == "auto":
            impl = "triton" if str(device).startswith("cuda") else "reference"
        return dataclasses.replace(
            self,
            hot_cache_rows=B,
            resolver_impl=impl,
            tail_rows=int(self.tail_rows) or max(2 * max_queries_per_step, 16),
        )


@register("hisparse", options=HiSparseOptions)
class HiSparseBackend(KVBackend):
    def __init__(self, model_cfg, kv_cfg, device):
        super().__init__(model_cfg, kv_cfg, device)
        m = model_cfg
        self.S = S = m.num_sources
        opt = kv_cfg.options.resolved(m, str(device), self.q_max)  # idempotent once resolved
        self.opt = opt
        self.B = B = opt.hot_cache_rows
        self.T = T = opt.tail_rows
        self.G = G = B + T
        rb = m.row_bytes
        self.payload_page_bytes = S * G * rb
        self._followers = self._follower_map(m)
        self.chi = (
            1 + max([len(v) for v in self._followers.values()] + [0])
            if opt.prefetch_followers
            else 1
        )
        # max_running_requests is a cap, as in SGLang: a session needs its index history, its
        # share of the verification staging and one hot cache, so past what the pool holds the
        # slot count is lowered rather than sizing the index store for sessions that could
        # never run (Fig. 4 at C256: 256 slots' index histories left room for ~40 hot caches)
        # verification staging rows per slot (see below); none without speculation
        stage_rows_per_slot = self.q_max * m.index_topk if self.q_max > 1 else 0
        fixed_per_slot = (
            self.max_pages_per_req * self.index_page_bytes + self.chi * stage_rows_per_slot * rb
        )
        # Lending the index store (the adaptive backend): it then lives in kv_flat, after the
        # staging rows rounded up to a G-row unit, so a unit of a free slot's index history can
        # hold G payload rows that the resolver finds as rows of kv_flat. The rounding costs
        # at most one unit of the pool, taken off before the slots are counted.
        self.lends_index = self._lends_index_store()
        align = G * rb if self.lends_index else 0
        # The pools as configured for a hot cache of B_ref rows (B itself unless
        # pools_sized_for_rows says otherwise): index history and staging for the sessions that
        # configuration holds, the payload pool the rest of the capacity.
        B_ref = int(opt.pools_sized_for_rows) or B
        G_ref = B_ref + T
        ref_slots = min(
            self.num_slots,
            (self.capacity - (G_ref * rb if align else 0)) // (fixed_per_slot + S * G_ref * rb),
        )
        # (when B > B_ref, the staging of the sessions B cannot hold stays unallocated, as the
        # index regions of the adaptive backend's lending below)
        payload_budget = self.capacity - align - max(ref_slots, 0) * fixed_per_slot
        fit = min(ref_slots, payload_budget // self.payload_page_bytes)
        if opt.pools_sized_for_rows and fit < 1:
            raise ValueError(
                f"kv.kv_pool_gib={kv_cfg.kv_pool_gib}: pools sized for B = "
                f"{opt.pools_sized_for_rows} rows hold no session of B = {B} rows"
            )
        if 1 <= fit < self.num_slots and opt.cap_slots_to_pool:
            log.warning(
                "kv.kv_pool_gib=%s holds %d sessions of %d tokens (index history, "
                "staging and one hot cache each%s): running requests capped at %d, not "
                "max_running_requests=%d",
                kv_cfg.kv_pool_gib,
                fit,
                self.max_total_tokens,
                f"; pools sized for B = {B_ref}" if B_ref != B else "",
                fit,
                self.num_slots,
            )
            self._set_num_slots(int(fit))
        # index pool: full histories of every session the configured pools hold (as SGLang sizes
        # its index pool); past num_slots (a budget larger than the pools were sized for) its
        # regions serve no session, and only the adaptive backend's lending can use them
        self.index_regions = max(self.num_slots, ref_slots)
        num_index_pages = self.index_regions * self.max_pages_per_req
        index_bytes = num_index_pages * self.index_page_bytes
        # Verification staging (sec. 3.4, eq. 11): rows of a Q-query union that do not fit the
        # hot cache. One arena per simultaneously live payload source (chi: a producer and the
        # followers it prefetches), N slots x K_max x k rows each, reused by every layer group.
        # Promotion: the rows of the union that win a hot-cache slot (hits, then misses in
        # first-occurrence order, i.e. the anchor query's first) are copied by the resolver
        # straight to their stable hot-cache address; only the rest are staged, and the arena
        # is free again once the group's readers are done (stream order), with nothing to copy
        # back.
        stage_bytes = self.chi * self.num_slots * stage_rows_per_slot * rb
        num_pages = (
            min(payload_budget, self.capacity - index_bytes - stage_bytes - align)
            // self.payload_page_bytes
        )
        if num_pages < 1:
            raise ValueError(
                f"kv.kv_pool_gib={kv_cfg.kv_pool_gib}: the index store and staging take "
                f"{(index_bytes + stage_bytes) / GiB:.3f} GiB and leave no room for one hot "
                f"cache of {self.payload_page_bytes / GiB:.4f} GiB"
            )
        self.payload_pages = PagePool(num_pages, "payload")
        # The padding slot (KVBackend) has memory of its own past what kv.kv_pool_gib counts:
        # payload page ``num_pages``, its staging rows after the slots' and its index pages.
        self.pad_page = num_pages
        self.stage_rows = (self.num_slots + 1) * stage_rows_per_slot
        # One flat device tensor: per-source page regions, then the staging arenas (then, when
        # lent, the index store). Locations returned by resolve are rows of it, so one gather
        # serves every tier.
        self.NG = (num_pages + 1) * G
        self.stage0 = S * self.NG
        rows = self.stage0 + self.chi * self.stage_rows
        self.index_row0 = -(-rows // G) * G if self.lends_index else rows
        store_bytes = self.index_store_bytes(num_index_pages)
        index_rows = -(-store_bytes // rb) if self.lends_index else 0
        self.kv_flat = torch.zeros(
            self.index_row0 + index_rows, rb, dtype=torch.uint8, device=self.device
        )
        self.kv_pool = self.kv_flat[: self.stage0].view(S, self.NG, rb)
        store = self.kv_flat[self.index_row0 :] if self.lends_index else None
        self._init_index_pool(num_index_pages, store)
        self.stage_bytes = stage_bytes
        # host store: full history of every admitted request, pinned when a GPU reads it
        self.max_host_pages = math.ceil((self.max_total_tokens + self.q_max) / G)
        num_host_pages = int(kv_cfg.host_pool_gib * GiB) // (S * G * rb)
        if num_host_pages < self.max_host_pages:
            raise ValueError(
                f"kv.host_pool_gib={kv_cfg.host_pool_gib} cannot hold one request "
                f"of {self.max_total_tokens} tokens"
            )
        # The budget is a cap: never pin more than every slot at its longest can use. A host
        # row is read only after its backup wrote it (positions below tail_start, complete
        # pages), so its contents need no initial value; host_memory pins exactly these bytes
        # (touching them in parallel is what makes the pinning fast; PyTorch's
        # pinned allocator rounds up to a power of two, 64 GB for Fig. 4's 37 GB: 35.6 s of a
        # 46 s server start on the H200 machine).
        num_host_pages = min(num_host_pages, self.num_slots * self.max_host_pages)
        pin = self.device.type == "cuda"
        self.host_pool = host_empty((S, num_host_pages * G, rb), torch.uint8, pin)
        self.host_pages = PagePool(num_host_pages, "host")
        # per slot, per source state (device), then the padding slot's row: its payload page,
        # no host pages, its tail from position 0 (it never commits)
        ns = self.num_slots + 1
        dev = self.device
        self.hot_pos = torch.full((S, ns, B), -1, dtype=torch.int32, device=dev)
        self.hot_lru = torch.zeros((S, ns, B), dtype=torch.int64, device=dev)
        self.slot_page = torch.full((ns,), -1, dtype=torch.int32, device=dev)
        self.slot_page[self.pad_slot] = self.pad_page
        self.host_page_table = torch.full(
            (ns, self.max_host_pages), -1, dtype=torch.int32, device=dev
        )
        # tail_start lives twice: a host list for the commit logic and a device mirror that the
        # step reads (no per-step host->device table, so a captured graph sees its updates)
        self.tail_start = [0] * ns
        self.tail_start_dev = torch.zeros(ns, dtype=torch.int32, device=dev)
        self._slot_pages: dict[int, tuple[int, list[int]]] = {}
        # Counters and the LRU clock are device tensors advanced by device work: a graph replay
        # advances them without any Python running. Reports read them (one sync); /metrics reads
        # the engine's periodic host copy (snapshot_counters).
        self.stamp_dev = torch.zeros(1, dtype=torch.int64, device=dev)
        # a step's i-th resolver call reads clock + i from a table built once per step (no
        # increment kernel per call); at most one call per layer (backends take a step's
        # queries in one chunk)
        self._steps_ar = torch.arange(1, len(m.layers) + 1, device=dev)
        self.census = torch.zeros(4, dtype=torch.int64, device=dev)
        self.overflow_dev = torch.zeros((), dtype=torch.int64, device=dev)
        self.calls_dev = torch.zeros((), dtype=torch.int64, device=dev)
        # what /metrics reads (metrics(sync=False)): the counters as they start, until a copy
        self._counter_snap = CounterSnapshot(dev, self._device_counters())
        self.backup_rows = 0
        self.resolver_impl = opt.resolver_impl
        self.copy_grid = int(opt.copy_grid) or None
        self.copy_programs = int(opt.copy_programs_per_request) or None
        self.side_copy_programs = int(opt.handoff_copy_programs) or None
        self.verify = opt.verify_rows
        self._shadow: dict[int, torch.Tensor] = {}
        self.prefetch = opt.prefetch_followers
        self._arena = {}  # layer index -> staging arena (its position in its live group)
        for fols in self._followers.values():
            for a, f in enumerate(fols, start=1):
                self._arena[f.index] = a if self.chi > 1 else 0
        # the step's own side stream (follower prefetch) at the step's priority
        self._side = shared_stream(dev, "prefetch") if dev.type == "cuda" else None
        self._side_forked = False  # this step's forward put work on the prefetch stream
        # Resolver scratch, one per stream that resolves (main, follower prefetch), grown once
        # to the largest call here: a captured graph holds their addresses, so they never move.
        self._ws = self._ws_side = None
        if self.resolver_impl == "triton":
            grow = (ns, self.max_host_pages * G, self.q_max * m.index_topk)
            self._ws = ResolverWorkspace(dev).ensure(*grow).fixed()
            self._ws_side = ResolverWorkspace(dev).ensure(*grow).fixed()

    @staticmethod
    def _follower_map(m) -> dict[int, list]:
        """full layer index -> the follower layers that reuse its positions."""
        out, cur = {}, None
        for spec in m.layers:
            if spec.selects:
                cur = spec.index if spec.role == "full" else None
                if cur is not None:
                    out[cur] = []
            elif spec.role == "follower" and cur is not None:
                out[cur].append(spec)
        return out

    def _lends_index_store(self) -> bool:
        """Whether optional KV pages may live in free slots' index history (adaptive
        residency, sec. 3.1); each slot's index history is then its own region of the store."""
        return False

    # ------------------------------------------------------------------ admission
    def _required_free(self) -> tuple[bool, str]:
        if self.payload_pages.num_free < 1:
            return False, "kv_pool_full"
        return True, ""

    def can_admit(self, num_prompt_tokens, max_new_tokens):
        if not self.free_slots:
            return False, "no_free_slot"
        total = num_prompt_tokens + max_new_tokens + self.q_max - 1
        if self.mcfg.pages_for(total) > self.index_pages.num_free:
            return False, "index_pool_full"
        if math.ceil(total / self.G) > self.host_pages.num_free:
            return False, "host_pool_full"
        return self._required_free()

    def _alloc_slot(self, prefix: PrefixKV, max_new_tokens: int) -> int:
        """Atomic: either the slot holds all of its pages, or everything taken is returned."""
        total = prefix.num_tokens + max_new_tokens + self.q_max - 1  # room for a draft block
        page = self.payload_pages.alloc(1)[0]
        try:
            hpages = self.host_pages.alloc(math.ceil(total / self.G))
        except BaseException:
            self.payload_pages.free([page])
            raise
        slot = self._take_slot()
        self._slot_pages[slot] = (page, hpages)  # from here on, release(slot) returns it all
        try:
            self._init_slot(slot, prefix, total, page, hpages)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def _init_slot(self, slot, prefix, total, page, hpages) -> None:
        self._alloc_index(slot, total)
        # one element of a device tensor, written by a fill kernel: ``t[i] = v`` copies a CPU
        # scalar from pageable memory, which waits for the step in flight (torch 2.11)
        self.slot_page[slot : slot + 1].fill_(page)
        self.host_page_table[slot, : len(hpages)] = to_device(hpages, self.device, torch.int32)
        self.hot_pos[:, slot] = -1
        self.hot_lru[:, slot] = 0
        self.slot_len[slot] = prefix.num_tokens
        self._set_tail_start(slot, prefix.num_tokens)
        if self.verify:
            self._shadow[slot] = torch.zeros(self.S, total, self.mcfg.row_bytes, dtype=torch.uint8)

    def reserve(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool = False) -> int:
        return self._alloc_slot(prefix, max_new_tokens)

    def import_history(self, slot: int, prefix: PrefixKV) -> None:
        self._import_index(slot, prefix)
        self._import_rows(slot, prefix)
        if self.verify:
            self._shadow[slot][:, : prefix.num_tokens] = prefix.kv.cpu()

    def _import_rows(self, slot: int, prefix: PrefixKV) -> None:
        self._backup(slot, 0, prefix.num_tokens, prefix.kv)  # history to host on arrival

    def release(self, slot: int) -> None:
        if slot not in self.active_slots:
            return
        page, hpages = self._slot_pages.pop(slot, (None, []))
        if page is not None:
            self.payload_pages.free([page])
        self.host_pages.free(hpages)
        self.slot_page[slot : slot + 1].fill_(-1)  # a fill kernel, no wait (as in _init_slot)
        self.host_page_table[slot] = -1
        self._free_index(slot)
        self._shadow.pop(slot, None)
        self._return_slot(slot)

    # ------------------------------------------------------------------ host store
    def _host_segments(self, slot: int, p0: int, p1: int):
        """Consecutive positions [p0, p1) -> runs of (a, b, first host row)."""
        hpages = self._slot_pages[slot][1]
        G, p = self.G, p0
        while p < p1:
            b = min(p1, (p // G + 1) * G)
            yield p, b, hpages[p // G] * G + p % G
            p = b

    def _backup(self, slot: int, p0: int, p1: int, rows: torch.Tensor) -> None:
        """Copy rows (S, p1 - p0, rb) of positions [p0, p1) to the host store.

        From a GPU, one strided 2-D copy per run of adjacent host pages for all sources
        (systems/host_copy.py): a single asynchronous DMA into pinned memory. (A strided
        [S, n, rb] copy_ across devices goes through a contiguous GPU temporary, a pageable
        host temporary and a strided CPU copy, synchronously: Fig. 4's first H200 runs admitted
        ~22 glm53_mini requests of 16K tokens per second, ~45 ms each, against ~6 ms of PCIe
        transfer for their 280 MB.)"""
        with nvtx_range(BACKUP):
            runs = []  # (a, b, h), adjacent segments merged where their host rows continue
            for a, b, h in self._host_segments(slot, p0, p1):
                if runs and runs[-1][1] == a and runs[-1][2] + (a - runs[-1][0]) == h:
                    runs[-1] = (runs[-1][0], b, runs[-1][2])
                else:
                    runs.append((a, b, h))
            for a, b, h in runs:  # every source's run in one call
                copy_blocks_to_host(self.host_pool[:, h : h + b - a], rows[:, a - p0 : b - p0])
        self.backup_rows += p1 - p0

    def _set_tail_start(self, slot: int, n: int) -> None:
        self.tail_start[slot] = n
        self.tail_start_dev[slot : slot + 1].fill_(n)  # a fill kernel, no wait (_init_slot)

    # ------------------------------------------------------------------ step
    def _prepare_step(self):
        with nvtx_range(BOOKKEEPING):
            self._prepare_tables()

    def _prepare_tables(self):
        st = self._step
        pos = st["positions"]
        Q = pos.shape[1]
        if Q > self.q_max:
            raise ValueError(f"{Q} queries per step exceed kv.max_queries_per_step={self.q_max}")
        # every table of the step in one launch (systems/kernels/step_tables.py): tail ring
        # (position tail_start + j lives at page*G + B + (tail_start + j) % T), write rows, and
        # every source's tables at once, so a resolver call takes a view
        st.update(
            step_tables(
                st["slots"],
                pos,
                self.req_to_index_page,
                self.P,
                self.tail_start_dev,
                self.slot_page,
                self.host_page_table,
                self._direct_pages(),
                S=self.S,
                NG=self.NG,
                G=self.G,
                hot=self.B,
                T=self.T,
                impl=self.index_impl,
            )
        )
        st["prefetched"] = {}
        if Q > 1 and self.stage_rows:  # verification: each staging arena's rows per request
            arenas = torch.arange(self.chi, device=self.device).unsqueeze(1) * self.stage_rows
            per_req = st["slots"].long() * (self.q_max * self.mcfg.index_topk)
            st["staging"] = (self.stage0 + arenas + per_req.unsqueeze(0)).to(torch.int32)
        # each call's counters and overflow, summed once when the forward ends
        st["counters"], st["overflow"] = [], []
        st["stamps"] = self.stamp_dev + self._steps_ar

    def kv_write_target(self, source):
        if self.verify:  # the shadow copy needs the rows (write_kv)
            return None
        return self.kv_pool[source], self._step["write_loc"].reshape(-1)

    def write_kv(self, source, rows):
        self.kv_pool[source][self._step["write_loc"].reshape(-1)] = rows.reshape(-1, rows.shape[-1])
        if self.verify:
            pos = self._step["positions"].cpu()
            for b, slot in enumerate(self._step["slots"].tolist()):
                if slot != self.pad_slot:
                    self._shadow[slot][source, pos[b]] = rows[b].cpu()

    def kv_buffer(self, source):
        return self.kv_flat

    def _direct_pages(self) -> torch.Tensor | None:
        """Hook for the adaptive backend: its slots' ready optional history pages (one row per
        slot, -1 where not ready), or None."""
        return None

    def resolve(self, layer, selections, q0):
        with nvtx_range(RESOLVER):
            return self._resolve(layer, selections, q0)

    def _resolve(self, layer, selections, q0):
        st = self._step
        src = layer.source
        sl = st["slots"].long()
        stamp = st["stamps"][len(st["counters"])].view(1)  # the device clock of this call
        direct = st["direct"]
        if direct is not None:
            direct = direct[src]
        staging = None
        if selections.shape[1] > 1 and self.stage_rows:
            staging = st["staging"][self._arena.get(layer.index, 0)]
        # the resolver on CPU (reference, or Triton's interpreter) syncs by design; the kernel
        # on the GPU never does, and a capture there proves it
        with allow_host_sync() if self.device.type == "cpu" else nullcontext():
            res = resolve(
                selections.to(torch.int32).contiguous(),
                st["tail_start"],
                st["tail_loc"][src],
                self.hot_pos[src],  # the slots' rows, updated in place (hot_rows)
                self.hot_lru[src],
                st["hot_base"][src],
                st["host_pt"],
                self.kv_flat,
                self.host_pool[src],
                stamp,
                page_size=self.G,
                direct_page_table=direct,
                staging_loc_base=staging,
                impl=self.resolver_impl,
                workspace=self._workspace(),
                copy_grid=self.copy_grid,
                copy_programs_per_request=self.copy_programs,
                hot_rows=sl,
            )
        st["counters"].append(res.counters)
        st["overflow"].append(res.overflow)
        return res.locations  # int32: attention reads them as they are

    def _workspace(self):
        """The resolver scratch of the stream this call runs on (main or follower prefetch)."""
        if self._side is not None and torch.cuda.current_stream(self.device) == self._side:
            return self._ws_side
        return self._ws

    def locate(self, layer, selections, q0, inherit):
        st = self._step
        cache = st.setdefault("loc", {})
        key = (layer.source, q0)
        pre = st["prefetched"].pop(key, None)
        if pre is not None:
            loc, ev = pre
            if ev is not None:
                torch.cuda.current_stream(self.device).wait_event(ev)
        elif inherit and key in cache:
            loc = cache[key]
        else:
            loc = self.resolve(layer, selections, q0)
        cache[key] = loc
        if self.verify:  # here, not in resolve: a prefetched follower writes its row later
            self._verify(layer.source, selections, loc)
        if layer.role == "full" and self.prefetch:
            self._prefetch_followers(layer, selections, q0)
        return self.kv_flat, loc

    def _prefetch_followers(self, layer, selections, q0) -> None:
        followers = self._followers.get(layer.index, [])
        if not followers:
            return
        with nvtx_range(FOLLOWER_PREFETCH):
            self._prefetch(followers, selections, q0)

    def _prefetch(self, followers, selections, q0) -> None:
        if self._side is None:  # CPU: inline, in order
            for f in followers:
                self._step["prefetched"][(f.source, q0)] = (self.resolve(f, selections, q0), None)
            return
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)
        self._side_forked = True  # finish_forward joins it back
        with torch.cuda.stream(self._side):
            for f in followers:
                loc = self.resolve(f, selections, q0)
                ev = torch.cuda.Event()
                ev.record(self._side)
                self._step["prefetched"][(f.source, q0)] = (loc, ev)
        if not torch.cuda.is_current_stream_capturing():  # a graph's pool outlives the replay
            selections.record_stream(self._side)

    def set_blocks_in_flight(self, n: int) -> None:
        if self.T < n * self.q_max:
            raise ValueError(
                f"system.kv.tail_rows={self.T} cannot hold {n} blocks of {self.q_max} queries "
                "in flight (overlap scheduling): raise it or set engine.overlap_schedule=false"
            )
        super().set_blocks_in_flight(n)

    def commit(self, slots, lengths):
        """Committed rows are immutable: back up what the tail cannot keep for the next block,
        for every request of the batch in one kernel launch (systems/kernels/backup.py)."""
        G, B, T = self.G, self.B, self.T
        dev_rows: list[int] = []
        host_rows: list[int] = []
        moved: dict[int, int] = {}  # slot -> new tail_start
        for s, n in zip(slots, lengths):
            self.slot_len[s] = n
            t0 = self.tail_start[s]
            # room for the blocks queued before the next commit (two under overlapped rounds)
            if n - t0 + self.blocks_in_flight * self.q_max > T:
                page = self._slot_pages[s][0]
                for a, b, h in self._host_segments(s, t0, n):
                    dev_rows.extend(page * G + B + p % T for p in range(a, b))
                    host_rows.extend(range(h, h + b - a))
                self.backup_rows += n - t0
                self.tail_start[s] = n
                moved[s] = n
        if not moved:
            return
        with nvtx_range(BACKUP):
            # one pinned host->device copy of the row lists and of the new tail starts
            meta = to_device([*dev_rows, *host_rows, *moved, *moved.values()], self.device)
            N, M = len(dev_rows), len(moved)
            backup_rows(self.kv_pool, self.host_pool, meta[:N], meta[N : 2 * N], self.copy_impl)
            self.tail_start_dev[meta[2 * N : 2 * N + M]] = meta[2 * N + M :].to(torch.int32)

    def finish_forward(self) -> None:
        # Join the prefetch stream (inside a capture too), but only after this step forked it:
        # a capturing stream that waits on a stream outside the capture invalidates the capture.
        # Geometries without followers (DeepSeek-like) never fork it, and joining anyway made
        # every dsv41_mini hierarchy capture fail on the H200 ("operation failed due to a
        # previous error during capture"), so those runs went eager.
        if self._side is not None and self._side_forked:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._side_forked = False
        st = self._step
        if st is not None and st.get("counters"):  # once per step, after the streams joined
            real = (st["slots"] != self.pad_slot).to(torch.int64)  # padding rows count nothing
            counts = torch.stack(st["counters"])  # (calls, R, 4)
            verified = st.get("verified")
            if verified is not None:  # a query past its K_r selected its own tail row only:
                # not a selection of the round's union (eq. 6), so the census leaves it out
                counts[..., COUNTER_DIRECT] -= (~verified).sum(1)
            self.census += (counts * real[None, :, None]).sum((0, 1))
            self.overflow_dev += (torch.stack(st["overflow"]) * real).sum()
            self.calls_dev += len(st["counters"])  # a graph replays the same number of calls
            self.stamp_dev += len(st["counters"])
            st["counters"], st["overflow"] = [], []

    @property
    def resolver_calls(self) -> int:
        return int(self.calls_dev)  # a sync: for reports and tests, not the step

    @property
    def overflow_rows(self) -> int:
        return int(self.overflow_dev)

    @property
    def graph_capturable(self) -> bool:
        return not self.verify  # the debug shadow check copies to the host per gather

    # ------------------------------------------------------------------ checks and reports
    def _verify(self, src: int, selections: torch.Tensor, loc: torch.Tensor) -> None:
        """Debug (kv.verify_rows): every resolved location holds exactly the original row's
        bytes (eq. 12), checked against a CPU shadow of everything the request ever wrote."""
        sel = selections.long().cpu()
        got = self.kv_flat[loc.clamp_min(0)].cpu()
        for b, slot in enumerate(self._step["slots"].tolist()):
            if slot == self.pad_slot:
                continue
            keep = sel[b] >= 0
            want = self._shadow[slot][src][sel[b][keep]]
            assert torch.equal(got[b][keep], want), (
                f"source {src}, slot {slot}: a resolved row differs from the original"
            )

    def memory_report(self) -> MemoryReport:
        idx = self.index_pages.num_used * self.index_page_bytes
        hot = self.payload_pages.num_used * self.payload_page_bytes
        return MemoryReport(
            capacity=self.capacity,
            required=idx + hot + self.stage_bytes,
            components={
                "index": idx,
                "hot_cache_and_tail": hot,
                "verification_staging": self.stage_bytes,
                "host_backup": self.host_pages.num_used * self.S * self.G * self.mcfg.row_bytes,
            },
        )

    def check_integrity(self) -> None:
        self.check_integrity_base()
        assert len(self._slot_pages) == self.payload_pages.num_used, "payload pages leaked"

    def check_integrity_base(self) -> None:
        super().check_integrity()
        self.payload_pages.check()
        self.host_pages.check()
        assert set(self._slot_pages) == self.active_slots, "pages held by a released slot"
        held = sum(len(h) for _, h in self._slot_pages.values())
        assert held == self.host_pages.num_used, "host pages leaked"

    def _device_counters(self) -> torch.Tensor:
        """The census (COUNTER_*), then resolver calls and staged rows: one device tensor."""
        return torch.cat([self.census, self.calls_dev.view(1), self.overflow_dev.view(1)])

    def snapshot_counters(self) -> bool:
        return self._counter_snap.take(self._device_counters)

    def metrics(self, sync: bool = True) -> dict[str, float]:
        m = super().metrics(sync)
        # sync: one read of the device (reports, tests); else the latest landed snapshot, which
        # trails the device by up to the engine's snapshot interval (never a read of the device
        # from the event loop; None only where there is no device to wait for)
        snap = None if sync else self._counter_snap.latest()
        c = (self._device_counters() if snap is None else snap).tolist()
        calls, staged = c[len(self.census)], c[len(self.census) + 1]
        total = c[COUNTER_DIRECT] + c[COUNTER_HOT_HIT] + c[COUNTER_HOST_SEL]
        m.update(
            {
                "dhs_selected_rows_total": total,
                "dhs_selected_rows_direct_total": c[COUNTER_DIRECT],
                "dhs_selected_rows_hot_total": c[COUNTER_HOT_HIT],
                "dhs_selected_rows_from_host_total": c[COUNTER_HOST_SEL],
                "dhs_host_rows_copied_total": c[COUNTER_HOST_COPIES],
                "dhs_host_bytes_total": c[COUNTER_HOST_COPIES] * self.mcfg.row_bytes,
                "dhs_resolver_calls_total": calls,
                "dhs_staged_rows_total": staged,
                "dhs_host_backup_rows_total": self.backup_rows,
                "dhs_host_pool_used_ratio": self.host_pages.num_used / self.host_pages.num_pages,
            }
        )
        return m
