"""Local-only by default (issue 26, point 6): POST bodies must be application/json (a web page can
post text/plain or a form to any address without a CORS preflight), the Host header must name a
loopback address while the server is bound to one (DNS rebinding), and /metrics is valid
Prometheus text (one TYPE line per family, exact values)."""

import http.client

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from systems.engine.server import ServerConfig, build_app, start_server
from tests.helpers import make_engine
from tests.reliability.support import PROMPTS, ThreadedServer, served

BODY = b'{"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}'


def _raw(port: int, method: str, path: str, headers: dict, body: bytes | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for k, v in headers.items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


async def test_only_json_bodies_are_accepted():
    async with served("hardware.kv_pool_gib=0.01") as (s, eng, base):
        for path in ("/generate", "/v1/completions"):
            body = BODY if path == "/generate" else b'{"prompt": [5, 6], "max_tokens": 2}'
            for ctype in (
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                None,
                "text/plain; a=application/json",
            ):
                headers = {"Content-Type": ctype} if ctype else {}
                r = await s.post(
                    path, data=body, headers=headers, skip_auto_headers=["Content-Type"]
                )
                out = await r.json()
                assert r.status == 415, (path, ctype, out)
                assert out["error"]["param"] == "Content-Type"
            for ctype in (
                "application/json",
                "application/json; charset=utf-8",
                "Application/JSON",
            ):
                r = await s.post(path, data=body, headers={"Content-Type": ctype})
                assert r.status == 200, (ctype, await r.text())
        assert eng.stats["finished_total"] == 6


def test_host_must_be_loopback_while_bound_to_loopback():
    with ThreadedServer(make_engine("hardware.kv_pool_gib=0.01")) as srv:
        port = srv.port
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "10.0.0.1",
            "127.0.0.1.evil.net",
            "localhost.evil.net",
            "",
        ):
            for method, path, body in (
                ("POST", "/generate", BODY),
                ("GET", "/metrics", None),
                ("GET", "/health", None),
            ):
                headers = {"Host": host, "Content-Type": "application/json"}
                status, raw = _raw(port, method, path, headers, body)
                assert status == 403, (host, path, raw[:200])
        for host in (
            f"127.0.0.1:{port}",
            "localhost",
            f"localhost:{port}",
            "[::1]:80",
            "127.0.0.2",
        ):
            status, raw = _raw(
                port, "POST", "/generate", {"Host": host, "Content-Type": "application/json"}, BODY
            )
            assert status == 200, (host, raw[:200])
        with ThreadedServer(
            make_engine("hardware.kv_pool_gib=0.01"),
            ServerConfig(allowed_hosts=["engine.internal"]),
        ) as named:
            ok, _ = _raw(named.port, "GET", "/health", {"Host": "engine.internal:8000"})
            bad, _ = _raw(named.port, "GET", "/health", {"Host": "localhost"})
            assert (ok, bad) == (200, 403)


async def test_binding_elsewhere_on_purpose_opens_the_host_check():
    eng = make_engine("hardware.kv_pool_gib=0.01")
    eng.start()
    # bound to all interfaces on purpose (the config says so; the test listens on loopback)
    srv = await start_server(build_app(eng, config=ServerConfig(host="0.0.0.0")), host="127.0.0.1")
    try:
        async with aiohttp.ClientSession() as c:
            r = await c.post(
                f"http://127.0.0.1:{srv.port}/generate",
                data=BODY,
                headers={"Host": "gpu-box.lan:30000", "Content-Type": "application/json"},
            )
            assert r.status == 200, await r.text()
    finally:
        await srv.close()
        eng.stop()


async def test_metrics_pass_prometheus_text_parser():
    async with served("hardware.kv_pool_gib=0.01") as (s, eng, base):
        r = await s.post(
            "/generate", json={"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 2}}
        )
        assert r.status == 200
        # several label values of one family, and a counter past the 6 digits of "%g"
        eng.scheduler.wait_reason_counts.update({"kv_pool_full": 3, "host_pool_full": 5})
        eng.stats["prompt_tokens_total"] = 12_345_678
        async with aiohttp.ClientSession() as c:
            text = await (await c.get(base + "/metrics")).text()
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family's samples must be grouped under one TYPE"
    type_lines = [ln for ln in text.splitlines() if ln.startswith("# TYPE ")]
    assert len(type_lines) == len({ln.split()[2] for ln in type_lines}) == len(families)
    samples = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for f in families
        for smp in f.samples
    }
    assert samples[("dhs_admission_wait_events_total", (("reason", "kv_pool_full"),))] == 3
    assert samples[("dhs_admission_wait_events_total", (("reason", "host_pool_full"),))] == 5
    assert samples[("dhs_prompt_tokens_total", ())] == 12_345_678
    assert samples[("dhs_finished_total", ())] == 1
    kinds = {f.name: f.type for f in families}
    assert kinds["dhs_finished"] == "counter" and kinds["dhs_num_running_reqs"] == "gauge"
