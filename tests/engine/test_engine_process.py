"""server.engine_process: the engine in a process of its own (systems/engine/engine_process.py)
serves what the same engine serves as a thread: the same tokens, finish reasons and timing; stop
strings are matched in the engine's process; an abort frees the request there; refusals
(duplicate id, full queue) reach the server's side as the exceptions the server maps to 400 /
503; an engine process that dies ends every stream with an error and turns /health to 503; a
server stopped by SIGTERM takes its engine process with it."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness.servers import free_port, stop_process, wait_healthy
from systems.engine.config import compose, resolve_engine_config
from systems.engine.engine import DuplicateRequest, EngineStopped
from systems.engine.engine_process import EngineProcessClient
from systems.engine.request import Request, SamplingParams
from systems.engine.scheduler import QueueFull
from systems.engine.server import Server
from tests.engine.test_server_event_loop import _stream
from tests.harness.test_sigterm import _alive, _children
from tests.helpers import golden_prompts, make_engine, run_greedy

CFG = ["device=cpu", "hardware.kv_pool_gib=0.01", "engine.cuda_graph_warmup=false"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def _start(*overrides: str) -> EngineProcessClient:
    return await EngineProcessClient.start(resolve_engine_config(compose([*CFG, *overrides])))


async def _collect(q: asyncio.Queue) -> list[int]:
    out = []
    while True:
        new_ids, done, _ = await asyncio.wait_for(q.get(), 60)
        out += new_ids
        if done:
            return out


@pytest.mark.parametrize("system", ["resident", "adaptive_dhisparse"])
async def test_the_engine_process_serves_the_engine_threads_tokens(system):
    prompts = golden_prompts()
    spec = [f"system={system}", "hardware.max_running_requests=8"]  # room for the drafter's ring
    want = run_greedy(make_engine(*CFG[1:], *spec), prompts, 12)
    client = await _start(*spec)
    try:
        reqs = [Request(client.new_rid(), p, SamplingParams(max_new_tokens=12)) for p in prompts]
        queues = [await client.submit(r) for r in reqs]
        got = await asyncio.gather(*map(_collect, queues))
        assert got == want
        for r, ids in zip(reqs, got):
            assert r.output_ids == ids
            assert r.finish_reason == {"type": "length", "length": 12}
            t = r.timing()  # the engine's timestamps came back with the last output
            assert t["handoff_s"] is not None and t["first_token_ts"] <= t["finish_ts"]
        m = await client.metrics()
        assert m["dhs_finished_total"] == len(prompts) and m["dhs_num_running_reqs"] == 0
        assert await client.stopped() is None
    finally:
        await client.close()
    assert client.proc.exitcode == 0


async def test_stop_strings_aborts_and_refusals_cross_the_process_boundary():
    prompt = golden_prompts()[2]
    (want,) = run_greedy(make_engine(*CFG[1:]), [prompt], 12)
    client = await _start("hardware.max_running_requests=1", "engine.max_waiting=1")
    try:
        srv = Server(client)
        # a stop string is the server's matcher, pickled to the engine and called there
        stop = srv.tok.decode(want[3:5]).strip()
        parsed = srv._parse_generate(
            {
                "input_ids": prompt,
                "sampling_params": {
                    "max_new_tokens": 12,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stop": [stop],
                },
            }
        )
        req, q = await srv._submit(parsed[0], parsed[1], None)
        assert await _collect(q) == want[:5]
        assert req.finish_reason == {"type": "stop", "matched": stop}

        long = Request("same", prompt, SamplingParams(max_new_tokens=400))
        q_long = await client.submit(long)
        with pytest.raises(DuplicateRequest):
            await client.submit(Request("same", prompt, SamplingParams(max_new_tokens=4)))
        with pytest.raises(DuplicateRequest):  # the same object again: refused, still abortable
            await client.submit(long)
        # one runs, one may wait: the third of three is refused wherever the first is
        extra = [Request(f"x{i}", prompt, SamplingParams(max_new_tokens=400)) for i in range(2)]
        with pytest.raises(QueueFull):
            for r in extra:
                await client.submit(r)
        await asyncio.wait_for(q_long.get(), 60)  # it runs
        for r in (long, *extra):
            client.abort(r)
        await _collect(q_long)
        assert long.finish_reason == {"type": "abort"} and len(long.output_ids) < 400
        m = await client.metrics()
        assert m["dhs_num_running_reqs"] == 0 and m["dhs_num_waiting_reqs"] == 0
        assert m["dhs_aborted_total"] >= 1 and m["dhs_rejected_total"] == 1
    finally:
        await client.close()


async def test_a_dead_engine_process_fails_its_streams_and_refuses_work():
    client = await _start()
    try:
        req = Request(client.new_rid(), golden_prompts()[0], SamplingParams(max_new_tokens=400))
        q = await client.submit(req)
        await asyncio.wait_for(q.get(), 60)
        os.kill(client.proc.pid, signal.SIGKILL)
        await _collect(q)
        assert req.finish_reason["type"] == "error"
        assert "engine stopped" in req.finish_reason["message"]
        assert "engine stopped" in await client.stopped()
        with pytest.raises(EngineStopped):
            await client.submit(Request("later", [5, 6], SamplingParams(max_new_tokens=2)))
        assert (await Server(client).metrics(None)).status == 503
    finally:
        await client.close()


async def test_a_start_cancelled_by_a_signal_takes_the_engine_process_down_at_once():
    """SIGTERM while the engine builds (minutes on a large preset) cancels the start: the
    engine process is terminated, not waited for."""
    starting = asyncio.ensure_future(_start())
    await asyncio.sleep(0.2)  # spawned, not yet ready
    t0 = time.monotonic()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert time.monotonic() - t0 < 4
    assert not [p for p in multiprocessing.active_children() if p.name == "dhs-engine"]


def test_first_tokens_leave_before_the_decode_step():
    """Engine.flush_outputs runs after admission, before the step is launched: an engine
    process's first tokens would otherwise reach their streams a decode step late."""
    eng = make_engine(*CFG[1:])
    events = []
    eng.flush_outputs = lambda: events.append(("flush", eng.stats["num_steps"]))
    req = Request("r", golden_prompts()[0], SamplingParams(max_new_tokens=4))
    req.on_output = lambda r, new_ids, done: events.append(("out", len(r.output_ids)))
    eng.submit(req)
    eng.step()
    assert events[:2] == [("out", 1), ("flush", 0)]


async def test_an_engine_that_fails_to_start_says_why():
    with pytest.raises(RuntimeError, match="failed to start(.|\n)*kv_pool_gib"):
        await _start("system=adaptive_dhisparse", "hardware.kv_pool_gib=0.0001")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_cli_server_streams_from_its_engine_process_and_stops_it(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "systems.engine.server", "--port", str(port), *CFG],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120, proc, log)
        (engine_pid,) = map(int, re.findall(r"engine up \(process (\d+)\)", log.read_text()))
        assert engine_pid in _children(proc.pid)
        (want,) = run_greedy(make_engine(*CFG[1:]), [golden_prompts()[1]], 6)
        assert _stream(url) == want  # golden_prompts()[1], 6 tokens, greedy
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while _alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(engine_pid), "the engine process outlived its server"
    finally:
        stop_process(proc, grace_s=5)


def test_the_ipc_benchmark_runs():
    """benchmarks/bench_engine_ipc.py speaks the engine process's wire with its classes."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import bench_engine_ipc
    finally:
        sys.path.pop(0)
    row = asyncio.run(bench_engine_ipc._point(n=3, k=2, rounds=4, warmup=1, prompt_len=10))
    assert row["requests"] == 3 and row["engine_us"] > 0 and row["server_loop_cpu_us"] > 0
    assert row["bytes"] > 3 * 2  # three requests' two tokens each, pickled


def test_a_served_runs_collectors_run_in_the_engine_process(tmp_path):
    """A run through the runner's server (server.mode=subprocess: the engine in its own
    process) with profile=host: the collector runs on the engine thread of that process and
    its file lands in the run's directory, saying where the event loop was."""
    from harness.run import run

    (d,) = run(
        compose(
            [
                "experiment=default_cpu",
                "server.mode=subprocess",
                "workload.concurrency=[2]",
                "workload.num_requests=4",
                "workload.output_len=12",
                "workload.warmup=0",
                f"results_dir={tmp_path}",
                "profile=host",
                "profile.wait=1",
                "profile.active=5",
            ]
        )
    )
    prof = json.loads((d / "host" / "host_profile.json").read_text())
    assert prof["engine_process"] is True and prof["steps"] == 5
    assert prof["event_loop"] in ("uvloop", "asyncio")
    assert {t["thread"] for t in prof["threads"]} >= {"engine", "MainThread"}
