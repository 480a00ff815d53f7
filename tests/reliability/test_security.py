"""Security defaults: loopback binding unless told otherwise, no request field reaches config
loading, code loading or the filesystem, and request sizes are capped (body bytes, decompressed
bytes, prompt tokens)."""

import gzip
import http.client
import json
import os
import re
import sys
import threading
import time

import pytest
from omegaconf import OmegaConf

from systems.engine import server as server_mod
from systems.engine.config import compose
from tests.helpers import make_engine
from tests.reliability.support import (
    PROMPTS,
    ThreadedServer,
    assert_drained,
    served,
    wait_idle_sync,
)


# ---------------------------------------------------------------- binding
def test_cli_binds_loopback_by_default(monkeypatch):
    seen = {}

    def fake_serve_forever(start_engine, config, port):
        seen.update(host=config.host, port=port)

    monkeypatch.setattr(server_mod, "serve_forever", fake_serve_forever)
    server_mod.main(["device=cpu"])
    assert seen == {"host": "127.0.0.1", "port": 30000}
    server_mod.main(["--host", "0.0.0.0", "--port", "31000", "device=cpu"])  # only when told
    assert seen == {"host": "0.0.0.0", "port": 31000}


def test_harness_servers_bind_loopback_by_default():
    assert compose([]).server.host == "127.0.0.1"


# ---------------------------------------------------------------- no path to config or files
# Audit events that would mean a request reached the filesystem, a process, or code loading.
_WATCH = (
    "open",
    "os.",
    "shutil.",
    "subprocess.",
    "exec",
    "compile",
    "import",
    "ctypes.",
    "pickle.",
    "marshal.",
    "socket.connect",
    "urllib.",
)
_AUDIT = {"on": False, "threads": set(), "events": []}


def _audit(event, args):
    if _AUDIT["on"] and event.startswith(_WATCH) and threading.get_ident() in _AUDIT["threads"]:
        _AUDIT["events"].append((event, repr(args)[:200]))


_installed = []
PAD = " " * (70 << 10)  # JSON whitespace: a body past the parser processes' 64 KiB


def _install_audit_hook():
    if not _installed:  # audit hooks cannot be removed: install one, inert unless switched on
        sys.addaudithook(_audit)
        _installed.append(True)


HOSTILE = [
    ("/generate", {"input_ids": [1, 2], "_target_": "os.system"}, 400, "_target_"),
    (
        "/generate",
        {
            "input_ids": [1, 2],
            "sampling_params": {"_target_": "builtins.exec", "max_new_tokens": 2},
        },
        400,
        "_target_",
    ),
    ("/generate", {"input_ids": [1, 2], "hydra": {"run": {"dir": "/tmp/pwned"}}}, 400, "hydra"),
    ("/generate", {"input_ids": [1, 2], "config": "/etc/passwd"}, 400, "config"),
    (
        "/generate",
        {"input_ids": [1, 2], "lora_path": "/etc/passwd", "sampling_params": {"max_new_tokens": 2}},
        400,
        "lora_path",
    ),  # unsupported
    (
        "/generate",
        {
            "text": "/etc/passwd ../../x ${oc.env:HOME} ${now:%H}",
            "rid": "../../../tmp/pwned-rid",
            "sampling_params": {"max_new_tokens": 2},
        },
        200,
        None,
    ),
    (
        "/v1/completions",
        {
            "prompt": "${oc.env:HOME}",
            "model": "/etc/passwd",
            "max_tokens": 2,
            "user": "../../tmp/pwned",
        },
        200,
        None,
    ),
    (
        "/v1/completions",
        {"prompt": [1, 2], "max_tokens": 2, "_target_": "os.system"},
        400,
        "_target_",
    ),
    (
        "/v1/completions",
        {"prompt": [1, 2], "max_tokens": 2, "model_path": "/tmp/pwned"},
        400,
        "model_path",
    ),
]


def test_no_request_field_reaches_config_or_filesystem(tmp_path, monkeypatch):
    import hydra.utils

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    calls = []
    for mod, name in (
        (hydra.utils, "instantiate"),
        (hydra.utils, "get_method"),
        (hydra.utils, "get_class"),
        (OmegaConf, "load"),
        (OmegaConf, "create"),
        (OmegaConf, "from_dotlist"),
        (server_mod, "compose_engine_config")
        if hasattr(server_mod, "compose_engine_config")
        else (OmegaConf, "merge"),
    ):
        orig = getattr(mod, name)
        monkeypatch.setattr(
            mod,
            name,
            lambda *a, _n=name, _o=orig, **k: (_AUDIT["on"] and calls.append(_n), _o(*a, **k))[1],
        )
    _install_audit_hook()
    eng = make_engine("hardware.kv_pool_gib=0.01")
    with ThreadedServer(eng) as srv:

        def post(path, body, pad=""):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            c.request("POST", path, json.dumps(body) + pad, {"Content-Type": "application/json"})
            r = c.getresponse()
            out = r.status, json.loads(r.read())
            c.close()
            return out

        post("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})  # warm
        # a large body starts the parser processes (systems/engine/body_parser.py); the audit
        # below watches requests, not that start-up: wait for a body parsed in one
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        for _ in range(100):
            post("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}, PAD)
            c.request("GET", "/metrics")
            if (
                'dhs_http_bodies_parsed_total{where="worker"} 0'
                not in c.getresponse().read().decode()
            ):
                break
            time.sleep(0.05)
        c.close()
        _AUDIT["threads"] = {srv._thread.ident, eng._thread.ident}
        _AUDIT["events"].clear()
        _AUDIT["on"] = True
        try:
            results = [post(path, body) for path, body, _, _ in HOSTILE]
            # the same bodies past 64 KiB (JSON whitespace): parsed in a parser process, whose
            # reply the server reads on this thread (systems/engine/body_parser.py)
            via_parser = [post(path, body, PAD) for path, body, _, _ in HOSTILE]
            events = list(_AUDIT["events"])
            # positive control: the hook does see a file opened on the server's thread
            done = threading.Event()
            srv.loop.call_soon_threadsafe(lambda: (open(os.devnull).close(), done.set()))
            assert done.wait(10)
            assert any(e == "open" and os.devnull in a for e, a in _AUDIT["events"])
        finally:
            _AUDIT["on"] = False
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.request("GET", "/metrics")
        metrics = c.getresponse().read().decode()
        c.close()
        m = re.search(r'dhs_http_bodies_parsed_total\{where="worker"\} (\d+)', metrics)
        assert m and int(m.group(1)) == len(HOSTILE) + 1  # each padded hostile body, one warm
        wait_idle_sync(eng)
        assert_drained(eng)
    assert [r[0] for r in via_parser] == [r[0] for r in results]
    assert [r[1].get("error") for r in via_parser] == [r[1].get("error") for r in results]
    for (_path, body, status, param), (got, out) in zip(HOSTILE, results):
        assert got == status, (body, out)
        if status == 400:
            assert out["error"]["param"] == param and param in out["error"]["message"]
    # interpolation syntax is text, never resolved: 4 words -> 4 tokens, 1 word -> 1 token
    assert results[5][1]["meta_info"]["prompt_tokens"] == 4
    assert results[6][1]["usage"]["prompt_tokens"] == 1
    assert results[6][1]["model"] == "dhs-bundled"  # the model field selects nothing
    assert events == [], events[:10]
    assert calls == []
    assert list(work.iterdir()) == []
    assert not any(p.name.startswith("pwned") for p in tmp_path.parent.iterdir())


# ---------------------------------------------------------------- size caps
@pytest.fixture(scope="module")
def capped():
    eng = make_engine("hardware.kv_pool_gib=0.01", "engine.max_new_tokens_cap=16")
    with ThreadedServer(eng) as srv:
        yield srv
        wait_idle_sync(eng)
        assert_drained(eng)


def _raw(srv, body: bytes, headers: dict, chunked=False):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        if chunked:

            def gen():
                for i in range(0, len(body), 1 << 20):
                    yield body[i : i + (1 << 20)]

            c.request(
                "POST",
                "/generate",
                gen(),
                {**headers, "Transfer-Encoding": "chunked"},
                encode_chunked=True,
            )
        else:
            c.request("POST", "/generate", body, headers)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    except (BrokenPipeError, ConnectionResetError):
        return None, None  # the server may close the socket once it has answered 413
    finally:
        c.close()


def test_bodies_over_16_mib_are_413(capped):
    big = b'{"text": "' + b"a " * ((16 << 20) // 2) + b'"}'
    assert len(big) > server_mod.MAX_BODY_BYTES
    status, out = _raw(capped, big, {"Content-Type": "application/json"})
    assert status == 413 and out["error"]["param"] == "body"
    status, out = _raw(capped, big, {"Content-Type": "application/json"}, chunked=True)
    assert status in (413, None)  # with no Content-Length the cap hits mid-stream
    if status:
        assert out["error"]["param"] == "body"


def test_compressed_bodies_are_capped_after_decompression(capped):
    bomb = gzip.compress(b" " * (24 << 20))  # 24 KiB on the wire, 24 MiB inflated
    assert len(bomb) < 100_000
    status, out = _raw(
        capped, bomb, {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert status == 413 and out["error"]["param"] == "body"


@pytest.mark.parametrize("field", ["input_ids", "text", "prompt"])
def test_prompt_length_is_capped_by_the_context(capped, field):
    ctx = make_engine().backend.max_total_tokens  # 512 for tiny
    huge = 4 << 20  # far past the context: rejected before per-token work
    if field == "input_ids":
        body = {"input_ids": [7] * huge}
    elif field == "text":
        body = {"text": "w7 " * huge}
    else:
        body = {"prompt": [7] * huge, "max_tokens": 1}
    data = json.dumps(body).encode()
    path = "/v1/completions" if field == "prompt" else "/generate"
    c = http.client.HTTPConnection("127.0.0.1", capped.port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    took = time.perf_counter() - t0
    c.close()
    assert r.status == 400 and out["error"]["param"] == field
    assert str(ctx) in out["error"]["message"]
    assert took < 10
    # and at the boundary: the prompt fits, the prompt + max tokens does not
    body = {"input_ids": [7] * (ctx - 2), "sampling_params": {"max_new_tokens": 3}}
    c = http.client.HTTPConnection("127.0.0.1", capped.port, timeout=60)
    c.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    assert r.status == 400 and out["error"]["param"] == "input_ids"


# ---------------------------------------------------------------- isolation between clients
async def test_a_live_request_id_cannot_be_reused_to_hijack_it():
    """Request ids name requests inside the engine (aborts go by id): a second request with the
    id of one in flight is refused, so one client cannot abort another's request."""
    async with served("hardware.kv_pool_gib=0.01") as (s, eng, base):
        sp = {"max_new_tokens": 60, "ignore_eos": True}
        first = await s.post(
            "/generate",
            json={"input_ids": PROMPTS[1], "rid": "job-1", "stream": True, "sampling_params": sp},
        )
        await first.content.readline()
        second = await s.post(
            "/generate",
            json={"input_ids": PROMPTS[0], "rid": "job-1", "stream": True, "sampling_params": sp},
        )
        assert second.status == 400
        assert (await second.json())["error"]["param"] == "rid"
        body = await first.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        last = json.loads(body.rstrip().split(b"\n\n")[-2][6:])
        assert last["meta_info"]["completion_tokens"] == 60  # not aborted by the second one
        # once finished, the id is free again
        again = await s.post(
            "/generate",
            json={
                "input_ids": PROMPTS[0],
                "rid": "job-1",
                "sampling_params": {"max_new_tokens": 2},
            },
        )
        assert again.status == 200
