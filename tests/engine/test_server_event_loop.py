"""server.event_loop: the bundled server process runs on uvloop where installed ("auto"), or on
the loop asked for; either serves the same tokens, streamed, and its log names the loop (and
where the engine runs)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from harness import servers
from systems.engine.config import compose
from systems.engine.server import ServerConfig
from systems.event_loops import loop_factory
from tests.helpers import golden_prompts

LOOPS = ["asyncio"] + (["uvloop"] if loop_factory("auto") is not None else [])


def _stream(url: str) -> list[int]:
    body = {
        "input_ids": golden_prompts()[1],
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    req = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    ids = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                ids += json.loads(line[6:])["output_ids"]
    return ids


def test_each_loop_serves_the_same_stream(tmp_path):
    """... and so does the engine as a thread beside the loop (server.engine_process=false)."""
    outs = {}
    for loop, engine_process in [(loop, True) for loop in LOOPS] + [("asyncio", False)]:
        cfg = compose(
            [
                "device=cpu",
                "server.mode=subprocess",
                "hardware.kv_pool_gib=0.01",
                f"server.event_loop={loop}",
                f"server.engine_process={str(engine_process).lower()}",
            ]
        )
        work = tmp_path / f"{loop}-{engine_process}"
        with servers.bundled_server(cfg, work) as url:
            outs[loop, engine_process] = _stream(url)
        (log,) = work.glob("server-*.log")
        assert f"(event loop: {loop})" in log.read_text()
        assert ("engine up (process " in log.read_text()) is engine_process
    assert len(outs["asyncio", True]) == 6 and len(set(map(tuple, outs.values()))) == 1


def test_auto_is_uvloop_where_installed_and_a_bad_name_is_refused():
    assert ServerConfig.from_cfg(compose([]).server).event_loop == "auto"
    with pytest.raises(ValueError, match="event_loop"):
        ServerConfig(event_loop="trio")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_listener_the_loop_closed_is_opened_again(loop, monkeypatch):
    """uvloop closes a listening socket for good on an accept error (ENOBUFS, ENOMEM) without
    a log line; the server's watch opens it again on the same port, on either loop."""
    import aiohttp

    from systems.engine import server as server_mod
    from tests.helpers import make_engine

    monkeypatch.setattr(server_mod.Serving, "WATCH_S", 0.05)
    eng = make_engine("hardware.kv_pool_gib=0.01")
    eng.start()

    async def main():
        serving = await server_mod.start_server(server_mod.build_app(eng))
        assert server_mod.SERVING_LOOP == loop  # what a host profile records
        port = serving.port
        try:
            serving.site._server.close()  # what uvloop's fatal accept error does
            for _ in range(100):
                await asyncio.sleep(0.05)
                if serving.relistens:
                    break
            assert serving.relistens == 1 and serving.port == port
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/health") as r:
                    assert r.status == 200
        finally:
            await serving.close()

    try:
        with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
            runner.run(main())
    finally:
        eng.stop()
