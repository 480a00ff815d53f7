"""Faults in the memory hierarchy: budgets that run out make requests wait (never fail), and a
copy, prefill, drafter set-up or decode step that raises fails only the requests it concerns,
with a clear error, while the rest continue and the backend's invariants hold."""

import asyncio
import threading

import pytest

from harness.loadgen import GenerateStreamParser, OpenAIStreamParser
from systems.engine.request import ReqStatus, Request, SamplingParams
from systems.kv.base import GiB
from tests.helpers import make_engine
from tests.reliability.support import PROMPTS, SPEC, assert_drained, read_sse, served, wait_idle

INJECTED = "injected fault: host copy failed"
POISON = PROMPTS[3]  # 77 tokens; no other prompt here has that length


class InjectedFault(RuntimeError):
    pass


def _reqs(eng, prompts, n=10):
    return [Request(eng.new_rid(), p, SamplingParams(max_new_tokens=n)) for p in prompts]


def _run(eng, reqs, check_every_step=True):
    for r in reqs:
        eng.submit(r)
    for _ in range(10_000):
        eng.step()
        if check_every_step:
            eng.backend.check_integrity()
        if not eng.scheduler.running and not eng.scheduler.waiting and eng._inbox.empty():
            return
    raise AssertionError("engine did not go idle")


def _clean_outputs(overrides, prompts, n=10):
    eng = make_engine(*overrides)
    reqs = _reqs(eng, prompts, n)
    _run(eng, reqs, check_every_step=False)
    return [r.output_ids for r in reqs]


# ---------------------------------------------------------------- budgets: wait, do not fail
def test_host_budget_exhausted_waits_with_host_pool_full_others_continue():
    probe = make_engine("system=hisparse").backend
    host_page = probe.S * probe.G * probe.mcfg.row_bytes
    pages = probe.max_host_pages + 3  # the minimum the backend accepts, plus a little
    ov = ("system=hisparse", f"hardware.host_pool_gib={pages * host_page / GiB!r}")
    eng = make_engine(*ov)
    be = eng.backend
    assert be.host_pages.num_pages == pages
    prompts = [PROMPTS[4]] * 6  # 130 + 40 tokens: 6 host pages each
    per_req = -(-(130 + 40) // be.G)
    fit = pages // per_req
    assert 1 <= fit < 6
    reqs = _reqs(eng, prompts, 40)
    for r in reqs:
        eng.submit(r)
    eng.step()
    assert len(eng.scheduler.running) == fit
    assert eng.scheduler.wait_reason == "host_pool_full"
    assert reqs[fit].wait_reason == "host_pool_full"
    assert eng.metrics()['dhs_admission_wait_events_total{reason="host_pool_full"}'] >= 1
    steps = 0
    while eng.scheduler.waiting:  # the admitted ones keep decoding while the rest wait
        eng.step()
        be.check_integrity()
        steps += 1
        assert be.host_pages.num_used <= pages
    assert all(len(r.output_ids) == 40 for r in reqs[:fit])  # finished first, FCFS
    eng.run_until_idle()
    want = _clean_outputs(("system=hisparse",), prompts[:1], 40)[0]
    assert all(r.output_ids == want for r in reqs)
    assert all(r.finish_reason["type"] == "length" for r in reqs)
    assert eng.stats["failed_total"] == 0
    assert_drained(eng)


def test_reclaim_that_cannot_cover_the_deficit_waits_not_fails():
    # 16 slots over 4 hot caches: the slot count is kept (not capped at the pool's sessions),
    # so admissions wait for pages and long prompts' optional history must be reclaimed
    base = (
        "system=adaptive_hisparse",
        "system.kv.admission_reserve_pages=0",
        "hardware.max_running_requests=16",
        "system.kv.cap_slots_to_pool=false",
    )
    probe = make_engine(*base).backend
    hot_pages = 4  # room for 4 hot/tail pages: long prompts' optional history must be reclaimed
    # (+ the G-row unit that aligns the index store lent to optional history)
    index = probe.index_pages.num_pages * probe.index_page_bytes
    unit = probe.G * probe.mcfg.row_bytes
    pool = (index + hot_pages * probe.payload_page_bytes + unit) / GiB
    ov = (*base, f"hardware.kv_pool_gib={pool!r}")
    eng = make_engine(*ov)
    be = eng.backend
    assert be.payload_pages.num_pages == hot_pages
    prompts = [PROMPTS[4], PROMPTS[4], PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]
    reqs = _reqs(eng, prompts, 30)
    eng.submit(reqs[0])
    eng.step()  # the first request keeps its prompt on the device as optional history
    assert be.optional_pages > 0
    for r in reqs[1:]:
        eng.submit(r)
    reasons = set()
    while eng.scheduler.running or eng.scheduler.waiting:
        eng.step()
        be.check_integrity()
        if eng.scheduler.wait_reason:
            reasons.add(eng.scheduler.wait_reason)
    assert be.stats_adaptive["reclaim_events_total"] > 0  # reclaim covered some deficits...
    assert reasons & {"reclaim_insufficient", "kv_pool_full"}, reasons  # ...not all: waited
    assert eng.stats["failed_total"] == 0
    want = _clean_outputs(("system=adaptive_hisparse",), prompts, 30)
    assert [r.output_ids for r in reqs] == want
    assert_drained(eng)


# ---------------------------------------------------------------- injected failures
def _poison_handoff(eng):
    """The handoff of POISON fails after the backend has allocated for it: the host copy raises
    (HiSparse family) or, for the resident backend, admit raises after importing."""
    be = eng.backend
    orig_admit = be.admit
    calls = {"n": 0}

    def admit(prefix, max_new_tokens, **kw):
        if prefix.num_tokens != len(POISON):
            return orig_admit(prefix, max_new_tokens, **kw)
        calls["n"] += 1
        if hasattr(be, "_backup"):

            def failing_backup(*a, **k):
                raise InjectedFault(INJECTED)

            be._backup = failing_backup
            try:
                return orig_admit(prefix, max_new_tokens, **kw)
            finally:
                del be._backup
        orig_admit(prefix, max_new_tokens, **kw)  # slot and pages taken, rows copied...
        raise InjectedFault(INJECTED)  # ...and then the handoff fails

    be.admit = admit
    return calls


HANDOFF_SYSTEMS = {
    "resident": ("system=resident", "hardware.max_running_requests=3"),
    "hisparse": ("system=hisparse", "hardware.max_running_requests=3"),
    "adaptive_hisparse": ("system=adaptive_hisparse", "hardware.max_running_requests=3"),
}


@pytest.mark.parametrize("system", list(HANDOFF_SYSTEMS))
def test_failed_handoff_copy_fails_only_that_request(system):
    ov = HANDOFF_SYSTEMS[system]
    prompts = [PROMPTS[0], POISON, PROMPTS[1], PROMPTS[2], POISON, PROMPTS[4]]
    want = _clean_outputs(ov, prompts)
    eng = make_engine(*ov)
    calls = _poison_handoff(eng)
    reqs = _reqs(eng, prompts)
    _run(eng, reqs)
    assert calls["n"] == 2
    for r, w, p in zip(reqs, want, prompts):
        if p is POISON:
            assert r.finish_reason["type"] == "error"
            assert INJECTED in r.finish_reason["message"]
            assert r.status == ReqStatus.FINISHED and r.output_ids == []
        else:
            assert r.finish_reason["type"] == "length" and r.output_ids == w
    assert eng.stats["failed_total"] == 2 and eng.stats["failed_steps_total"] == 0
    assert_drained(eng)


def test_failed_prefill_fails_only_that_request():
    eng = make_engine("system=hisparse")
    orig = eng.prefixes._prefill

    def prefill(ids):
        if len(ids) == len(POISON):
            raise InjectedFault("injected fault: prefill failed")
        return orig(ids)

    eng.prefixes._prefill = prefill
    reqs = _reqs(eng, [PROMPTS[0], POISON, PROMPTS[1]])
    _run(eng, reqs)
    assert reqs[1].finish_reason == {
        "type": "error",
        "message": "InjectedFault: injected fault: prefill failed",
    }
    assert all(len(r.output_ids) == 10 for r in (reqs[0], reqs[2]))
    assert_drained(eng)


def test_failed_drafter_setup_fails_only_that_request():
    prompts = [PROMPTS[0], POISON, PROMPTS[2]]
    want = _clean_outputs(SPEC, prompts)
    eng = make_engine(*SPEC)
    orig = eng.decoder.on_admit

    def on_admit(arrivals):
        if any(req.num_prompt_tokens == len(POISON) for req, _ in arrivals):
            raise InjectedFault("injected fault: draft ring fill failed")
        return orig(arrivals)

    eng.decoder.on_admit = on_admit
    reqs = _reqs(eng, prompts)
    _run(eng, reqs)
    assert reqs[1].finish_reason["type"] == "error"
    assert "draft ring fill failed" in reqs[1].finish_reason["message"]
    assert [reqs[0].output_ids, reqs[2].output_ids] == [want[0], want[2]]
    assert_drained(eng)


@pytest.mark.parametrize("system", ["resident", "hisparse", "adaptive_dhisparse"])
@pytest.mark.parametrize("where", ["resolve", "commit"])
def test_failed_decode_step_fails_its_requests_and_the_engine_goes_on(system, where):
    ov = (SPEC if system == "adaptive_dhisparse" else (f"system={system}",)) + (
        "hardware.max_running_requests=2",
    )
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[4]]
    want = _clean_outputs(ov, prompts)
    eng = make_engine(*ov)
    be = eng.backend
    orig = getattr(be, where)
    state = {"calls": 0}

    def failing(*a, **k):
        state["calls"] += 1
        if state["calls"] == 3:  # inside the second decode step (resolve) / its commit
            raise InjectedFault(f"injected fault in {where}")
        return orig(*a, **k)

    setattr(be, where, failing)
    reqs = _reqs(eng, prompts)
    _run(eng, reqs)
    failed = [r for r in reqs if r.finish_reason["type"] == "error"]
    assert len(failed) == 2  # exactly the step's requests: the two running ones
    assert all(f"injected fault in {where}" in r.finish_reason["message"] for r in failed)
    assert failed == reqs[:2]
    assert [r.output_ids for r in reqs[2:]] == want[2:]  # the waiting ones ran afterwards
    assert eng.stats["failed_steps_total"] == 1 and eng.stats["failed_total"] == 2
    assert_drained(eng)


def test_broken_output_callback_aborts_that_request_only():
    eng = make_engine("system=hisparse")
    a, b = _reqs(eng, [PROMPTS[0], PROMPTS[1]], 20)

    def broken(req, ids, done):
        raise RuntimeError("consumer gone")

    a.on_output = broken
    _run(eng, [a, b])
    assert a.finish_reason == {"type": "abort"}
    assert b.finish_reason["type"] == "length" and len(b.output_ids) == 20
    assert_drained(eng)


# ---------------------------------------------------------------- over HTTP
async def test_failures_reach_http_clients_as_errors_and_others_continue():
    eng = make_engine("system=hisparse", "hardware.max_running_requests=4")
    _poison_handoff(eng)
    async with served(engine=eng) as (s, eng, base):
        sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        good = [
            s.post("/generate", json={"input_ids": PROMPTS[i], "sampling_params": sp})
            for i in (0, 1, 2)
        ]
        bad_full = s.post("/generate", json={"input_ids": POISON, "sampling_params": sp})
        bad_stream = s.post(
            "/generate", json={"input_ids": POISON, "sampling_params": sp, "stream": True}
        )
        bad_openai = s.post(
            "/v1/completions", json={"prompt": POISON, "max_tokens": 8, "stream": True}
        )
        rs = await asyncio.gather(*good, bad_full, bad_stream, bad_openai)
        for r in rs[:3]:
            assert r.status == 200 and len((await r.json())["output_ids"]) == 8
        r = rs[3]
        assert r.status == 500
        err = (await r.json())["error"]
        assert INJECTED in err["message"] and err["type"] == "engine_error"
        for r, parser in ((rs[4], GenerateStreamParser()), (rs[5], OpenAIStreamParser())):
            assert r.status == 200  # the stream had started: the error is its last event
            raw = await r.read()
            events = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]" and b'"error"' in events[-2]
            parser.feed(raw, 0.0)
            parser.finish(0.0)
            assert parser.error and INJECTED in parser.error  # the load generator sees it
        await wait_idle(eng)
        assert_drained(eng)

        # a decode step that fails: its requests get an error event, the engine goes on
        orig = eng.backend.resolve
        hit = threading.Event()

        def failing(*a, **k):
            if not hit.is_set():
                hit.set()
                raise InjectedFault("injected fault in resolve")
            return orig(*a, **k)

        eng.backend.resolve = failing
        r = await s.post(
            "/generate",
            json={
                "input_ids": PROMPTS[1],
                "stream": True,
                "sampling_params": {**sp, "max_new_tokens": 5},
            },
        )
        events = await read_sse(r)
        assert events[-1] == "[DONE]"
        assert "injected fault in resolve" in events[-2]["error"]["message"]
        assert events[-2]["meta_info"]["finish_reason"]["type"] == "error"
        r = await s.post("/generate", json={"input_ids": PROMPTS[1], "sampling_params": sp})
        assert r.status == 200 and len((await r.json())["output_ids"]) == 8
        assert (await s.get("/health")).status == 200
        m = await (await s.get("/metrics")).text()
        assert "dhs_failed_total 4" in m and "dhs_failed_steps_total 1" in m
        await wait_idle(eng)
        assert_drained(eng)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_unrecoverable_rollback_stops_the_engine_loudly_and_nobody_hangs():
    """If the backend cannot undo a failed admission, the engine must not go on from state it
    cannot vouch for: it stops, every outstanding request gets an error, /health says so, and
    new requests are refused with 503 instead of queueing forever."""
    eng = make_engine("system=hisparse", "hardware.max_running_requests=1")
    be = eng.backend
    orig_admit, orig_release = be.admit, be.release

    def admit(prefix, n, **kw):
        slot = orig_admit(prefix, n, **kw)
        if prefix.num_tokens == len(POISON):
            raise InjectedFault(INJECTED)
        return slot

    def release(slot):
        if be.slot_len[slot] == len(POISON):
            raise InjectedFault("injected fault: release failed")
        return orig_release(slot)

    be.admit, be.release = admit, release
    async with served(engine=eng) as (s, eng, base):
        sp = {"max_new_tokens": 200, "ignore_eos": True}
        running = await s.post(
            "/generate", json={"input_ids": PROMPTS[0], "stream": True, "sampling_params": sp}
        )
        await running.content.readline()  # it runs (one slot): the next ones wait
        poison = asyncio.ensure_future(
            s.post("/generate", json={"input_ids": POISON, "sampling_params": sp})
        )
        await asyncio.sleep(0.1)
        waiting = asyncio.ensure_future(
            s.post("/generate", json={"input_ids": PROMPTS[1], "sampling_params": sp})
        )
        await asyncio.sleep(0.2)
        assert len(eng.scheduler.waiting) == 2
        running.close()  # frees the slot: the poisoned request is admitted, its rollback fails
        for fut in (poison, waiting):
            r = await asyncio.wait_for(fut, 30)
            assert r.status == 500
            assert "engine stopped" in (await r.json())["error"]["message"]
        assert eng.error is not None
        h = await s.get("/health")
        assert h.status == 503 and "release failed" in (await h.json())["error"]["message"]
        r = await s.post("/generate", json={"input_ids": PROMPTS[1]})
        assert r.status == 503 and "engine stopped" in (await r.json())["error"]["message"]
