"""Aborts that always land (issue 26, point 3): a disconnect aborts the request whether it
streams or not, queued or running; a vanished client's queue slot is free at once (before the
engine thread takes the abort in); an abort is bound to the request object, so a stale one
cannot touch a later request that reuses the id."""

import asyncio
import time

import aiohttp

from systems.engine.engine import DuplicateRequest
from systems.engine.request import Request, SamplingParams
from tests.helpers import make_engine
from tests.reliability.support import PROMPTS, assert_drained, served, wait_idle

LONG = 500  # tokens a vanished client asked for: far more than it may cost


def _body(max_new: int, stream: bool = False) -> dict:
    return {"input_ids": PROMPTS[0], "stream": stream,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                "ignore_eos": True}}


async def _vanish(base: str, body: dict, after_s: float, read_headers: bool) -> None:
    """One client on its own connection that sends, waits, and closes."""
    async with aiohttp.ClientSession(base) as s:
        if read_headers:
            r = await s.post("/generate", json=body)
            assert r.status == 200
            await asyncio.sleep(after_s)
            r.close()
            return
        try:
            await asyncio.wait_for(s.post("/generate", json=body), after_s)
        except asyncio.TimeoutError:
            pass


async def test_non_streaming_disconnect_aborts_the_running_request():
    async with served("hardware.kv_pool_gib=0.01", "engine.max_new_tokens_cap=500") as (
            s, eng, base):
        await asyncio.gather(*(_vanish(base, _body(LONG), 0.3, False) for _ in range(4)))
        await wait_idle(eng)
        assert eng.stats["aborted_total"] == 4 and eng.stats["finished_total"] == 0
        # far fewer tokens than the 2,000 asked for: the work stopped with the clients
        assert eng.stats["generated_tokens_total"] < 4 * LONG / 2
        assert_drained(eng)


async def test_vanished_queued_clients_free_their_slots_at_once():
    # one request runs at a time, four may wait: a long runner, then four waiting clients
    # (two streaming, two not) that vanish
    async with served("hardware.kv_pool_gib=0.01", "engine.max_new_tokens_cap=500",
                      "hardware.max_running_requests=1", "engine.max_waiting=4") as (
            s, eng, base):
        runner = asyncio.ensure_future(s.post("/generate", json=_body(LONG)))
        while not eng.scheduler.running:
            await asyncio.sleep(0.01)
        ghosts = [asyncio.ensure_future(_vanish(base, _body(8, stream=i % 2 == 0), 0.3,
                                                read_headers=i % 2 == 0)) for i in range(4)]
        await asyncio.gather(*ghosts)
        await asyncio.sleep(0.05)  # the server sees the four connections close
        # four new requests fit in the queue now, while the runner still decodes
        assert eng.scheduler.running
        news = [asyncio.ensure_future(s.post("/generate", json=_body(2))) for _ in range(4)]
        statuses = [r.status for r in await asyncio.gather(*news)]
        assert statuses == [200] * 4, statuses
        assert (await runner).status == 200
        await wait_idle(eng)
        assert eng.stats["aborted_total"] == 4 and eng.stats["rejected_total"] == 0
        assert_drained(eng)


def test_a_stale_abort_cannot_touch_a_later_request_with_the_same_id():
    eng = make_engine("hardware.kv_pool_gib=0.01")
    first = Request("same-id", PROMPTS[0], SamplingParams(max_new_tokens=3))
    eng.submit(first)
    eng.run_until_idle()
    assert first.finish_reason["type"] == "length"
    told = []
    later = Request("same-id", PROMPTS[1], SamplingParams(max_new_tokens=3),
                    on_output=lambda r, ids, done: told.append(done))
    eng.submit(later)
    eng.abort(first)  # e.g. a handler cancelled after its request finished
    eng.run_until_idle()
    assert later.finish_reason["type"] == "length" and len(later.output_ids) == 3
    assert eng.stats["aborted_total"] == 0
    # while live, the id is not reusable, and an abort of the live object lands and is told
    again = Request("same-id", PROMPTS[2], SamplingParams(max_new_tokens=50),
                    on_output=lambda r, ids, done: told.append(done))
    eng.submit(again)
    try:
        eng.submit(Request("same-id", PROMPTS[2], SamplingParams(max_new_tokens=2)))
        raise AssertionError("a live id was accepted twice")
    except DuplicateRequest:
        pass
    eng.step()
    eng.abort(again)
    eng.step()
    assert again.finish_reason == {"type": "abort"} and told[-1] is True
    assert_drained(eng)


def test_an_aborted_waiting_request_stops_counting_against_the_queue_bound():
    eng = make_engine("hardware.kv_pool_gib=0.01", "engine.max_waiting=2")
    reqs = [Request(eng.new_rid(), PROMPTS[0], SamplingParams(max_new_tokens=2))
            for _ in range(2)]
    for r in reqs:
        eng.submit(r)
    eng.abort(reqs[0])  # not yet taken in by the engine thread (no step has run)
    eng.submit(Request(eng.new_rid(), PROMPTS[0], SamplingParams(max_new_tokens=2)))
    t0 = time.monotonic()
    eng.run_until_idle()
    assert time.monotonic() - t0 < 60
    assert reqs[0].finish_reason == {"type": "abort"} and eng.stats["rejected_total"] == 0
    assert_drained(eng)
