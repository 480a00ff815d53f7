"""The in-process client answers like the HTTP server (same validation and shapes)."""

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from systems.engine.client import ClientError, InProcessClient
from systems.engine.server import build_app
from tests.helpers import golden_prompts, make_engine

PROMPT = golden_prompts()[2]
BODY = {
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
}


@pytest.fixture
async def both():
    eng = make_engine("hardware.kv_pool_gib=0.01")
    eng.start()
    srv = TestServer(build_app(eng), host="127.0.0.1")
    await srv.start_server()
    async with aiohttp.ClientSession(base_url=str(srv.make_url(""))) as s:
        yield InProcessClient(eng), s, eng
    await srv.close()
    eng.stop()


async def test_same_answer_as_http(both):
    client, http, eng = both
    a = await client.generate(BODY)
    b = await (await http.post("/generate", json=BODY)).json()
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
    assert a["meta_info"]["completion_tokens"] == 6
    c = await client.completions(
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
    assert c["usage"]["completion_tokens"] == 6
    assert c["choices"][0]["text"] == a["text"]


async def test_streaming_chunks(both):
    client, _, eng = both
    chunks = [c async for c in client.generate_stream({**BODY, "stream": True})]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == list(range(1, 7))
    assert "timing" in chunks[-1]["meta_info"]


async def test_errors_match_the_server(both):
    client, http, _ = both
    bad = {"input_ids": [], "sampling_params": {"max_new_tokens": 3}}
    with pytest.raises(ClientError) as e:
        await client.generate(bad)
    r = await http.post("/generate", json=bad)
    assert e.value.status == r.status == 400
    assert e.value.body == await r.json()


async def test_stopping_a_stream_aborts_and_frees(both):
    client, _, eng = both
    gen = client.generate_stream(
        {**BODY, "stream": True, "sampling_params": {"max_new_tokens": 200}}
    )
    await gen.__anext__()
    await gen.aclose()
    import asyncio

    # the engine thread releases the slot's pages before the slot itself: wait for both, or
    # check_integrity (from this thread) can land between the two
    for _ in range(200):
        if not eng.scheduler.running and eng.backend.is_empty and eng.backend.pages.num_used == 0:
            break
        await asyncio.sleep(0.02)
    assert eng.backend.pages.num_used == 0
    eng.backend.check_integrity()
