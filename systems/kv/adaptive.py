"""Adaptive residency (paper sec. 3.1-3.2): HiSparse plus optional history that follows load.

The hot cache and tail stay exactly as in HiSparse (required, never lent). Payload pages that no
required allocation holds can carry *optional history*: complete pages of a request's imported
prompt (page j covers positions [j*G, (j+1)*G)), found by the resolver through the direct page
table before it scans the hot cache (Fig. 2, callout 1).

- Resident-first admission: a new request keeps its imported history on device in optional
  pages while pages are spare, and its host backup is deferred. Only the partial boundary page
  goes to host at once. A page without host backing is never retired before its backup.
- Reclaim (eq. 4): an admission short of D pages walks admitted requests in reclaim order and
  takes whole requests until their optional pages cover D; their unbacked pages are copied to
  host, then retired. If all optional pages cannot cover D, the admission waits
  (reason ``reclaim_insufficient``).
- Population: while pages are free beyond the admission reserve, a bounded round-robin pass
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
from systems.kernels.backup import backup_rows, restore_rows
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
        return sum(1 for p in self.page if p >= 0)


RECLAIM_ORDERS = ("newest_first", "oldest_first", "largest_first")


@dataclass(frozen=True)
class AdaptiveOptions(HiSparseOptions):
    """``system.kv`` of adaptive residency: HiSparse's knobs plus the residency policy."""

    optional_residency: bool = True  # false: the same build with residency off (Fig. 6)
    admission_reserve_pages: int = 1  # M_res, in payload pages
    populate_pages_per_step: int = 4  # bounded population work per engine step
    reclaim_order: str = "newest_first"  # eq. 4's order over admitted requests

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
        self.direct_table = torch.full(
            (self.num_slots, self.max_host_pages), -1, dtype=torch.int32, device=self.device
        )
        self.res: dict[int, _Residency] = {}
        self._seq = 0
        self._rr = 0  # round-robin cursor of population
        self.stats_adaptive = {
            "reclaimed_pages_total": 0,
            "reclaim_events_total": 0,
            "populated_pages_total": 0,
            "deferred_backup_pages_total": 0,
            "resident_first_pages_total": 0,
        }

    # ------------------------------------------------------------------ accounting
    @property
    def optional_pages(self) -> int:
        return sum(r.num_pages for r in self.res.values())

    def _spare(self) -> int:
        """Pages free beyond the admission reserve."""
        return self.payload_pages.num_free - self.reserve_pages

    def _required_free(self):
        # one hot/tail page is needed; the reserve may be used by admission itself
        if self.payload_pages.num_free >= 1:
            return True, ""
        if self.optional_on and self._reclaim_plan(1 - self.payload_pages.num_free) is not None:
            return True, ""
        return False, "reclaim_insufficient" if self.optional_pages else "kv_pool_full"

    def _ordered(self) -> list[int]:
        # a slot whose handoff is still copying into its pages is not reclaimed: its pages'
        # bytes are not there yet
        slots = [s for s in self.res if s not in self.importing]
        key = {
            "newest_first": lambda s: -self.res[s].order,
            "oldest_first": lambda s: self.res[s].order,
            "largest_first": lambda s: (-self.res[s].num_pages, self.res[s].order),
        }
        return sorted(slots, key=key[self.reclaim_order])

    def _reclaim_plan(self, deficit: int) -> list[int] | None:
        """Eq. 4: the shortest prefix of the reclaim order whose optional pages cover deficit."""
        if deficit <= 0:
            return []
        plan, got = [], 0
        for s in self._ordered():
            n = self.res[s].num_pages
            if n == 0:
                continue
            plan.append(s)
            got += n
            if got >= deficit:
                return plan
        return None

    # ------------------------------------------------------------------ admission
    def reserve(self, prefix: PrefixKV, max_new_tokens: int) -> int:
        if self.payload_pages.num_free < 1:
            plan = self._reclaim_plan(1 - self.payload_pages.num_free)
            assert plan is not None, "admit called without can_admit"
            for s in plan:
                self._reclaim(s)
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
        keep = r.kept = min(nc, max(0, self._spare()))
        if keep:
            pages = self.payload_pages.alloc(keep)
            r.page[:keep] = pages  # registered before any copy, so release finds them
            r.ready[:keep] = [True] * keep
            self.direct_table[slot, :keep] = to_device(pages, self.device, torch.int32)
            self.stats_adaptive["resident_first_pages_total"] += keep
            self.stats_adaptive["deferred_backup_pages_total"] += keep
        r.backed[keep:] = [True] * (nc - keep)  # the import backs them up

    def _import_rows(self, slot: int, prefix: PrefixKV) -> None:
        G, r = self.G, self.res[slot]
        keep = r.kept
        if keep:  # one indexed copy for every kept page: a copy per page costs host time each
            pages = to_device(r.page[:keep], self.device)
            rows = (pages.unsqueeze(1) * G + torch.arange(G, device=self.device)).view(-1)
            self.kv_pool[:, rows] = prefix.kv[:, : keep * G]
        # everything not kept on device goes to host now (incl. the partial boundary page)
        self._backup(slot, keep * G, prefix.num_tokens, prefix.kv[:, keep * G :])

    def _reclaim(self, slot: int) -> None:
        """Back up the request's unbacked optional pages, then retire all of them.

        The backups of every unbacked page go in one kernel launch (systems/kernels/backup.py),
        as the commit's tail backups do: a copy per page and source would be ~20,000 copies for
        one 50K-token request, tens of milliseconds of launches on the decode stream. Nothing is
        marked backed or retired until the launch is queued, so a failure leaves every page as
        it was."""
        r = self.res[slot]
        owned = [j for j, pg in enumerate(r.page) if pg >= 0]
        unbacked = [j for j in owned if not r.backed[j]]
        if unbacked:
            with nvtx_range(BACKUP):
                dev_rows, host_rows = self._page_rows([(slot, r.page[j], j) for j in unbacked])
                backup_rows(self.kv_pool, self.host_pool, dev_rows, host_rows, self.backup_impl)
            self.backup_rows += dev_rows.numel()
            for j in unbacked:
                r.backed[j] = True
        if not owned:
            return
        self.direct_table[slot] = -1  # every published page of the slot retires
        self.payload_pages.free([r.page[j] for j in owned])
        for j in owned:
            r.pending.pop(j, None)  # a page still being populated already has a host copy
            r.page[j], r.ready[j] = -1, False
        self.stats_adaptive["reclaimed_pages_total"] += len(owned)

    def release(self, slot: int) -> None:
        if slot not in self.active_slots:
            return
        r = self.res.pop(slot, None)
        if r is not None:
            self.payload_pages.free([p for p in r.page if p >= 0])
            self.direct_table[slot] = -1
        super().release(slot)

    # ------------------------------------------------------------------ page rows
    def _page_rows(self, pages: list[tuple[int, int, int]]):
        """(device rows, host rows) of whole prompt pages, each (slot, device page, prompt page
        j). Prompt page j holds positions [jG, (j+1)G), the slot's host page j holds the same
        positions (both pools' pages are G rows), so a page pair names G rows on each side: one
        host->device copy of 2 ids per page, expanded on the device (a 50K-token request's row
        lists were ~100K Python ints per reclaim, milliseconds of the engine thread)."""
        hp = [self._slot_pages[s][1][j] for s, _, j in pages]
        ids = to_device([*(pg for _, pg, _ in pages), *hp], self.device)
        N, ar = len(pages), torch.arange(self.G, device=self.device)
        dev_rows = (ids[:N].unsqueeze(1) * self.G + ar).reshape(-1)
        host_rows = (ids[N:].unsqueeze(1) * self.G + ar).reshape(-1)
        return dev_rows, host_rows

    # ------------------------------------------------------------------ population
    def _populate(self) -> None:
        """Bounded round-robin: copy host history into free pages, publish after completion.
        The step's pages are restored in one kernel launch (systems/kernels/backup.py): a
        [S, G, rb] slice is strided on both sides, and a copy_ across devices stages it through
        contiguous temporaries, a CPU copy on the engine thread per page."""
        budget = min(self.populate_pages_per_step, self._spare())
        slots = sorted(s for s in self.res if s not in self.importing)  # arrived only
        if budget <= 0 or not slots or not self.optional_on:
            return
        n = len(slots)
        taken: list[tuple[_Residency, int]] = []  # (request, prompt page) restored this step
        pages: list[tuple[int, int, int]] = []  # (slot, device page, prompt page)
        try:
            for i in range(n):
                if budget <= 0:
                    break
                s = slots[(self._rr + i) % n]
                r = self.res[s]
                for j in range(r.num_complete):
                    if budget <= 0:
                        break
                    if r.page[j] >= 0:
                        continue
                    assert r.backed[j]
                    pg = self.payload_pages.alloc(1)[0]
                    r.page[j] = pg
                    taken.append((r, j))
                    pages.append((s, pg, j))
                    budget -= 1
            self._rr = (self._rr + 1) % max(1, n)
            if not taken:
                return
            dev_rows, host_rows = self._page_rows(pages)
            restore_rows(self.host_pool, self.kv_pool, host_rows, dev_rows, self.backup_impl)
        except BaseException:  # nothing was queued: the pages go back as they were
            self.payload_pages.free([r.page[j] for r, j in taken])
            for r, j in taken:
                r.page[j] = -1
            raise
        ev = None
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
        for r, j in taken:
            r.pending[j] = ev
        self.stats_adaptive["populated_pages_total"] += len(taken)

    def _publish(self) -> None:
        for s, r in self.res.items():
            done = [j for j, ev in r.pending.items() if ev is None or ev.query()]
            for j in done:
                del r.pending[j]
                r.ready[j] = True
                self.direct_table[s, j] = r.page[j]

    # ------------------------------------------------------------------ step hooks
    def host_prepare(self) -> None:
        with nvtx_range(BOOKKEEPING):
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
        elig = sum(r.num_complete for r in self.res.values())
        ready = sum(sum(r.ready) for r in self.res.values())
        return ready / elig if elig else 0.0

    def memory_report(self) -> MemoryReport:
        rep = super().memory_report()
        opt = self.optional_pages * self.payload_page_bytes
        rep.required -= opt  # the pages of optional history are counted as optional, not required
        rep.components["hot_cache_and_tail"] -= opt
        rep.optional = opt
        rep.reserve = self.reserve_pages * self.payload_page_bytes
        rep.components["optional_history"] = opt
        return rep

    def check_integrity(self) -> None:
        pages_ok_before = self.payload_pages.num_used
        owned = [p for r in self.res.values() for p in r.page if p >= 0]
        assert len(owned) == len(set(owned)), "an optional page owned twice"
        hot = {pg for pg, _ in self._slot_pages.values()}
        assert not (hot & set(owned)), "a page both hot/tail and optional"
        assert pages_ok_before == len(hot) + len(owned), "payload pages leaked"
        rep = self.memory_report()
        assert rep.required + rep.optional <= rep.capacity
        for s, r in self.res.items():
            for j in range(r.num_complete):
                # sec. 3.1: every row is ready on the device or has a complete host copy
                assert r.ready[j] or r.backed[j], f"slot {s} page {j}: neither ready nor backed"
                assert not (r.ready[j] and r.page[j] < 0)
        dt = self.direct_table.cpu()
        for s in range(self.num_slots):
            r = self.res.get(s)
            for j in range(dt.shape[1]):
                v = int(dt[s, j])
                if v >= 0:
                    assert r is not None and j < r.num_complete and r.ready[j] and r.page[j] == v, (
                        f"direct table publishes slot {s} page {j} not ready"
                    )
        # the base checks use HiSparse's page count: hot/tail pages only
        super().check_integrity_base()

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        m["dhs_ready_optional_coverage"] = self.coverage()
        m["dhs_optional_pages"] = self.optional_pages
        for k, v in self.stats_adaptive.items():
            m[f"dhs_{k}"] = v
        return m
