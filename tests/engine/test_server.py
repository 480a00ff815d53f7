"""The HTTP server over real loopback sockets, with the engine on its own thread."""

import asyncio
import time

import aiohttp
import pytest

from systems.engine.server import build_app, start_server
from tests.helpers import golden_prompts, make_engine, read_sse


@pytest.fixture
async def server():
    eng = make_engine("hardware.kv_pool_gib=0.01", "engine.max_new_tokens_cap=256")
    eng.start()
    srv = await start_server(build_app(eng))
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{srv.port}") as s:
        yield s, eng
    await srv.close()
    eng.stop()


PROMPT = golden_prompts()[1]


async def test_generate_non_streaming(server):
    s, eng = server
    r = await s.post(
        "/generate",
        json={
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True},
        },
    )
    assert r.status == 200
    out = await r.json()
    assert len(out["output_ids"]) == 7
    assert out["text"] == "".join(f" w{i}" for i in out["output_ids"])
    mi = out["meta_info"]
    assert mi["prompt_tokens"] == len(PROMPT) and mi["completion_tokens"] == 7
    assert mi["finish_reason"]["type"] == "length"
    for k in ("arrival_ts", "alloc_wait_s", "handoff_s", "prefill_s", "first_token_ts"):
        assert mi["timing"][k] is not None


async def test_generate_streaming_matches_non_streaming(server):
    s, eng = server
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True},
    }
    full = await (await s.post("/generate", json=body)).json()
    r = await s.post("/generate", json={**body, "stream": True})
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    chunks = await read_sse(r)
    assert chunks[-1] == "[DONE]"
    data = chunks[:-1]
    ids = [t for c in data for t in c["output_ids"]]
    assert ids == full["output_ids"]
    assert [c["meta_info"]["completion_tokens"] for c in data] == list(range(1, 10))
    assert data[-1]["text"] == full["text"] and "timing" in data[-1]["meta_info"]
    # every chunk carries the whole text so far (SGLang's default), built piece by piece
    assert [c["text"] for c in data] == ["".join(f" w{i}" for i in ids[:n]) for n in range(1, 10)]


async def test_generate_stream_chunks_are_json_dumps_bytes(server):
    """The incrementally built chunk of a /generate stream is byte for byte what json.dumps
    writes for the same chunk (the whole text decoded and escaped at once), over a stream long
    enough that several chunks extend the text."""
    import json

    s, _ = server
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    r = await s.post("/generate", json=body)
    lines = [raw.decode() async for raw in r.content if raw.strip()]
    assert lines[-1].strip() == "data: [DONE]" and len(lines) == 41
    ids = []
    for line in lines[:-1]:
        chunk = json.loads(line[len("data: ") :])
        ids += chunk["output_ids"]
        assert chunk["text"] == "".join(f" w{i}" for i in ids)
        assert line == f"data: {json.dumps(chunk)}\n"
    # a request id that JSON must escape: quotes, a backslash, non-ASCII
    rid = 'r"\\ü-1'
    r = await s.post("/generate", json={**body, "rid": rid})
    lines = [raw.decode() async for raw in r.content if raw.strip()]
    assert len(lines) == 41
    for line in lines[:-1]:
        chunk = json.loads(line[len("data: ") :])
        assert chunk["meta_info"]["id"] == rid and line == f"data: {json.dumps(chunk)}\n"


async def test_text_prompt_is_accepted(server):
    s, _ = server
    r = await s.post(
        "/generate", json={"text": "hello w5 world", "sampling_params": {"max_new_tokens": 2}}
    )
    assert r.status == 200
    assert (await r.json())["meta_info"]["prompt_tokens"] == 3


async def test_openai_completions(server):
    s, _ = server
    body = {"model": "x", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = await s.post("/v1/completions", json=body)
    assert r.status == 200
    out = await r.json()
    assert out["usage"] == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": 6,
        "total_tokens": len(PROMPT) + 6,
    }
    assert out["choices"][0]["finish_reason"] == "length"
    r = await s.post(
        "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    chunks = await read_sse(r)
    data = chunks[:-1]
    assert "".join(c["choices"][0]["text"] for c in data) == out["choices"][0]["text"]
    assert data[-1]["usage"]["completion_tokens"] == 6
    assert all(c["usage"] is None for c in data[:-1])


async def test_metrics_and_health(server):
    s, _ = server
    r = await s.get("/health")
    assert r.status == 200
    text = await (await s.get("/metrics")).text()
    names = {ln.split()[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    for n in (
        "dhs_num_running_reqs",
        "dhs_num_waiting_reqs",
        "dhs_num_allocated_slots",
        "dhs_kv_pool_used_ratio",
        "dhs_server_loop_cpu_seconds_total",
    ):
        assert n in names
    types = dict(ln.split()[2:4] for ln in text.splitlines() if ln.startswith("# TYPE"))
    assert types["dhs_num_steps"] == types["dhs_server_loop_cpu_seconds_total"] == "counter"
    assert types["dhs_num_running_reqs"] == "gauge"
    models = await (await s.get("/v1/models")).json()
    assert models["data"][0]["id"]


BAD = [
    ("/generate", b"{not json", "body"),
    ("/generate", b"[1, 2]", "body"),
    ("/generate", {"input_ids": [1, 2], "bogus": 1}, "bogus"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"input_ids": [1, 99999]}, "input_ids"),
    ("/generate", {"input_ids": "x" * 0 + "a", "text": "b"}, "text"),
    ("/generate", {"input_ids": [1] * 600, "sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}},
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10_000}},
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "5"}},
        "sampling_params.max_new_tokens",
    ),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"temperature": -1}},
        "sampling_params.temperature",
    ),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"wat": 1}}, "wat"),
    ("/generate", {"input_ids": [1, 2], "stream": "yes"}, "stream"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "", "max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": "a", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "a", "frobnicate": True}, "frobnicate"),
]


@pytest.mark.parametrize("path, body, param", BAD)
async def test_bad_input_is_a_400_naming_the_field(server, path, body, param):
    s, eng = server
    kw = (
        {"data": body, "headers": {"Content-Type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = await s.post(path, **kw)
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == param and param.split(".")[-1] in err["message"] or err["param"] == param
    assert err["message"]
    await asyncio.sleep(0)
    assert not eng.scheduler.running and not eng.scheduler.waiting


async def test_oversized_body_is_413(server):
    s, _ = server
    r = await s.post(
        "/generate", data=b"x" * (17 << 20), headers={"Content-Type": "application/json"}
    )
    assert r.status == 413
    assert (await r.json())["error"]["param"] == "body"


async def test_an_unknown_endpoint_is_a_404_naming_the_served_ones(server):
    s, _ = server
    r = await s.post("/v1/chat/completions", json={"messages": []})
    assert r.status == 404
    msg = (await r.json())["error"]["message"]
    assert msg.startswith("no endpoint POST /v1/chat/completions; this server answers ")
    assert "POST /v1/completions" in msg and "GET /v1/models" in msg and "HEAD" not in msg


async def test_queue_full_is_503_with_retry_after(server):
    s, eng = server
    eng.cfg.max_waiting = 0  # every submission now exceeds the bound
    try:
        r = await s.post("/generate", json={"input_ids": PROMPT})
        assert r.status == 503 and r.headers["Retry-After"] == "1"
    finally:
        eng.cfg.max_waiting = 4096


async def test_client_disconnect_aborts_and_frees_pages(server):
    s, eng = server
    sessions = []
    for _ in range(3):
        cs = aiohttp.ClientSession(base_url=str(s._base_url))
        r = await cs.post(
            "/generate",
            json={
                "input_ids": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": 250, "ignore_eos": True},
            },
        )
        await r.content.readline()  # first token arrived: the request is running
        sessions.append((cs, r))
    assert len(eng.scheduler.running) >= 1
    for cs, r in sessions:
        r.close()
        await cs.close()
    deadline = time.time() + 20
    while time.time() < deadline and (eng.scheduler.running or eng.backend.pages.num_used):
        await asyncio.sleep(0.05)
    assert not eng.scheduler.running
    assert eng.backend.pages.num_used == 0
    assert eng.stats["aborted_total"] == 3
    eng.backend.check_integrity()
    # and the server still serves
    r = await s.post(
        "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    )
    assert r.status == 200


def test_generate_stream_decodes_each_token_once():
    """A /generate stream of n chunks decodes O(n) tokens in all (each chunk's own, then the
    whole output once at the end), not the whole text at every chunk: that was 15 ms of a
    32-stream step at 4,000 tokens, on the thread the engine shares the GIL with."""
    from systems.engine.request import Request
    from systems.engine.server import Server

    srv = Server(make_engine())
    parsed = srv._parse_generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 300}})
    decoded, decode = [], srv.tok.decode
    srv.tok.decode = lambda ids: decoded.append(len(ids)) or decode(ids)
    req = Request("r", PROMPT, parsed[1])
    write = srv._generate_stream(req, parsed)
    for t in range(300):
        req.output_ids.append(t + 2)
        finished = t == 299
        if finished:
            req.finish_reason = {"type": "length", "length": 300}
        write([t + 2], finished, len(req.output_ids))
    assert sum(decoded) <= 2 * 300
