"""/metrics on the event loop reads no device value: a backend's device counters reach it through
a host copy the engine thread queues between steps (``Engine._snapshot_counters``)."""

from __future__ import annotations

import torch

from systems.engine.request import Request, SamplingParams
from tests.helpers import golden_prompts, make_engine


def test_the_loop_snapshots_while_serving_and_once_more_when_idle(monkeypatch):
    eng = make_engine("system=hisparse", "hardware.kv_pool_gib=0.01")
    taken = []
    monkeypatch.setattr(eng.backend, "snapshot_counters", lambda: taken.append(1) or True)
    clock = [100.0]
    monkeypatch.setattr("systems.engine.engine.time.perf_counter", lambda: clock[0])
    eng._snapshot_counters(idle=True)
    assert taken == []  # nothing ran: nothing new to copy
    for _ in range(5):  # steps within one interval: one copy, at the first
        eng._snapshot_counters(idle=False)
        clock[0] += eng.SNAPSHOT_INTERVAL_S / 10
    assert len(taken) == 1
    clock[0] += eng.SNAPSHOT_INTERVAL_S
    eng._snapshot_counters(idle=False)
    assert len(taken) == 2
    eng._snapshot_counters(idle=False)  # within the interval again
    eng._snapshot_counters(idle=True)  # the engine went idle: the last steps' counts go out
    eng._snapshot_counters(idle=True)  # and only once
    assert len(taken) == 3
    # a copy that could not be queued (the previous one still in flight) is retried while idle
    monkeypatch.setattr(eng.backend, "snapshot_counters", lambda: taken.append(0) or False)
    eng._snapshot_counters(idle=False)
    clock[0] += eng.SNAPSHOT_INTERVAL_S
    eng._snapshot_counters(idle=True)
    eng._snapshot_counters(idle=True)
    assert taken[3:] == [0, 0]


def test_metrics_without_sync_report_the_snapshot_and_with_sync_the_device():
    eng = make_engine("system=adaptive_hisparse", "hardware.kv_pool_gib=0.01")
    reqs = [Request(eng.new_rid(), p, SamplingParams(max_new_tokens=6)) for p in golden_prompts()]
    for r in reqs:
        eng.submit(r)
    eng.run_until_idle()
    be = eng.backend
    exact = eng.metrics()
    assert exact["dhs_resolver_calls_total"] > 0 and exact["dhs_selected_rows_total"] > 0
    # no device to wait for (CPU): no snapshot, and the unsynced read is the device's
    assert be.snapshot_counters() is False and eng.metrics(sync=False) == exact
    # a landed snapshot (a GPU's) is what the unsynced read reports, counter by counter
    snap = be._device_counters() - 1
    be._counter_snap._done = snap
    lagged = eng.metrics(sync=False)
    assert lagged["dhs_resolver_calls_total"] == exact["dhs_resolver_calls_total"] - 1
    assert lagged["dhs_staged_rows_total"] == exact["dhs_staged_rows_total"] - 1
    assert lagged["dhs_selected_rows_total"] == exact["dhs_selected_rows_total"] - 3
    assert eng.metrics() == exact  # reports and tests read the device
    assert torch.equal(be._device_counters()[:4], be.census)


async def test_the_servers_metrics_endpoint_asks_for_no_device_read(monkeypatch):
    """GET /metrics runs on the event loop: it asks the engine for metrics(sync=False)."""
    import aiohttp

    from systems.engine.server import build_app, start_server

    eng = make_engine("system=hisparse", "hardware.kv_pool_gib=0.01")
    calls = []
    real = eng.metrics
    monkeypatch.setattr(eng, "metrics", lambda sync=True: calls.append(sync) or real(sync))
    srv = await start_server(build_app(eng))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{srv.port}/metrics") as r:
                assert r.status == 200 and "dhs_resolver_calls_total" in await r.text()
    finally:
        await srv.close()
    assert calls == [False]
