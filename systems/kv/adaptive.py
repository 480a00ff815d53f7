"""Adaptive residency (paper sec. 3.1-3.2): HiSparse plus optional history that follows load.

The hot cache and tail stay exactly as in HiSparse (required, never lent). Reclaimable capacity
within the KV pools can carry *optional history*: complete pages of a request's imported prompt
(page j covers positions [j*G, (j+1)*G)), found by the resolver through the direct page table
before it scans the hot cache (Fig. 2, callout 1). That capacity is, as in sec. 3.1, the payload
pages no required allocation holds and the unused index backing: each slot's index history is
its own region of a store that lives in the payload arena (kv_flat), so while a slot is free its
region holds *lent pages* (S units of G rows each, one per source; a page may span adjacent
regions and is lent only while all their slots are free). An admission takes a free slot whose region
lends nothing if there is one, else reclaims the requests holding pages in the chosen region.

- Resident-first admission: a new request keeps its imported history on device in optional
  pages while pages are spare, and its host backup is deferred. Only the partial boundary page
  goes to host at once. A page without host backing is never retired before its backup.
- Reclaim (eq. 4): an admission short of D pages (its hot/tail page, then the reserve M_res
  kept free after it: eq. 3 holds between admissions too) walks admitted requests in reclaim
  order and takes whole requests until their optional pages cover D; their unbacked pages are copied to
  host, then retired. If all optional pages cannot cover D, the admission waits
  (reason ``reclaim_insufficient``).
- Population: while pages are free beyond the admission reserve (payload pages first, then lent
  pages), a bounded round-robin pass
  copies host history back into optional pages, a few pages per step. A page is published in the
  direct table only after its copy has completed (ready is tracked apart from allocated).

Memory (eq. 3): M_req (index pages + hot/tail pages) + M_opt (optional pages) + M_res (reserve
pages) <= M, checked by ``check_integrity`` together with the invariant "every row is ready on
the device or has a complete host copy".

On one stream every copy, retirement and reuse of a page is ordered by the stream itself; the
events below only decide when a populated page may be *published*.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from profiling.ranges import BACKUP, BOOKKEEPING, POPULATE, nvtx_range
from systems.host_sync import to_device
from systems.kernels.backup import backup_rows, copy_rows, restore_rows
from systems.kv.base import MemoryReport, PrefixKV
from systems.kv.hisparse import HiSparseBackend, HiSparseOptions
from systems.kv.registry import register


@dataclass
class _Residency:
    order: int  # admission sequence number (reclaim order)
    num_complete: int  # complete prompt pages (eligible for optional residency)
    page: list[int] = field(default_factory=list)  # page id per prompt page, -1 if none
    ready: list[bool] = field(default_factory=list)
    backed: list[bool] = field(default_factory=list)  # complete host copy exists
    pending: dict[int, object] = field(default_factory=dict)  # j -> event (or None on CPU)
    kept: int = 0  # prompt pages kept on device at admission (resident-first)

    @property
    def num_pages(self) -> int:
        # a C-level count: /metrics sums this over every request (~2,000 pages each at 125K
        # tokens), on a thread that shares the GIL with the engine thread
        return len(self.page) - self.page.count(-1)


RECLAIM_ORDERS = ("newest_first", "oldest_first", "largest_first")


def carve_lent_pages(
    num_slots: int,
    index_sources: int,
    region: int,
    store_at: int,
    unit: int,
    S: int,
    source_bytes: int | None = None,
) -> list[tuple[list[int], tuple[int, ...]]]:
    """The pages an index store can lend: (a unit per source, the slots whose regions its
    units lie in). The store starts at byte ``store_at`` of the arena and is laid out source by
    source (``source_bytes`` each, default ``num_slots * region``), slot by slot: slot s's
    region of index source i is ``region`` bytes at ``store_at + i * source_bytes + s *
    region`` (past the slots' regions a source may hold more, e.g. the padding slot's page).
    Units are ``unit`` bytes at multiples of it; only units wholly inside one region are used,
    packed S to a page in slot order."""
    if source_bytes is None:
        source_bytes = num_slots * region
    pages, buf = [], []
    for slot in range(num_slots):
        for i in range(index_sources):
            b0 = store_at + i * source_bytes + slot * region
            for u in range(-(-b0 // unit), (b0 + region) // unit):
                buf.append((u, slot))
                if len(buf) == S:
                    pages.append(([u for u, _ in buf], tuple(sorted({x for _, x in buf}))))
                    buf = []
    return pages


@dataclass(frozen=True)
class AdaptiveOptions(HiSparseOptions):
    """``system.kv`` of adaptive residency: HiSparse's knobs plus the residency policy."""

    optional_residency: bool = True  # false: the same build with residency off (Fig. 6)
    # optional history may also use free slots' index history (sec. 3.1's "eligible unused
    # index backing"), not only unclaimed payload pages
    lend_index_store: bool = True
    admission_reserve_pages: int = 1  # M_res, in payload pages
    populate_pages_per_step: int = 4  # bounded population work per engine step
    reclaim_order: str = "newest_first"  # eq. 4's order over admitted requests
    # restore the admission reserve off the decode stream: the victims' backups run on the
    # handoff stream while decode steps keep reading their pages, which retire once the copies
    # are done (false: backed up on the decode stream and retired at once, a stall of the
    # backup's PCIe time). Only where handoffs are asynchronous (engine.async_handoffs, a GPU)
    async_reclaim: bool = True
    # population's host->device copies on a side stream of their own, beside the next decode
    # steps (false: on the decode stream between steps, where a step waits for them: four
    # glm53_h200 pages are ~140 MB, ~3 ms of host reads)
    async_populate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reclaim_order not in RECLAIM_ORDERS:
            raise ValueError(
                f"system.kv.reclaim_order: must be one of {RECLAIM_ORDERS}, got "
                f"{self.reclaim_order!r}"
            )
        for f in ("admission_reserve_pages", "populate_pages_per_step"):
            if int(getattr(self, f)) < 0:
                raise ValueError(f"system.kv.{f}: must be >= 0, got {getattr(self, f)}")


@register("adaptive_hisparse", options=AdaptiveOptions)
class AdaptiveBackend(HiSparseBackend):
    def __init__(self, model_cfg, kv_cfg, device):
        super().__init__(model_cfg, kv_cfg, device)
        opt = self.opt
        self.optional_on = opt.optional_residency
        self.reserve_pages = int(opt.admission_reserve_pages)
        self.populate_pages_per_step = int(opt.populate_pages_per_step)
        self.reclaim_order = opt.reclaim_order
        self.async_reclaim = bool(opt.async_reclaim)
        self.async_populate = bool(opt.async_populate)
        # slot -> (the event after its backup's copies, the prompt pages they back up): requests
        # whose reclaim runs off the decode stream; their pages stay published until it is done
        self.reclaiming: dict[int, tuple[object, list[int]]] = {}
        # per source, each slot's ready prompt pages as G-row units of kv_flat (-1: not ready)
        # (the padding slot's row stays -1: its history is never optional)
        self.direct_table = torch.full(
            (self.S, self.num_slots + 1, self.max_host_pages),
            -1,
            dtype=torch.int32,
            device=self.device,
        )
        # Page ids: payload pages 0 .. n-1, then lent pages. page_units[s, id] is the unit
        # (rows unit*G .. unit*G + G - 1 of kv_flat) that holds source s of the page.
        self.num_payload = n = self.payload_pages.num_pages
        lent = self._carve_lent_pages()
        # payload: row s*NG + p*G (NG also holds the padding slot's page past the pool's)
        units = torch.arange(self.S).unsqueeze(1) * (self.NG // self.G) + torch.arange(n)
        if lent:
            units = torch.cat([units, torch.tensor([u for u, _ in lent]).T], dim=1)
        if int(units.max()) * self.G + self.G > 2**31:
            raise ValueError("kv.kv_pool_gib: kv_flat's rows exceed the resolver's int32 locations")
        self.page_units = units.to(torch.int32).to(self.device)
        self._page_units_host = units.tolist()
        self.lent_slots = [sl for _, sl in lent]  # lent page n + i spans these slots' regions
        self._slot_lent: dict[int, list[int]] = {}  # slot -> lent page ids in its region
        for i, sl in enumerate(self.lent_slots):
            for slot in sl:
                self._slot_lent.setdefault(slot, []).append(n + i)
        self._lent_holder: dict[int, int] = {}  # held lent page -> the slot whose history it holds
        # lent pages free now (unheld, every slot of their region free), kept as slots and
        # holders change: finding them by a scan of every lent page cost ~1 ms of host time per
        # call at long contexts, several calls a step (check_integrity compares with the scan)
        self._lent_free: set[int] = set(range(n, n + len(self.lent_slots)))
        self.res: dict[int, _Residency] = {}
        self._seq = 0
        self._rr = 0  # round-robin cursor of population
        self.stats_adaptive = {
            "reclaimed_pages_total": 0,
            "reclaim_events_total": 0,
            "populated_pages_total": 0,
            "deferred_backup_pages_total": 0,
            "resident_first_pages_total": 0,
            # reclaims' backups: on the decode stream (a step waits for their PCIe time) or
            # beside it (async_reclaim), in pages; and the requests reclaimed because they held
            # lent pages in the slot region an admission takes
            "reclaim_backup_pages_sync_total": 0,
            "reclaim_backup_pages_async_total": 0,
            "region_reclaims_total": 0,
        }

    def _lends_index_store(self) -> bool:
        return bool(self.opt.optional_residency and self.opt.lend_index_store)

    def _carve_lent_pages(self) -> list[tuple[list[int], tuple[int, ...]]]:
        """The lent pages of this backend's index store (carve_lent_pages)."""
        if not self.lends_index:
            return []
        rb = self.mcfg.row_bytes
        page_bytes = self.P * self.mcfg.index_row_bytes  # one index source's share of a page
        return carve_lent_pages(
            self.index_regions,  # past num_slots: regions no session can take (always lendable)
            len(self.index_src_ids),
            self.max_pages_per_req * page_bytes,
            self.index_row0 * rb,  # the store's first byte in kv_flat
            self.G * rb,
            self.S,
            source_bytes=self.index_pool.shape[1] // self.P * page_bytes,
        )

    # ------------------------------------------------------------------ accounting
    # Reads for /metrics run on another thread (the server's event loop, or the engine process's
    # main thread) while the engine thread admits and releases requests: they iterate a copy of
    # ``res`` (one C call under the GIL), never the dict the engine thread may be resizing.
    @property
    def optional_pages(self) -> int:
        return sum(r.num_pages for r in list(self.res.values()))

    def _is_lent(self, page: int) -> bool:
        return page >= self.num_payload

    def _payload_pages_of(self, r: _Residency) -> int:
        return sum(1 for p in r.page if 0 <= p < self.num_payload)

    def _lendable_scan(self) -> list[int]:
        """Lent pages free now, by a scan of every lent page (what ``_lent_free`` keeps): unheld,
        in regions of free slots."""
        n = self.num_payload
        return [
            p
            for p in range(n, n + len(self.lent_slots))
            if p not in self._lent_holder and self._region_free(p)
        ]

    def _lendable(self, m: int) -> list[int]:
        """Up to m lent pages free now, the highest first: the highest slots' regions (a fresh
        allocator hands out the lowest free slot, and a freed slot is the next one taken, so
        high regions tend to stay lent longest)."""
        # a C sort of the set, not heapq.nlargest: an admission at 125K tokens asks for ~1,000
        # of ~2,700 (dsv41_h200), and nlargest's Python loop took ~0.5 ms a call
        return sorted(self._lent_free, reverse=True)[:m] if m > 0 else []

    def _region_free(self, page: int) -> bool:
        """Whether every slot whose index region a lent page spans is free."""
        return not any(x in self.active_slots for x in self.lent_slots[page - self.num_payload])

    def _take_slot(self) -> int:
        slot = super()._take_slot()
        self._lent_free.difference_update(self._slot_lent.get(slot, ()))
        return slot

    def _return_slot(self, slot: int) -> None:
        super()._return_slot(slot)
        for pg in self._slot_lent.get(slot, ()):
            if pg not in self._lent_holder and self._region_free(pg):
                self._lent_free.add(pg)

    def _payload_spare(self) -> int:
        """Payload pages free beyond the admission reserve."""
        return max(0, self.payload_pages.num_free - self.reserve_pages)

    def _spare(self) -> int:
        """Pages optional history may take now (payload pages, then lendable ones)."""
        return self._payload_spare() + len(self._lent_free)

    def _alloc_optional(self, n: int, slot: int) -> list[int]:
        """n optional pages for slot's history: spare payload pages first, then lent ones."""
        k = min(n, self._payload_spare())
        pages = self.payload_pages.alloc(k) if k else []
        lent = self._lendable(n - k)
        if len(pages) + len(lent) < n:
            self.payload_pages.free(pages)
            raise MemoryError(f"optional pages: asked for {n}, {len(pages) + len(lent)} spare")
        for pg in lent:
            self._lent_holder[pg] = slot
            self._lent_free.discard(pg)
        return pages + lent

    def _free_optional(self, pages: list[int]) -> None:
        self.payload_pages.free([p for p in pages if not self._is_lent(p)])
        for p in pages:
            if self._is_lent(p):
                del self._lent_holder[p]
                if self._region_free(p):
                    self._lent_free.add(p)

    def _region_holders(self, slot: int) -> set[int]:
        """Requests holding lent pages in slot's index region."""
        held = (self._lent_holder.get(pg) for pg in self._slot_lent.get(slot, ()))
        return {h for h in held if h is not None}

    def _pick_slot(self) -> tuple[int, set[int]] | None:
        """The free slot an admission takes, and the requests to reclaim for its index region:
        a slot whose region lends nothing if any, else eq. 4's walk: the shortest prefix of the
        reclaim order that holds every lent page of some free slot's region, whose holders then
        go (the prefix's other requests free nothing there and stay). A region a handoff still
        copies into is never taken; None when every free region is held by an import."""
        free = list(reversed(self.free_slots))  # the allocator's order (it pops the end)
        held = {}
        for slot in free:
            holders = self._region_holders(slot)
            if not holders:
                return slot, holders
            if not any(h in self.importing for h in holders):
                held[slot] = holders
        if not held:
            return None
        taken: set[int] = set()
        for r in self._ordered(with_reclaiming=True):
            taken.add(r)
            for slot, holders in held.items():
                if holders <= taken:
                    return slot, holders
        return None  # not reached: the order walks every request not importing

    def _required_free(self):
        # a free slot whose index region can be had (a lent region's holders are reclaimed)
        if self.lends_index and self._pick_slot() is None:
            return False, "reclaim_insufficient"
        # one hot/tail page is needed: required allocations come before the reserve (reserve()
        # restores the reserve where optional pages allow)
        if self.payload_pages.num_free >= 1:
            return True, ""
        if self.reclaiming:  # pages on their way back: wait for them rather than take more
            self._finish_reclaims()  # those whose copies are done retire now, not a step later
            if self.payload_pages.num_free >= 1:
                return True, ""
            return False, "reclaim_in_flight"
        if self.optional_on and self._reclaim_plan(1 - self.payload_pages.num_free) is not None:
            return True, ""
        # lent pages hold index history, never a hot cache: only payload pages can cover this
        in_payload = any(self._payload_pages_of(r) for r in self.res.values())
        return False, "reclaim_insufficient" if in_payload else "kv_pool_full"

    def _ordered(self, with_reclaiming: bool = False) -> list[int]:
        # a slot whose handoff is still copying into its pages is not reclaimed: its pages'
        # bytes are not there yet; one whose reclaim is in flight is already going
        slots = [
            s
            for s in self.res
            if s not in self.importing and (with_reclaiming or s not in self.reclaiming)
        ]
        key = {
            "newest_first": lambda s: -self.res[s].order,
            "oldest_first": lambda s: self.res[s].order,
            "largest_first": lambda s: (-self.res[s].num_pages, self.res[s].order),
        }
        return sorted(slots, key=key[self.reclaim_order])

    def _reclaim_plan(self, deficit: int) -> list[int] | None:
        """Eq. 4: the shortest prefix of the reclaim order whose optional payload pages cover
        deficit (payload pages: lent pages give back index history, not hot caches)."""
        if deficit <= 0:
            return []
        plan, got = [], 0
        for s in self._ordered():
            n = self._payload_pages_of(self.res[s])
            if n == 0:
                continue
            plan.append(s)
            got += n
            if got >= deficit:
                return plan
        return None

    # ------------------------------------------------------------------ admission
    def reserve(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool = False) -> int:
        holders: set[int] = set()
        if self.lends_index:  # first: its holders' payload pages count towards the deficit below
            picked = self._pick_slot()
            assert picked is not None, "admit called without can_admit"
            want, holders = picked
            self.stats_adaptive["region_reclaims_total"] += len(holders)
            for s in sorted(holders):
                self._reclaim(s)
            self.free_slots.remove(want)
            self.free_slots.append(want)  # the slot _take_slot pops
        # eq. 3 at all times: the admission's hot/tail page and the reserve M_res after it. When
        # every optional page could not restore the reserve, the required page takes it
        # (required allocations come first) and only what that page needs is reclaimed
        free = self.payload_pages.num_free
        if self.async_reclaim and asynchronous:
            # the required page now (the reserve has it, but for a reclaim still in flight);
            # the reserve's victims back up off the decode stream and retire when done
            plan = self._reclaim_plan(1 - free)
            assert plan is not None, "admit called without can_admit"
            for s in plan:
                self._reclaim(s)
            coming = sum(self._payload_pages_of(self.res[v]) for v in self.reclaiming)
            later = self._reclaim_plan(
                1 + self.reserve_pages - self.payload_pages.num_free - coming
            )
            for s in later or ():
                self._begin_reclaim(s)
            plan = plan + (later or [])
        else:
            plan = self._reclaim_plan(1 + self.reserve_pages - free)
            if plan is None:
                plan = self._reclaim_plan(1 - free)
            assert plan is not None, "admit called without can_admit"
            for s in plan:
                self._reclaim(s)
        if holders or plan:
            self.stats_adaptive["reclaim_events_total"] += 1
        slot = self._alloc_slot(prefix, max_new_tokens)
        try:
            self._reserve_history(slot, prefix)
        except BaseException:
            self.release(slot)  # frees the optional pages registered so far too
            raise
        return slot

    def _reserve_history(self, slot: int, prefix: PrefixKV) -> None:
        """Resident-first: complete prompt pages stay on device while pages are spare. Their
        pages are taken and published here; ``import_history`` fills them."""
        T, G = prefix.num_tokens, self.G
        nc = T // G if self.optional_on else 0
        r = _Residency(
            order=self._seq,
            num_complete=nc,
            page=[-1] * nc,
            ready=[False] * nc,
            backed=[False] * nc,
        )
        self._seq += 1
        self.res[slot] = r
        keep = r.kept = min(nc, self._spare())
        if keep:
            pages = self._alloc_optional(keep, slot)
            r.page[:keep] = pages  # registered before any copy, so release finds them
            r.ready[:keep] = [True] * keep
            self.direct_table[:, slot, :keep] = self.page_units[:, to_device(pages, self.device)]
            self.stats_adaptive["resident_first_pages_total"] += keep
            self.stats_adaptive["deferred_backup_pages_total"] += keep
        r.backed[keep:] = [True] * (nc - keep)  # the import backs them up

    def _import_rows(self, slot: int, prefix: PrefixKV) -> None:
        G, r = self.G, self.res[slot]
        keep = r.kept
        if keep:  # one row-copy launch for every kept page of every source
            dst = self._unit_rows(to_device(r.page[:keep], self.device))  # (source, page, row)
            # each source's kept rows are the first keep * G rows of its slice of the prefix;
            # the prefix read as one flat pool names them without a reshaped copy of the kept
            # history (hundreds of MB at 125K tokens). A word-wide copy kernel, not an indexed
            # assignment of uint8 rows, which moves one byte per thread: the handoff's SM time
            # is taken from the decode steps that run beside it
            kv = prefix.kv.to(self.device).contiguous()
            S, T = kv.shape[0], kv.shape[1]
            first = torch.arange(S, device=self.device).view(-1, 1) * T
            src = (first + torch.arange(keep * G, device=self.device)).view(-1)
            copy_rows(
                kv.view(1, S * T, kv.shape[-1]),
                self.kv_flat.unsqueeze(0),
                src,
                dst,
                self.copy_impl,
                self._copy_programs(),
            )
        # everything not kept on device goes to host now (incl. the partial boundary page)
        self._backup(slot, keep * G, prefix.num_tokens, prefix.kv[:, keep * G :])

    def _reclaim(self, slot: int) -> None:
        """Back up the request's unbacked optional pages, then retire all of them.

        The backups of every unbacked page go in one kernel launch (systems/kernels/backup.py),
        as the commit's tail backups do: a copy per page and source would be ~20,000 copies for
        one 50K-token request, tens of milliseconds of launches on the decode stream. Nothing is
        marked backed or retired until the launch is queued, so a failure leaves every page as
        it was. A request whose reclaim already runs off the decode stream waits for it."""
        if slot in self.reclaiming:
            self._finish_reclaim(slot, wait=True)
            return
        unbacked = self._unbacked(slot)
        self._backup_pages(slot, unbacked)
        self.stats_adaptive["reclaim_backup_pages_sync_total"] += len(unbacked)
        self._retire(slot, unbacked)

    def _unbacked(self, slot: int) -> list[int]:
        """The slot's optional pages without a complete host copy (resident-first pages)."""
        r = self.res[slot]
        return [j for j, pg in enumerate(r.page) if pg >= 0 and not r.backed[j]]

    def _backup_pages(self, slot: int, pages: list[int]) -> None:
        """One launch that copies the slot's prompt pages ``pages`` to host, on the current
        stream."""
        if not pages:
            return
        r = self.res[slot]
        with nvtx_range(BACKUP):
            dev_rows, host_rows = self._page_rows([(slot, r.page[j], j) for j in pages])
            backup_rows(
                *self._flat_pools(), dev_rows, host_rows, self.copy_impl, self._copy_programs()
            )
        self.backup_rows += dev_rows.numel()

    def _retire(self, slot: int, copied: list[int]) -> None:
        """Every optional page of the slot leaves the direct table and goes back to the pools:
        ``copied``, the pages just backed up, now have host copies as the others had."""
        r = self.res[slot]
        for j in copied:
            r.backed[j] = True
        owned = [j for j, pg in enumerate(r.page) if pg >= 0]
        if not owned:
            return
        self.direct_table[:, slot] = -1  # every published page of the slot retires
        self._after_population(r)
        self._free_optional([r.page[j] for j in owned])
        for j in owned:
            r.pending.pop(j, None)  # a page still being populated already has a host copy
            r.page[j], r.ready[j] = -1, False
        self.stats_adaptive["reclaimed_pages_total"] += len(owned)

    def _begin_reclaim(self, slot: int) -> None:
        """Eq. 4 off the decode stream: the request's unbacked optional pages are copied to host
        on the handoff stream (after the decode stream's work so far, which computed the rows'
        lists) while decode steps keep reading them; ``_finish_reclaims`` retires them once the
        copies are done (sec. 3.1: a page retires after its backup and earlier readers)."""
        unbacked = self._unbacked(slot)
        if not unbacked:  # nothing to copy: its pages can go now
            self._retire(slot, [])
            return
        stream = self._handoff(True)
        self._on_stream(stream, lambda: self._backup_pages(slot, unbacked))
        self.reclaiming[slot] = (self._copies_done(stream), unbacked)
        self.stats_adaptive["reclaim_backup_pages_async_total"] += len(unbacked)

    def _order_after(self, ev) -> None:
        """Everything queued on the decode stream from now on runs after ``ev``'s copies: a
        wait on the device, so the host goes on queueing (the handoff stream is ordered after
        them already: one stream). A stand-in event without a device is waited for."""
        if isinstance(ev, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(ev)
        elif ev is not None:
            ev.synchronize()

    def _finish_reclaim(self, slot: int, wait: bool = False) -> bool:
        """Retire a background reclaim's pages if its copies are done, or (``wait``) now, with
        the decode stream's later work ordered after the copies: the pages' next users and the
        victim's host fetches. Whether it finished."""
        ev, unbacked = self.reclaiming[slot]
        if ev is not None:
            if wait:
                self._order_after(ev)
            elif not ev.query():
                return False
        del self.reclaiming[slot]
        self._retire(slot, unbacked)
        return True

    def _finish_reclaims(self) -> None:
        for slot in list(self.reclaiming):
            self._finish_reclaim(slot)

    def release(self, slot: int) -> None:
        if slot not in self.active_slots:
            return
        if slot in self.reclaiming:
            # its backup still reads the pages about to be freed and writes the slot's host
            # rows, which the slot's next request may write: their next users come after it
            self._order_after(self.reclaiming.pop(slot)[0])
        r = self.res.pop(slot, None)
        if r is not None:
            self._after_population(r)
            self._free_optional([p for p in r.page if p >= 0])
            self.direct_table[:, slot] = -1
        super().release(slot)

    # ------------------------------------------------------------------ page rows
    def _unit_rows(self, pages: torch.Tensor) -> torch.Tensor:
        """kv_flat rows of device pages, ordered (source, page, row): [S * N * G]."""
        units = self.page_units[:, pages].long()
        return (units.unsqueeze(2) * self.G + torch.arange(self.G, device=self.device)).view(-1)

    def _flat_pools(self):
        """kv_flat and the host store as one-source pools: a lent page's sources are not one
        row apart, so copies name a row per source (_page_rows)."""
        return self.kv_flat.unsqueeze(0), self.host_pool.view(1, -1, self.host_pool.shape[-1])

    def _page_rows(self, pages: list[tuple[int, int, int]]):
        """(kv_flat rows, flat host rows) of whole prompt pages, each (slot, device page, prompt
        page j), ordered (source, page, row). Prompt page j holds positions [jG, (j+1)G), the
        slot's host page j holds the same positions (both pools' pages are G rows), so a page
        pair names G rows per source on each side: one host->device copy of 2 ids per page,
        expanded on the device (a 50K-token request's row lists were ~100K Python ints per
        reclaim, milliseconds of the engine thread)."""
        hp = [self._slot_pages[s][1][j] for s, _, j in pages]
        ids = to_device([*(pg for _, pg, _ in pages), *hp], self.device)
        N, G, ar = len(pages), self.G, torch.arange(self.G, device=self.device)
        dev_rows = self._unit_rows(ids[:N])
        first = torch.arange(self.S, device=self.device) * self.host_pool.shape[1]
        host = ids[N:].unsqueeze(1) * G + ar  # (N, G) within each source's store
        host_rows = (first.view(-1, 1, 1) + host.unsqueeze(0)).view(-1)
        return dev_rows, host_rows

    # ------------------------------------------------------------------ population
    def _populate(self) -> None:
        """Bounded round-robin: copy host history into free pages, publish after completion.
        The step's pages are restored in one kernel launch (systems/kernels/backup.py): a
        [S, G, rb] slice is strided on both sides, and a copy_ across devices stages it through
        contiguous temporaries, a CPU copy on the engine thread per page."""
        budget = min(self.populate_pages_per_step, self._spare())
        # arrived only, and not being reclaimed
        slots = sorted(s for s in self.res if s not in self.importing and s not in self.reclaiming)
        if budget <= 0 or not slots or not self.optional_on:
            return
        n = len(slots)
        taken: list[tuple[_Residency, int]] = []  # (request, prompt page) restored this step
        pages: list[tuple[int, int, int]] = []  # (slot, device page, prompt page)
        stream = None
        try:
            for i in range(n):
                if budget <= 0:
                    break
                s = slots[(self._rr + i) % n]
                r = self.res[s]
                j = -1
                while budget > 0:
                    # the next prompt page without a device page, found at C speed: a Python
                    # walk over every page of every request (256 x 60 at the DeepSeek-like
                    # preset's top load) costs milliseconds a step whenever memory is spare
                    try:
                        j = r.page.index(-1, j + 1, r.num_complete)
                    except ValueError:
                        break
                    assert r.backed[j]
                    pg = self._alloc_optional(1, s)[0]
                    r.page[j] = pg
                    taken.append((r, j))
                    pages.append((s, pg, j))
                    budget -= 1
            self._rr = (self._rr + 1) % max(1, n)
            if not taken:
                return
            stream = self._populate_stream()
            self._on_stream(stream, lambda: self._restore_pages(pages))
        except BaseException:  # the pages go back as they were
            if stream is not None:
                stream.synchronize()  # whatever was queued has written them
            self._free_optional([r.page[j] for r, j in taken])
            for r, j in taken:
                r.page[j] = -1
            raise
        if stream is not None:
            ev = self._copies_done(stream)
        elif self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
        else:
            ev = None
        for r, j in taken:
            r.pending[j] = ev
        self.stats_adaptive["populated_pages_total"] += len(taken)

    def _populate_stream(self):
        """Where population copies run: a stream of their own (``async_populate``, on a GPU),
        else None, in order on the decode stream. Not the handoff stream: a population event
        there would also cover the imports queued before it, and a release that orders the
        decode stream after its pages' population would wait for those imports too."""
        return self._side_stream("populate", self.async_populate)

    def _restore_pages(self, pages: list[tuple[int, int, int]]) -> None:
        """One launch that copies prompt pages (slot, device page, prompt page j) from their
        host copies into their device pages, on the current stream."""
        dev_rows, host_rows = self._page_rows(pages)
        kv, host = self._flat_pools()
        restore_rows(host, kv, host_rows, dev_rows, self.copy_impl, self._copy_programs())

    def _after_population(self, r: _Residency) -> None:
        """Before the request's pages go back to the pools: the decode stream's later work is
        ordered after the population copies still writing any of them (on the population's
        stream, ``async_populate``), since a page's next user may be a hot cache a step
        writes."""
        for ev in {id(ev): ev for ev in r.pending.values() if ev is not None}.values():
            self._order_after(ev)

    def _publish(self) -> None:
        """Pages whose population copy has completed become ready: all of a step's go into the
        direct table in one indexed write (a write per page was a kernel launch each, ~25 a
        step on the DeepSeek-like preset at C8, whose step is host-bound)."""
        done: list[tuple[int, int, int]] = []  # (slot, prompt page, device page)
        for s, r in self.res.items():
            for j in [j for j, ev in r.pending.items() if ev is None or ev.query()]:
                del r.pending[j]
                r.ready[j] = True
                done.append((s, j, r.page[j]))
        if len(done) == 1:
            s, j, pg = done[0]
            self.direct_table[:, s, j] = self.page_units[:, pg]
        elif done:
            idx = to_device([x for col in zip(*done) for x in col], self.device, torch.long)
            slot, page, unit = idx.view(3, -1)
            self.direct_table[:, slot, page] = self.page_units[:, unit]

    # ------------------------------------------------------------------ step hooks
    def host_prepare(self) -> None:
        with nvtx_range(BOOKKEEPING):
            self._finish_reclaims()
            self._publish()

    def _direct_pages(self):
        return self.direct_table if self.optional_on else None

    def end_step(self) -> None:
        super().end_step()
        with nvtx_range(POPULATE):
            self._populate()

    # ------------------------------------------------------------------ reports
    def coverage(self) -> float:
        """Ready optional history over eligible history (complete prompt pages)."""
        rs = list(self.res.values())
        elig = sum(r.num_complete for r in rs)
        ready = sum(sum(r.ready) for r in rs)
        return ready / elig if elig else 0.0

    def memory_report(self) -> MemoryReport:
        rep = super().memory_report()
        opt = self.optional_pages * self.payload_page_bytes
        # optional payload pages are counted as optional, not required (lent pages lie in free
        # slots' index history, which required memory does not count)
        in_payload = sum(self._payload_pages_of(r) for r in list(self.res.values()))
        rep.required -= in_payload * self.payload_page_bytes
        rep.components["hot_cache_and_tail"] -= in_payload * self.payload_page_bytes
        rep.optional = opt
        # the part of the reserve that required allocations took (no optional page was left to
        # reclaim for it) is not held back
        rep.reserve = min(self.reserve_pages, self.payload_pages.num_free) * self.payload_page_bytes
        rep.components["optional_history"] = opt
        return rep

    def check_integrity(self) -> None:
        pages_ok_before = self.payload_pages.num_used
        owned = [p for r in self.res.values() for p in r.page if p >= 0]
        assert len(owned) == len(set(owned)), "an optional page owned twice"
        hot = {pg for pg, _ in self._slot_pages.values()}
        assert not (hot & set(owned)), "a page both hot/tail and optional"
        in_payload = [p for p in owned if not self._is_lent(p)]
        assert pages_ok_before == len(hot) + len(in_payload), "payload pages leaked"
        lent = {p: s for s, r in self.res.items() for p in r.page if self._is_lent(p)}
        assert lent == self._lent_holder, "lent pages and their holders disagree"
        assert set(self.reclaiming) <= set(self.res), "a reclaim in flight without its request"
        for s, (_, unbacked) in self.reclaiming.items():
            # a victim's pages stay held and published until its copies are done
            assert s not in self.importing, f"slot {s} reclaimed while its handoff copies"
            r = self.res[s]
            assert all(r.page[j] >= 0 and r.ready[j] for j in unbacked), f"slot {s} retired early"
        assert self._lent_free == set(self._lendable_scan()), "the free lent pages drifted"
        for p in lent:
            # a lent page lies in free slots' index history: an admission reclaims it first
            busy = [x for x in self.lent_slots[p - self.num_payload] if x in self.active_slots]
            assert not busy, f"lent page {p} in the index region of active slot(s) {busy}"
        rep = self.memory_report()
        assert rep.required + rep.optional <= rep.capacity
        for s, r in self.res.items():
            for j in range(r.num_complete):
                # sec. 3.1: every row is ready on the device or has a complete host copy
                assert r.ready[j] or r.backed[j], f"slot {s} page {j}: neither ready nor backed"
                assert not (r.ready[j] and r.page[j] < 0)
        dt = self.direct_table.cpu().tolist()  # [S][slot][page]: one copy, then Python
        units = self._page_units_host
        for s in range(self.num_slots):
            r = self.res.get(s)
            for j in range(len(dt[0][s])):
                v = [d[s][j] for d in dt]
                if v[0] >= 0:
                    assert r is not None and j < r.num_complete and r.ready[j], (
                        f"direct table publishes slot {s} page {j} not ready"
                    )
                    want = [u[r.page[j]] for u in units]
                    assert v == want, f"direct table: slot {s} page {j} at units {v}, not {want}"
                else:
                    assert set(v) == {-1}, f"direct table: slot {s} page {j} half published"
        # the base checks use HiSparse's page count: hot/tail pages only
        super().check_integrity_base()

    def metrics(self, sync: bool = True) -> dict[str, float]:
        m = super().metrics(sync)
        m["dhs_ready_optional_coverage"] = self.coverage()
        m["dhs_optional_pages"] = self.optional_pages
        m["dhs_optional_pages_lent"] = len(self._lent_holder)  # in free slots' index history
        m["dhs_reclaims_in_flight"] = len(self.reclaiming)
        for k, v in dict(self.stats_adaptive).items():
            m[f"dhs_{k}"] = v
        return m
