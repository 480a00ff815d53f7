import json
from pathlib import Path

import pytest

from tests.helpers import make_engine, run_greedy

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())


def _engine(model, B, impl="reference", *extra):
    return make_engine(
        f"model={model}",
        "system=hisparse",
        f"system.kv.hot_cache_rows={B}",
        "hardware.kv_pool_gib=0.01",
        f"system.kv.resolver_impl={impl}",
        "system.kv.verify_rows=true",
        *extra,
    )


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_golden_tokens_with_mostly_missing_selections(model):
    eng = _engine(model, 8)  # B == k: the hot cache holds one selection, most rows come from host
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"][model]
    m = eng.metrics()
    total = m["dhs_selected_rows_total"]
    assert total > 0
    host = m["dhs_selected_rows_from_host_total"]
    assert host / total > 0.3, (host, total)
    assert m["dhs_host_rows_copied_total"] <= host  # duplicates copied once
    eng.backend.check_integrity()
    assert eng.backend.is_empty and eng.backend.host_pages.num_used == 0


@pytest.mark.parametrize(
    "extra",
    [
        ("system.kv.copy_grid=0",),  # the copy beside the resolvers, the default width
        ("system.kv.copy_grid=3",),  # a fixed grid after the resolution
        ("system.kv.copy_programs_per_request=3",),  # a fixed width beside the resolvers
    ],
)
def test_golden_tokens_with_the_triton_resolver_under_the_interpreter(extra):
    eng = _engine("tiny", 8, "triton", *extra)
    outs = run_greedy(eng, GOLDEN["prompts"][:2], 6)
    assert outs == [o[:6] for o in GOLDEN["outputs"]["tiny"][:2]]


def test_hot_cache_smaller_than_k_is_a_clear_error():
    with pytest.raises(ValueError, match="hot_cache_rows"):
        _engine("tiny", 4)


def test_resolver_calls_follow_the_geometry():
    # GLM-like: every payload layer resolves (followers through the prefetch); DeepSeek-like:
    # reuse layers inherit the location vector, so only selecting layers call the resolver.
    for model, per_step in (("tiny", 4), ("tiny_dsv", 3)):
        eng = _engine(model, 16)
        run_greedy(eng, [GOLDEN["prompts"][0]], 5)
        assert eng.backend.resolver_calls == per_step * eng.stats["num_steps"], model


def test_tail_rows_are_backed_up_and_stay_exact():
    # long generation: the tail wraps many times; every resolved row is checked (verify_rows)
    eng = _engine("tiny", 8)
    p = GOLDEN["prompts"][1]
    out = run_greedy(eng, [p], 120)[0]
    assert out[:24] == GOLDEN["outputs"]["tiny"][1]
    assert eng.metrics()["dhs_host_backup_rows_total"] >= len(p) + 100


def test_admission_waits_when_the_pool_holds_fewer_sessions_than_slots():
    """A pool of fewer sessions than max_running_requests: the slot count is capped at what
    fits (a hot cache for each), and the other requests wait for a slot, then finish."""
    eng = make_engine(
        "system=hisparse",
        "hardware.kv_pool_gib=0.0001",
        "system.kv.hot_cache_rows=64",
        "hardware.max_running_requests=4",
        "model.max_context_len=256",
    )
    n = eng.backend.num_slots
    assert 1 <= n < 4 and eng.backend.payload_pages.num_pages >= n
    prompts = [GOLDEN["prompts"][0]] * 4
    from systems.engine.request import Request, SamplingParams

    reqs = [Request(eng.new_rid(), p, SamplingParams(max_new_tokens=8)) for p in prompts]
    for r in reqs:
        eng.submit(r)
    eng.step()
    assert len(eng.scheduler.running) == n and eng.scheduler.wait_reason == "no_free_slot"
    eng.run_until_idle()
    assert all(len(r.output_ids) == 8 for r in reqs)
    eng.backend.check_integrity()


def test_pages_come_out_ascending_so_backups_move_runs_not_pages():
    """A page pool hands out ascending ids, also after frees: a request that follows a released
    one gets that one's pages back as one ascending run, so its host backup is one DMA per
    source (a LIFO free list reversed them: one DMA per page and source)."""
    from systems.kv.base import PagePool

    pool = PagePool(16, "host")
    a, b = pool.alloc(6), pool.alloc(4)
    assert a == list(range(6)) and b == [6, 7, 8, 9]
    pool.free(a)
    assert pool.alloc(6) == list(range(6))
    pool.free([9, 7, 6, 8])
    assert pool.alloc(3) == [6, 7, 8]
    with pytest.raises(AssertionError, match="twice"):
        pool.free([0, 0])
    with pytest.raises(AssertionError, match="page 12 freed twice or never allocated"):
        pool.free([1, 12])  # 12 was never handed out: nothing is freed
    assert pool.num_used == 9
    pool.check()

    eng = _engine("tiny", 8)
    be = eng.backend
    runs = []
    orig = be._backup

    def counting(slot, p0, p1, rows):
        segs = list(be._host_segments(slot, p0, p1))
        merged = sum(
            1
            for i, (a_, b_, h) in enumerate(segs)
            if i == 0 or not (segs[i - 1][1] == a_ and segs[i - 1][2] + (a_ - segs[i - 1][0]) == h)
        )
        runs.append((len(segs), merged))
        return orig(slot, p0, p1, rows)

    be._backup = counting
    prompt = [(7 * i) % 500 + 2 for i in range(200)]  # 13 pages of 16 positions
    for _ in range(3):  # one after the other: each reuses the previous request's host pages
        run_greedy(eng, [prompt], 4)
    admissions = [r for r in runs if r[0] >= 8]  # the handoff backups (the tail keeps the rest)
    assert len(admissions) == 3 and all(m == 1 for _, m in admissions), runs


@pytest.mark.parametrize("model,forks", [("tiny_dsv", False), ("tiny", True)])
def test_the_prefetch_stream_is_joined_only_after_a_step_forked_it(model, forks, monkeypatch):
    """finish_forward joins the follower-prefetch stream only when the step put work on it: a
    capturing stream that waits on a stream outside the capture invalidates the capture (every
    dsv41_mini hierarchy capture failed on the H200 that way). CPU stand-in: fake streams that
    record forks and joins."""
    import contextlib

    import torch

    class FakeStream:
        def __init__(self, name):
            self.name, self.waits = name, []

        def wait_stream(self, other):
            self.waits.append(other.name)

        def wait_event(self, ev):
            pass

    main, side = FakeStream("main"), FakeStream("side")

    class FakeEvent:
        def record(self, stream=None):
            pass

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    eng = _engine(model, 8)
    be = eng.backend
    be._side = side
    outs = run_greedy(eng, [GOLDEN["prompts"][0]], 3)
    assert outs == [GOLDEN["outputs"][model][0][:3]]
    assert ("main" in side.waits) == forks  # forked by the follower prefetch (GLM-like only)
    # joined at the end of every step that forked it (forks per step: one per producer layer),
    # never otherwise
    assert ("side" in main.waits) == forks and main.waits.count("side") <= side.waits.count("main")
    assert not be._side_forked


@pytest.mark.parametrize(
    "system,pool,ctx", [("hisparse", 0.001, 512), ("adaptive_dhisparse", 0.1, 16384)]
)
def test_running_requests_are_capped_at_what_the_pool_holds(system, pool, ctx):
    """max_running_requests is a cap: with more slots than the pool holds sessions of (index
    history, staging, one hot cache), the slot count comes down to what fits instead of the
    backend refusing to start or starving the hot caches; the engine still serves exactly."""
    big = make_engine(
        "model=tiny",
        f"system={system}",
        f"hardware.kv_pool_gib={pool}",
        "hardware.max_running_requests=40",
        "system.kv.hot_cache_rows=16",
        f"model.max_context_len={ctx}",
    )
    b = big.backend
    assert 1 <= b.num_slots < 40 and len(b.free_slots) == b.num_slots
    per_slot = (
        b.max_pages_per_req * b.index_page_bytes
        + b.payload_page_bytes
        + (b.chi * b.q_max * b.mcfg.index_topk * b.mcfg.row_bytes if b.q_max > 1 else 0)
    )
    assert b.num_slots == b.capacity // per_slot
    assert b.payload_pages.num_free >= b.num_slots  # a hot cache for every slot
    outs = run_greedy(big, GOLDEN["prompts"][:2], 4)
    if system == "hisparse":  # the speculative system's tokens are checked in tests/spec
        assert outs == [o[:4] for o in GOLDEN["outputs"]["tiny"][:2]]


@pytest.mark.parametrize("system", ["hisparse", "adaptive_hisparse"])
def test_pools_sized_for_another_budget_keep_their_sizes(system):
    """system.kv.pools_sized_for_rows = N (the paper's budget sweep, sec. 4.3.4: the pools keep
    the sizes configured for B = N and only B changes): a larger B holds the sessions its hot
    caches fit in N's payload pool, a smaller one no more than N's index pool; N = B builds what
    the default builds. Served tokens stay the golden ones."""

    def backend(B, N):
        return make_engine(
            "model=tiny",
            f"system={system}",
            "hardware.kv_pool_gib=0.00063",  # ~16 sessions of 512 tokens at B = 16
            "hardware.max_running_requests=40",
            "model.max_context_len=512",
            f"system.kv.hot_cache_rows={B}",
            f"system.kv.pools_sized_for_rows={N}",
        )

    ref = backend(16, 0).backend
    assert 8 <= ref.num_slots < 40  # the pool binds, not max_running_requests
    same = backend(16, 16).backend
    assert (same.num_slots, same.payload_pages.num_pages, same.index_regions) == (
        ref.num_slots,
        ref.payload_pages.num_pages,
        ref.index_regions,
    )
    payload = ref.payload_pages.num_pages * ref.payload_page_bytes  # N's payload pool, to a page

    def pages_of(b):  # N's payload pool in pages of b's B (and tail)
        lo = payload // b.payload_page_bytes
        return range(lo, (payload + ref.payload_page_bytes) // b.payload_page_bytes + 1)

    # half the budget: the index pool sized for B = 16 binds, the spare payload pages stay
    small = backend(8, 16).backend
    assert small.num_slots == ref.num_slots == small.index_regions
    assert small.payload_pages.num_pages in pages_of(small)
    assert small.payload_pages.num_pages > ref.payload_pages.num_pages
    # four times the budget: N's payload pool over B's page; the index pool keeps N's sessions
    eng = backend(64, 16)
    big = eng.backend
    assert big.num_slots in pages_of(big) and 1 <= big.num_slots < ref.num_slots
    assert big.index_regions == ref.num_slots and big.payload_pages.num_pages >= big.num_slots
    shared = backend(64, 0).backend  # one capacity: the index of fewer sessions becomes hot caches
    assert shared.num_slots > big.num_slots
    if system == "adaptive_hisparse":  # the regions no session can take are lent
        assert any(s >= big.num_slots for sl in big.lent_slots for s in sl)
    outs = run_greedy(eng, GOLDEN["prompts"][:3], 5)
    assert outs == [o[:5] for o in GOLDEN["outputs"]["tiny"][:3]]
    big.check_integrity()


def test_pools_sized_for_another_budget_refuse_what_they_cannot_mean():
    """Clear errors: pools for N that hold no session of B, N below k, and N with every slot
    kept (cap_slots_to_pool=false: N would change nothing)."""
    base = ("model=tiny", "system=hisparse", "model.max_context_len=512")
    with pytest.raises(ValueError, match="hold no session"):
        make_engine(
            *base,
            "hardware.kv_pool_gib=0.00004",  # one session of B = 16, none of B = 64 in its pools
            "system.kv.hot_cache_rows=64",
            "system.kv.pools_sized_for_rows=16",
        )
    with pytest.raises(ValueError, match="index_topk"):
        make_engine(*base, "system.kv.hot_cache_rows=16", "system.kv.pools_sized_for_rows=4")
    with pytest.raises(ValueError, match="cap_slots_to_pool"):
        make_engine(
            *base,
            "system.kv.hot_cache_rows=16",
            "system.kv.pools_sized_for_rows=32",
            "system.kv.cap_slots_to_pool=false",
        )


def test_copy_programs_and_a_copy_grid_are_one_or_the_other():
    be = _engine("tiny", 8, "reference", "system.kv.copy_programs_per_request=2").backend
    assert be.copy_programs == 2 and be.copy_grid is None
    with pytest.raises(ValueError, match="copy_programs_per_request"):
        _engine(
            "tiny", 8, "reference", "system.kv.copy_grid=4", "system.kv.copy_programs_per_request=2"
        )
