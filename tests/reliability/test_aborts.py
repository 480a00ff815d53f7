"""Aborts that always land (issue 26, point 3): a disconnect aborts the request whether it
streams or not, queued or running; a vanished client's queue slot is free at once (before the
engine thread takes the abort in); an abort is bound to the request object, so a stale one
cannot touch a later request that reuses the id."""

import asyncio
import os
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest

from harness.servers import free_port, stop_process, wait_healthy
from systems.engine.engine import DuplicateRequest
from systems.engine.request import Request, SamplingParams
from tests.helpers import make_engine
from tests.reliability.support import PROMPTS, assert_drained

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LONG = 500  # tokens a vanished client asked for: far more than it may cost

# one test worker runs the module (make test: --dist loadgroup): the module-scoped CLI server
# starts once, not once per worker
pytestmark = pytest.mark.xdist_group("test_aborts")


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory):
    """``python -m systems.engine.server`` as ``make server`` runs it (the test servers of
    aiohttp cancel handlers on disconnect by default; the CLI's must do so itself). One request
    runs at a time and four may wait."""
    port = free_port()
    log = tmp_path_factory.mktemp("cli") / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "systems.engine.server",
                "--port",
                str(port),
                "--parent-pid",
                str(os.getpid()),
                "device=cpu",
                "hardware.kv_pool_gib=0.01",
                "engine.max_new_tokens_cap=500",
                "hardware.max_running_requests=1",
                "engine.max_waiting=4",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120, proc, log)
        yield url
    finally:
        stop_process(proc, grace_s=10)


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return {
            ln.split()[0]: float(ln.split()[1])
            for ln in r.read().decode().splitlines()
            if ln and not ln.startswith("#")
        }


async def _settled(url: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(_metrics, url)
        if m["dhs_num_running_reqs"] == 0 and m["dhs_num_waiting_reqs"] == 0:
            return m
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.05)


def _body(max_new: int, stream: bool = False) -> dict:
    return {
        "input_ids": PROMPTS[0],
        "stream": stream,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
    }


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
        except TimeoutError:
            pass


async def test_non_streaming_disconnects_abort_running_and_queued_requests(cli_server):
    before = await _settled(cli_server)
    # one runs, three wait; all four clients leave after 0.3 s
    await asyncio.gather(*(_vanish(cli_server, _body(LONG), 0.3, False) for _ in range(4)))
    after = await _settled(cli_server)
    delta = {
        k: after[k] - before[k]
        for k in ("dhs_aborted_total", "dhs_finished_total", "dhs_generated_tokens_total")
    }
    assert delta["dhs_aborted_total"] == 4 and delta["dhs_finished_total"] == 0, delta
    # far fewer tokens than the 2,000 asked for: the work stopped with the clients
    assert delta["dhs_generated_tokens_total"] < LONG, delta


async def test_vanished_queued_clients_free_their_slots_at_once(cli_server):
    before = await _settled(cli_server)
    async with aiohttp.ClientSession(cli_server) as s:
        runner = asyncio.ensure_future(s.post("/generate", json=_body(LONG)))
        while (await asyncio.to_thread(_metrics, cli_server))["dhs_num_running_reqs"] < 1:
            await asyncio.sleep(0.01)
        # four waiting clients (two streaming, two not) fill the queue, then vanish
        await asyncio.gather(
            *(
                _vanish(cli_server, _body(8, stream=i % 2 == 0), 0.3, read_headers=i % 2 == 0)
                for i in range(4)
            )
        )
        await asyncio.sleep(0.05)  # the server sees the four connections close
        # four new requests fit in the queue now, while the runner still decodes
        assert (await asyncio.to_thread(_metrics, cli_server))["dhs_num_running_reqs"] == 1
        news = [asyncio.ensure_future(s.post("/generate", json=_body(2))) for _ in range(4)]
        statuses = [r.status for r in await asyncio.gather(*news)]
        assert statuses == [200] * 4, statuses
        assert (await runner).status == 200
    after = await _settled(cli_server)
    assert after["dhs_aborted_total"] - before["dhs_aborted_total"] == 4
    assert after["dhs_rejected_total"] == before["dhs_rejected_total"]


def test_a_stale_abort_cannot_touch_a_later_request_with_the_same_id():
    eng = make_engine("hardware.kv_pool_gib=0.01")
    first = Request("same-id", PROMPTS[0], SamplingParams(max_new_tokens=3))
    eng.submit(first)
    eng.run_until_idle()
    assert first.finish_reason["type"] == "length"
    told = []
    later = Request(
        "same-id",
        PROMPTS[1],
        SamplingParams(max_new_tokens=3),
        on_output=lambda r, ids, done: told.append(done),
    )
    eng.submit(later)
    eng.abort(first)  # e.g. a handler cancelled after its request finished
    eng.run_until_idle()
    assert later.finish_reason["type"] == "length" and len(later.output_ids) == 3
    assert eng.stats["aborted_total"] == 0
    # while live, the id is not reusable, and an abort of the live object lands and is told
    again = Request(
        "same-id",
        PROMPTS[2],
        SamplingParams(max_new_tokens=50),
        on_output=lambda r, ids, done: told.append(done),
    )
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
    reqs = [Request(eng.new_rid(), PROMPTS[0], SamplingParams(max_new_tokens=2)) for _ in range(2)]
    for r in reqs:
        eng.submit(r)
    eng.abort(reqs[0])  # not yet taken in by the engine thread (no step has run)
    eng.submit(Request(eng.new_rid(), PROMPTS[0], SamplingParams(max_new_tokens=2)))
    t0 = time.monotonic()
    eng.run_until_idle()
    assert time.monotonic() - t0 < 60
    assert reqs[0].finish_reason == {"type": "abort"} and eng.stats["rejected_total"] == 0
    assert_drained(eng)
