import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from systems.engine.request import Request, SamplingParams
from tests.helpers import SlowCopy, make_engine

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())


def _engine(*extra, pool="0.01"):
    return make_engine(
        "system=adaptive_hisparse",
        "system.kv.hot_cache_rows=8",
        f"hardware.kv_pool_gib={pool}",
        "system.kv.verify_rows=true",
        *extra,
    )


def _tight_pool(model: str, *extra) -> str:
    """A pool where the 5 golden requests fit as hot caches but not with all their history
    (8 slots: the index store of more slots than the pool has hot caches for would be
    converted into hot caches, see test_running_requests_are_capped_at_what_the_pool_holds)."""
    eng = _engine(f"model={model}", "hardware.max_running_requests=8", *extra)
    be = eng.backend
    need_pages = 5 + 3  # 5 hot/tail pages + a little room: most optional history must go
    index = be.index_pages.num_pages * be.index_page_bytes
    unit = be.G * be.mcfg.row_bytes  # aligns an index store lent to optional history
    return repr((index + need_pages * be.payload_page_bytes + unit) / (1 << 30))


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
@pytest.mark.parametrize("residency", ["true", "false"])
def test_golden_tokens_with_reclaim_mid_decode(model, residency):
    eng = _engine(
        f"model={model}",
        f"system.kv.optional_residency={residency}",
        "system.kv.admission_reserve_pages=0",
        "hardware.max_running_requests=8",
        pool=_tight_pool(model),
    )
    # first two requests take the spare pages as optional history; later ones force reclaim
    reqs = []
    for p in GOLDEN["prompts"]:
        r = Request(eng.new_rid(), p, SamplingParams(max_new_tokens=GOLDEN["max_new_tokens"]))
        reqs.append(r)
    for r in reqs[:2][::-1]:
        eng.submit(r)
    for _ in range(3):
        eng.step()
        eng.backend.check_integrity()
    for r in reqs[2:]:
        eng.submit(r)
    while eng.scheduler.running or eng.scheduler.waiting:
        eng.step()
        eng.backend.check_integrity()
    assert [r.output_ids for r in reqs] == GOLDEN["outputs"][model]
    st_ = eng.backend.stats_adaptive
    if residency == "true":
        assert st_["resident_first_pages_total"] > 0
        assert st_["reclaim_events_total"] > 0
    else:
        assert st_["resident_first_pages_total"] == 0 and eng.backend.optional_pages == 0
    assert eng.backend.is_empty and eng.backend.payload_pages.num_used == 0


def _slow_reclaims(be, polls: int) -> list[SlowCopy]:
    made: list[SlowCopy] = []

    def event(stream):
        made.append(SlowCopy(polls))
        return made[-1]

    be._copies_done = event  # the reclaims' (admit asks only on a GPU)
    return made


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_reclaims_off_the_decode_stream_give_the_golden_tokens(model):
    """system.kv.async_reclaim: the reserve's victims back up while decode steps keep reading
    their pages, which retire only when the copies are done (here a stand-in event pending for
    a few polls). Every resolved row is checked against its source (verify_rows), the sec. 3.1
    invariant after every step, and the tokens are the golden ones."""
    extra = ("system.kv.async_reclaim=true", "hardware.max_running_requests=8")
    eng = _engine(f"model={model}", *extra, pool=_tight_pool(model, *extra))
    be = eng.backend
    copies = _slow_reclaims(be, polls=3)
    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=GOLDEN["max_new_tokens"]))
        for p in GOLDEN["prompts"]
    ]
    for r in reqs[:2][::-1]:
        eng.submit(r)
    for _ in range(3):
        eng.step()
    for r in reqs[2:]:
        eng.submit(r)
    steps_in_flight: dict[int, int] = {}  # victim -> steps it ran with its reclaim pending
    while eng.scheduler.running or eng.scheduler.waiting or eng.scheduler.arriving:
        for slot in be.reclaiming:  # a victim keeps reading its published pages meanwhile
            steps_in_flight[slot] = steps_in_flight.get(slot, 0) + 1
            assert any(pg >= 0 for pg in be.res[slot].page)
        eng.step()
        be.check_integrity()
    assert [r.output_ids for r in reqs] == GOLDEN["outputs"][model]
    # retired only once its stand-in said done (3 polls, one a step), not at the next step
    assert copies and max(steps_in_flight.values()) >= 3 and not be.reclaiming
    assert be.stats_adaptive["reclaim_backup_pages_async_total"] > 0
    assert be.is_empty and be.payload_pages.num_used == 0


def _random_arrivals(model: str, async_reclaim: str, seed: int, polls: int = 8):
    """Twenty requests of random lengths and caps arriving a few per step into a tight pool
    (reserve 2): (their tokens, how the reclaims in flight ended, the admission waits)."""
    import random

    extra = (
        f"system.kv.async_reclaim={async_reclaim}",
        "hardware.max_running_requests=8",
        "system.kv.admission_reserve_pages=2",
    )
    eng = _engine(f"model={model}", *extra, pool=_tight_pool(model, *extra))
    be = eng.backend
    copies = _slow_reclaims(be, polls)
    rng = random.Random(seed)
    reqs = [
        Request(
            eng.new_rid(),
            [rng.randrange(2, 500) for _ in range(rng.randrange(20, 160))],
            SamplingParams(max_new_tokens=rng.randrange(2, 12)),
        )
        for _ in range(20)
    ]
    i = 0
    while i < len(reqs) or not eng.is_idle:
        for _ in range(rng.randrange(0, 3)):
            if i < len(reqs):
                eng.submit(reqs[i])
                i += 1
        eng.step()
        be.check_integrity()
    assert be.is_empty and not be.reclaiming and be.payload_pages.num_used == 0
    return [r.output_ids for r in reqs], copies, dict(eng.scheduler.wait_reason_counts)


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_reclaims_in_flight_under_random_arrivals_give_the_synchronous_tokens(model):
    """Through the engine, with requests finishing while their reclaim copies (the release
    waits for them) and admissions meeting reclaims in flight: the tokens of synchronous
    reclaims, rows verified and the invariant checked every step."""
    waited = in_flight = 0
    for seed in (0, 3):
        want, _, _ = _random_arrivals(model, "false", seed)
        got, copies, waits = _random_arrivals(model, "true", seed)
        assert got == want
        waited += sum(c.waited for c in copies)
        in_flight += waits.get("reclaim_in_flight", 0)
    assert waited and in_flight


def test_an_admission_waits_for_a_reclaim_in_flight_and_a_release_for_its_copies():
    """With no payload page free and a reclaim's pages on their way, an admission waits
    (reason reclaim_in_flight) instead of taking more victims; releasing the victim meanwhile
    waits for its copies (they read the pages it frees) and frees everything."""
    import torch

    extra = ("system.kv.async_reclaim=true", "hardware.max_running_requests=8")
    eng = _engine(*extra, pool=_tight_pool("tiny", *extra))
    be = eng.backend
    copies = _slow_reclaims(be, polls=10**6)
    g = torch.Generator().manual_seed(0)
    while not be.reclaiming:  # long requests until one admission starts a reclaim
        e = eng.prefixes.get(torch.randint(2, 512, (130,), generator=g).tolist())[0]
        assert be.can_admit(130, 8)[0]
        be.admit(e.prefix, 8, asynchronous=True)
        be.check_integrity()
    (victim,) = be.reclaiming
    while be.payload_pages.num_free:  # take what is free, as later admissions would
        e = eng.prefixes.get(torch.randint(2, 512, (24,), generator=g).tolist())[0]
        if not be.can_admit(24, 8)[0]:
            break
        be.admit(e.prefix, 8, asynchronous=True)
    assert be.payload_pages.num_free == 0
    assert be.can_admit(24, 8) == (False, "reclaim_in_flight")
    be._finish_reclaims()  # still copying: nothing retires
    assert victim in be.reclaiming and any(pg >= 0 for pg in be.res[victim].page)
    be.release(victim)
    assert copies[0].waited and victim not in be.reclaiming
    be.check_integrity()
    for s in list(be.active_slots):
        be.release(s)
    assert be.is_empty and be.payload_pages.num_used == 0


def test_reclaim_plan_is_the_minimal_prefix_of_the_order():
    eng = _engine("system.kv.reclaim_order=oldest_first")
    be = eng.backend
    from systems.kv.adaptive import _Residency

    for slot, n in ((0, 3), (1, 1), (2, 4)):
        be.res[slot] = _Residency(
            order=slot,
            num_complete=n,
            page=list(range(10 * slot, 10 * slot + n)),
            ready=[True] * n,
            backed=[False] * n,
        )
    assert be._reclaim_plan(0) == []
    assert be._reclaim_plan(3) == [0]
    assert be._reclaim_plan(4) == [0, 1]
    assert be._reclaim_plan(5) == [0, 1, 2]
    assert be._reclaim_plan(9) is None  # uncoverable: the admission waits
    be.reclaim_order = "newest_first"
    assert be._reclaim_plan(4) == [2]
    be.res.clear()


def test_uncoverable_deficit_waits_then_admits():
    """No free hot-cache page and nothing optional to reclaim: admission waits (kv_pool_full),
    then admits once a page is free. (The slot count never exceeds the hot caches the pool
    holds, so the pages are taken by hand here.)"""
    eng = _engine(
        "hardware.max_running_requests=16",
        pool=_tight_pool("tiny", "hardware.max_running_requests=16"),
    )
    be = eng.backend
    assert be.payload_pages.num_pages >= be.num_slots
    taken = be.payload_pages.alloc(be.payload_pages.num_free)
    p = GOLDEN["prompts"][0]  # 5 tokens: no complete page, nothing optional to reclaim
    assert be.can_admit(len(p), 6) == (False, "kv_pool_full")
    r = Request(eng.new_rid(), p, SamplingParams(max_new_tokens=6))
    eng.submit(r)
    eng.step()
    assert not eng.scheduler.running and eng.scheduler.wait_reason == "kv_pool_full"
    be.payload_pages.free(taken)
    eng.run_until_idle()
    assert len(r.output_ids) == 6
    eng.backend.check_integrity()


def _population_engine():
    """A tight pool, no reserve, population one page a step."""
    return _engine(
        "system.kv.admission_reserve_pages=0",
        "system.kv.populate_pages_per_step=1",
        "hardware.max_running_requests=8",
        pool=_tight_pool("tiny"),
    )


def test_population_refills_after_load_falls():
    eng = _population_engine()
    be = eng.backend
    long = GOLDEN["prompts"][4]  # 130 tokens: 5 complete pages of G = 24
    a = Request(eng.new_rid(), long, SamplingParams(max_new_tokens=200))
    eng.submit(a)
    eng.step()
    cov0 = be.coverage()
    fillers = [Request(eng.new_rid(), long, SamplingParams(max_new_tokens=4)) for _ in range(4)]
    for r in fillers:
        eng.submit(r)
    for _ in range(2):
        eng.step()
    assert be.stats_adaptive["reclaim_events_total"] > 0
    low = be.coverage()
    assert low < cov0
    for _ in range(40):  # fillers finish; population refills one page per step
        eng.step()
        be.check_integrity()
    assert all(r.finish_reason for r in fillers)
    assert be.stats_adaptive["populated_pages_total"] > 0
    assert be.res[a.slot].num_complete and be.coverage() > low
    eng.abort(a)
    eng.step()
    be.check_integrity()
    assert be.is_empty


def _populating(polls: int = 3):
    """A population engine whose copies run "off the stream": each populate call's copies are
    done at once (CPU) but its stand-in event says so only after ``polls`` queries. Returns
    (engine, the long request, the stand-ins made)."""
    eng = _population_engine()
    be = eng.backend
    assert be.async_populate
    side, made = object(), []
    be._populate_stream = lambda: side
    be._on_stream = lambda stream, copies: copies()
    be._copies_done = lambda stream: made.append(SlowCopy(polls)) or made[-1]
    long = GOLDEN["prompts"][4]  # 130 tokens: 5 complete pages of G = 24
    a = Request(eng.new_rid(), long, SamplingParams(max_new_tokens=200))
    eng.submit(a)
    eng.step()
    fillers = [Request(eng.new_rid(), long, SamplingParams(max_new_tokens=4)) for _ in range(4)]
    for r in fillers:
        eng.submit(r)
    return eng, a, fillers, made


def _step_until_populating(eng, a, fillers, published=True) -> tuple[object, dict[int, int]]:
    """Steps until the fillers have finished, a page of ``a`` is being populated and (with
    ``published``) another has been published: (that page's stand-in, steps each stand-in's
    pages stayed pending)."""
    be = eng.backend
    pending_steps: dict[int, int] = {}
    for _ in range(60):  # fillers finish; population refills a page per step, off the stream
        eng.step()
        be.check_integrity()
        for ev in {id(e): e for q in be.res.values() for e in q.pending.values()}.values():
            pending_steps[id(ev)] = pending_steps.get(id(ev), 0) + 1
        r = be.res[a.slot]
        ready = be.coverage() > 0 or not published
        if ready and r.pending and all(f.finish_reason for f in fillers):
            return next(iter(r.pending.values())), pending_steps
    raise AssertionError("no page of the long request was being populated")


def test_population_off_the_decode_stream_publishes_when_done_and_frees_after_it():
    """system.kv.async_populate: a page being populated (its copy on a side stream, here a
    stand-in event pending for three polls, one a step) is published only once the copy is
    done, and a request released meanwhile orders the decode stream after the copy before its
    pages go back to the pools (their next user may be a hot cache a step writes)."""
    eng, a, fillers, made = _populating(polls=3)
    be = eng.backend
    copy, pending_steps = _step_until_populating(eng, a, fillers)
    done = [id(c) for c in made if c.left < 0 and not c.waited]
    # every published page stayed unpublished for its stand-in's three polls
    assert done and min(pending_steps[i] for i in done) >= 3
    assert be.stats_adaptive["populated_pages_total"] == len(made)
    eng.abort(a)
    eng.step()
    be.check_integrity()
    assert copy.waited
    assert be.is_empty and be.payload_pages.num_used == 0


def test_a_reclaim_of_pages_being_populated_waits_for_their_copy():
    """A request whose page is still being populated is reclaimed (its optional pages retire):
    the decode stream is ordered after the copy before the pages go back to the pools."""
    eng, a, fillers, made = _populating(polls=10**6)  # never done by itself
    be = eng.backend
    copy, _ = _step_until_populating(eng, a, fillers, published=False)
    be._reclaim(a.slot)
    assert copy.waited and not be.res[a.slot].pending
    assert all(pg < 0 for pg in be.res[a.slot].page)
    be.check_integrity()
    eng.abort(a)
    eng.step()
    assert be.is_empty and be.payload_pages.num_used == 0


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "step", "step", "abort"]),
            st.integers(0, 4),
            st.integers(1, 30),
        ),
        min_size=5,
        max_size=30,
    )
)
def test_random_operation_sequences_keep_the_invariants(ops):
    eng = _engine(
        "system.kv.verify_rows=false",
        "system.kv.populate_pages_per_step=2",
        "system.kv.admission_reserve_pages=0",
        "hardware.max_running_requests=8",
        pool=_tight_pool("tiny"),
    )
    be = eng.backend
    live = []
    for op, i, n in ops:
        if op == "submit":
            r = Request(eng.new_rid(), GOLDEN["prompts"][i], SamplingParams(max_new_tokens=n))
            eng.submit(r)
            live.append(r)
        elif op == "abort" and live:
            eng.abort(live[i % len(live)])
        eng.step()
        be.check_integrity()
        used = set(be.payload_pages._used)
        free = set(be.payload_pages._free)
        assert not used & free
    eng.run_until_idle()
    be.check_integrity()
    assert be.is_empty and be.payload_pages.num_used == 0 and be.host_pages.num_used == 0


@pytest.mark.parametrize("system", ["hisparse", "adaptive_hisparse"])
@pytest.mark.parametrize("fail_at", ["_backup", "_import_index"])
def test_a_failing_admission_returns_everything(system, fail_at):
    eng = make_engine(f"system={system}", "system.kv.hot_cache_rows=8", "hardware.kv_pool_gib=0.01")
    be = eng.backend
    entry, _ = eng.prefixes.get(GOLDEN["prompts"][4])

    def boom(*a, **k):
        raise RuntimeError("injected copy failure")

    setattr(be, fail_at, boom)
    with pytest.raises(RuntimeError, match="injected"):
        be.admit(entry.prefix, 10)
    be.check_integrity()
    assert be.is_empty and be.payload_pages.num_used == 0 and be.host_pages.num_used == 0
    assert be.index_pages.num_used == 0


def _pool_with_payload_pages(model: str, pages: int, *extra) -> str:
    """A pool of the index store plus `pages` payload pages (and the G-row unit that aligns a
    lent index store), for `extra`'s slot count."""
    be = _engine(f"model={model}", *extra).backend
    index = be.index_pages.num_pages * be.index_page_bytes
    unit = be.G * be.mcfg.row_bytes
    return repr((index + pages * be.payload_page_bytes + unit) / (1 << 30))


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_free_slots_index_history_carries_optional_history(model):
    """Sec. 3.1: optional history also occupies unused index backing. One request whose history
    the spare payload pages cannot hold: lent pages of free slots' index history cover all of
    it, where payload pages alone cover two of its five pages; the tokens are the golden ones."""
    extra = ("system.kv.admission_reserve_pages=0", "hardware.max_running_requests=3")
    pool = _pool_with_payload_pages(model, 3, *extra)  # a hot cache per slot, no more
    i = 4  # 130 tokens: 5 complete pages of G = 24
    cov, lent = {}, {}
    for lend in ("true", "false"):
        eng = _engine(f"model={model}", f"system.kv.lend_index_store={lend}", *extra, pool=pool)
        be = eng.backend
        assert be.payload_pages.num_pages == 3 and bool(be.lent_slots) == (lend == "true")
        n = GOLDEN["max_new_tokens"]
        r = Request(eng.new_rid(), GOLDEN["prompts"][i], SamplingParams(max_new_tokens=n))
        eng.submit(r)
        cov[lend] = lent[lend] = 0
        while r.finish_reason is None:
            eng.step()
            be.check_integrity()
            cov[lend] = max(cov[lend], be.coverage())
            lent[lend] = max(lent[lend], be.metrics()["dhs_optional_pages_lent"])
        assert r.output_ids == GOLDEN["outputs"][model][i]
        assert be.is_empty and not be._lent_holder
    assert cov == {"true": 1.0, "false": 2 / 5} and lent["true"] >= 3 and lent["false"] == 0


def test_admission_reclaims_the_lent_pages_of_its_slot_region():
    """Two long requests take lent pages from the free slots' index regions; admitting three
    more takes those regions back (their holders are reclaimed, check_integrity asserts no lent
    page lies in an active slot's region), and every request's tokens are the golden ones."""
    extra = ("system.kv.admission_reserve_pages=0", "hardware.max_running_requests=5")
    eng = _engine(*extra, pool=_pool_with_payload_pages("tiny", 6, *extra))
    be = eng.backend
    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=GOLDEN["max_new_tokens"]))
        for p in GOLDEN["prompts"]
    ]
    for r in (reqs[4], reqs[3]):
        eng.submit(r)
    for _ in range(3):
        eng.step()
        be.check_integrity()
    assert be._lent_holder, "the first two requests hold no lent pages"
    for r in reqs[:3]:
        eng.submit(r)
    all_running = False
    while eng.scheduler.running or eng.scheduler.waiting:
        eng.step()
        be.check_integrity()
        if len(eng.scheduler.running) == 5:
            all_running = True
            assert not be._lent_holder  # every region is some active slot's
    st_ = be.stats_adaptive
    assert all_running and st_["reclaim_events_total"] > 0
    # the holders went for their regions, and their kept pages were backed up on the decode
    # stream (a region's next user, the import, may not overwrite them before)
    assert st_["region_reclaims_total"] > 0 and st_["reclaim_backup_pages_sync_total"] > 0
    assert [r.output_ids for r in reqs] == GOLDEN["outputs"]["tiny"]


def test_a_region_held_by_an_importing_request_is_not_taken():
    """A request whose handoff is still copying cannot be reclaimed, so a free slot whose index
    region it holds pages in is not picked; with no other slot the admission waits."""
    extra = ("system.kv.admission_reserve_pages=0", "hardware.max_running_requests=2")
    eng = _engine(*extra, pool=_pool_with_payload_pages("tiny", 2, *extra))
    be = eng.backend
    r = Request(eng.new_rid(), GOLDEN["prompts"][4], SamplingParams(max_new_tokens=40))
    eng.submit(r)
    eng.step()
    (slot,) = be.res
    assert be._region_holders(1 - slot) == {slot}
    assert be._pick_slot() == (1 - slot, {slot})
    be.importing[slot] = None  # as if its copies were in flight
    try:
        assert be._pick_slot() is None
        assert be.can_admit(5, 4) == (False, "reclaim_insufficient")
    finally:
        del be.importing[slot]
    eng.run_until_idle()
    be.check_integrity()


@pytest.mark.parametrize(
    "order, regions, want",
    [
        # the newest request's region goes first, though another region holds fewer pages
        ("newest_first", {5: {0}, 6: {2}}, (6, {2})),
        ("oldest_first", {5: {0}, 6: {2}}, (5, {0})),
        # the shortest prefix that holds a whole region: {2, 1} holds 7's; 5's needs request 0
        ("newest_first", {5: {2, 0}, 7: {1}}, (7, {1})),
        ("largest_first", {5: {1}, 7: {0}}, (5, {1})),
        ("oldest_first", {5: {1}, 7: {0}}, (7, {0})),
        # a free region with no holder needs no reclaim at all
        ("newest_first", {5: {2}, 6: set()}, (6, set())),
    ],
)
def test_lent_regions_are_reclaimed_in_the_reclaim_order(order, regions, want):
    """Eq. 4 for index space: an admission that needs a free slot's index region back walks the
    reclaim order and takes the first region whose every holder lies in the prefix walked."""
    from systems.kv.adaptive import _Residency

    be = _engine(f"system.kv.reclaim_order={order}").backend
    pages = {0: 1, 1: 6, 2: 9}  # optional pages held: request 0 the fewest, 2 the most
    be.res = {s: _Residency(order=s, num_complete=n, page=[0] * n) for s, n in pages.items()}
    be.free_slots = sorted(regions)
    be._region_holders = lambda slot: set(regions[slot])
    assert be._pick_slot() == want


def test_lending_keeps_eq3_and_a_hot_cache_per_slot():
    """Eq. 3 holds between admissions: an admission that takes the last pages beyond the
    reserve reclaims optional history until the reserve is free again (the reserve is never
    lent or populated). Only when no optional page is left to reclaim do required allocations
    take it, and eq. 3 then holds back what is left (check_integrity on a full pool with lent
    pages). And the unit that aligns the lent store comes off before the slots are counted:
    every slot the pool is said to hold has its hot cache."""
    import torch

    extra = ("hardware.max_running_requests=4",)
    eng = _engine(*extra, pool=_pool_with_payload_pages("tiny", 4, *extra))
    be = eng.backend
    assert be.num_slots == 4 and be.payload_pages.num_pages == 4 and be.reserve_pages == 1
    g = torch.Generator().manual_seed(0)
    lent = 0
    for i, (T, new) in enumerate(((400, 100), (100, 400), (300, 100), (200, 100))):
        e = eng.prefixes.get(torch.randint(2, 512, (T,), generator=g).tolist())[0]
        assert be.can_admit(T, new) == (True, "")
        be.admit(e.prefix, new)
        for _ in range(5):
            be._populate()
            be._publish()
        be.check_integrity()
        lent = max(lent, len(be._lent_holder))
        if i < 3:  # optional payload pages existed to restore the reserve, or were never taken
            assert be.payload_pages.num_free == be.reserve_pages
            assert be.memory_report().reserve == be.payload_page_bytes
    # the fourth hot cache took the reserve: nothing optional was left in payload pages (nor
    # any free slot's region to lend)
    assert lent and be.payload_pages.num_free == 0
    assert not any(be._payload_pages_of(r) for r in be.res.values())
    assert be.stats_adaptive["reclaim_events_total"] >= 1
    for s in list(be.active_slots):
        be.release(s)
    # one unit short of the pool above: three slots, not four without a hot cache for one
    tight = _engine(*extra, pool=repr(float(_pool_with_payload_pages("tiny", 4, *extra)) - 1e-9))
    assert tight.backend.num_slots <= tight.backend.payload_pages.num_pages


def test_metrics_reads_survive_the_engine_thread_resizing_the_residencies():
    """/metrics reads the backend from another thread while the engine thread admits and
    releases requests: a residency dict resized in the middle of a read (here by the read
    itself, deterministically) must not raise 'dictionary changed size during iteration'."""
    from systems.kv.adaptive import _Residency

    eng = _engine()
    b = eng.backend

    class Admitting(_Residency):
        @property
        def num_pages(self) -> int:
            b.res[len(b.res) + 10_000] = _Residency(order=0, num_complete=0)
            return 0

    b.res[-1] = Admitting(order=0, num_complete=1, page=[-1], ready=[False])
    try:
        assert b.optional_pages == 0
        assert b.coverage() == 0.0
        b.memory_report()
        assert eng.metrics(sync=False)["dhs_optional_pages"] == 0
    finally:
        b.res.clear()
