"""Load generator against the programmable fake server (a real aiohttp server in
a child process, so client and server each get a core)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from harness import metrics as M
from harness.loadgen import LoadConfig, run_load, run_load_sync
from harness.records import read_jsonl
from tests.harness.fake_server import Program, start_server_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _post(url, obj):
    req = urllib.request.Request(
        url, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


class Server:
    def __init__(self, proc):
        self.proc = proc
        self.url = proc.url

    def program(self, **kw):
        """Reset the program to defaults + ``kw`` and zero the statistics."""
        import dataclasses

        _post(self.url + "/program", dict(dataclasses.asdict(Program()), **kw))
        _post(self.url + "/reset", {})

    def stats(self, **q):
        qs = "&".join(f"{k}=1" for k in q)
        return _get(self.url + "/stats" + ("?" + qs if qs else ""))


@pytest.fixture(scope="module")
def server():
    sp = start_server_process(Program())
    try:
        yield Server(sp)
    finally:
        sp.stop()


def close(measured_s, programmed_s):
    """Within 1 ms or 2 %, whichever is larger."""
    return abs(measured_s - programmed_s) <= max(1e-3, 0.02 * programmed_s)


def cfg(server, **kw):
    base = dict(
        url=server.url, input_len=16, output_len=8, disable_progress=True, metrics_interval=0
    )
    base.update(kw)
    return LoadConfig(**base)


# ---------------------------------------------------------------------------
# latency accuracy + closed-loop concurrency
# ---------------------------------------------------------------------------

# Programmed values are chosen so that the fake server's own per-request cost
# (~0.2-0.3 ms of Python + loopback syscalls per request on a 2-vCPU VM, paid
# serially when a whole wave of C requests starts at once) stays inside the
# 1 ms / 2 % tolerance; docs/metrics.md ("Accuracy") lists the measured errors.
ACCURACY_CASES = [
    # C,    n,    ttft, itl,   out, tokens/chunk, api,      warmup
    (1, 6, 0.20, 0.020, 8, 1, "generate", 1),
    (64, 128, 0.50, 0.050, 8, 1, "generate", 64),
    (64, 128, 0.50, 0.090, 18, 3, "openai", 64),
    # one measured wave after a warmup wave that opened the 1000 connections; a wave of
    # 1000 is paid serially by client and server, so it runs alone (a parallel worker on
    # a 2-core machine put its TTFT 70-170 ms late)
    pytest.param(1000, 1000, 3.00, 0.100, 11, 1, "generate", 1000, marks=pytest.mark.solo),
]


@pytest.mark.parametrize("C,n,ttft,itl,out,k,api,warmup", ACCURACY_CASES, ids=lambda v: str(v))
def test_latency_accuracy_and_closed_loop(server, C, n, ttft, itl, out, k, api, warmup):
    chunks = -(-out // k)
    want = {
        "ttft_ms_mean": ttft,
        "ttft_ms_median": ttft,
        "tpot_ms_mean": (chunks - 1) * itl / (out - 1),
        "itl_ms_mean": itl,
        "itl_ms_median": itl,
        "itl_per_token_ms_mean": itl / k,
    }
    # Timing can only be disturbed upwards by other load on the machine (a CI
    # neighbour, a GC pause in the server); one clean attempt out of three shows
    # the client measures correctly.  The closed-loop invariants hold on every one.
    attempts = []
    for _ in range(3):
        server.program(ttft_s=ttft, itl_s=itl, tokens_per_chunk=k)
        res = run_load_sync(
            cfg(
                server,
                api=api,
                concurrency=C,
                num_requests=n,
                output_len=out,
                warmup=warmup,
                prefixes=4,
            )
        )
        s = res.summary
        st = server.stats()
        assert s["errors"] == 0, s["error_examples"]
        assert s["completed"] == n
        assert s["total_output_tokens"] == n * out
        # closed loop: the server saw exactly C concurrent requests, never more
        assert st["max_inflight"] == C
        assert st["accepted"] == n + max(warmup, 4)  # the warm-up prepares every prefix
        if k > 1:
            assert s["itl_per_token_ms_mean"] < s["itl_ms_mean"]
        bad = {
            key: (round(s[key], 3), w * 1e3)
            for key, w in want.items()
            if not close(s[key] / 1e3, w)
        }
        attempts.append(bad)
        if not bad:
            break
    assert not attempts[-1], (
        f"C={C}: measured vs programmed (ms) outside 1ms/2% in every attempt: {attempts}"
    )


def test_closed_loop_reaches_and_holds_c(server):
    """The server sees C in flight, never more, and (time-weighted) close to C
    throughout: a replacement starts as soon as a request's stream ends."""
    C = 16
    server.program(ttft_s=0.1, itl_s=0.02, tokens_per_chunk=1)
    res = run_load_sync(
        cfg(server, concurrency=C, num_requests=5 * C, output_len=6, metrics_interval=0.05)
    )
    st = server.stats(timeline=1)
    assert st["max_inflight"] == C
    tl = np.array(st["timeline"])  # (epoch, in-flight after each change)
    t0 = min(r.send_epoch for r in res.records) + 0.05
    t1 = max(r.send_epoch for r in res.records)
    seg = tl[(tl[:, 0] >= t0) & (tl[:, 0] <= t1)]
    assert seg[:, 1].max() == C
    # time-weighted mean in-flight over the steady part of the run; the dips are the
    # ~1-3 ms turnarounds (final chunk -> client -> new request -> server)
    dt = np.diff(np.append(seg[:, 0], t1))
    assert np.sum(seg[:, 1] * dt) / np.sum(dt) > 0.9 * C
    assert res.summary["active_mean"] == pytest.approx(C, abs=2.0)


# ---------------------------------------------------------------------------
# schedules
# ---------------------------------------------------------------------------


def test_schedule_switches_on_time_without_draining(server, tmp_path):
    server.program(ttft_s=0.05, itl_s=0.01, tokens_per_chunk=1, host_threshold=4)
    phases = [(2, 0.6), (8, 0.6), (2, 0.6)]
    sched = ",".join(f"{c}:{d}" for c, d in phases)
    t_start = time.time()
    res = run_load_sync(
        cfg(
            server,
            schedule=sched,
            output_len=10,
            metrics_interval=0.1,
            summary_out=str(tmp_path / "s.json"),
        )
    )
    wall = time.time() - t_start
    s = res.summary
    st = server.stats(timeline=1)
    assert s["errors"] == 0
    # run ends when the schedule ends (+ draining the last requests, ~0.15 s each)
    assert 1.8 <= wall < 1.8 + 1.0
    # phase boundaries on time
    starts = [p["start_mono"] for p in res.phases]
    assert len(starts) == 3
    for i in (1, 2):
        assert starts[i] - starts[0] == pytest.approx(0.6 * i, abs=0.02)
    # records carry the phase / target at send time
    for r in res.records:
        ph = res.phases[r.phase]
        assert ph["start_mono"] <= r.send_mono <= ph["end_mono"]
        assert r.concurrency == phases[r.phase][0]
    assert {r.phase for r in res.records} == {0, 1, 2}
    # server side: 8 in flight soon after the switch up, never more than 8
    assert st["max_inflight"] == 8
    off = res.records[0].send_epoch - res.records[0].send_mono
    tl = np.array(st["timeline"])
    up = tl[tl[:, 0] >= starts[1] + off]
    t_reach8 = up[up[:, 1] >= 8][0, 0] - (starts[1] + off)
    assert t_reach8 < 0.05  # new requests start at once, not when the old ones finish
    # phase 0: never more than 2
    ph0 = tl[(tl[:, 0] > starts[0] + off + 0.01) & (tl[:, 0] < starts[1] + off)]
    assert ph0[:, 1].max() <= 2
    # after the switch down, in-flight drains to <= 2 (no new request starts meanwhile)
    # and stays there; a request lasts ~0.15 s
    down = tl[(tl[:, 0] > starts[2] + off + 0.25)]
    assert down[:, 1].max() <= 2
    sent_after_down = sorted(r.send_mono for r in res.records if r.phase == 2)
    # the first phase-2 request starts only after in-flight fell below 2,
    # i.e. after the phase-1 requests drained (>= one TTFT after the switch)
    assert sent_after_down[0] - starts[2] > 0.04
    # per-phase stats
    ps = s["phases"]
    assert [p["concurrency"] for p in ps] == [2, 8, 2]
    assert all(p["requests"] > 0 for p in ps)
    assert all(p["tpot_ms_mean"] == pytest.approx(10.0, abs=1.0) for p in ps)
    assert all(p["tok_s_per_session"] == pytest.approx(1000.0 / p["tpot_ms_mean"]) for p in ps)
    assert ps[0]["host_fetched_share"] == pytest.approx(0.0, abs=1e-9)
    assert ps[1]["host_fetched_share"] > 0.5
    assert ps[1]["output_tok_s"] > 2 * ps[0]["output_tok_s"]
    # post-wave for schedules excludes the first C of phase 0
    assert s["post_wave_exclude"] == 2
    on_disk = json.loads((tmp_path / "s.json").read_text())
    assert on_disk["phases"][1]["concurrency"] == 8


# ---------------------------------------------------------------------------
# post-wave, warmup, open loop
# ---------------------------------------------------------------------------


def test_post_wave_excludes_exactly_first_c(server):
    C, n = 8, 40
    server.program(ttft_s=0.02, itl_s=0.005)
    res = run_load_sync(cfg(server, concurrency=C, num_requests=n, output_len=4, warmup=3))
    s = res.summary
    assert [r.index for r in res.records] == list(range(n))  # warmup not recorded
    assert server.stats()["accepted"] == n + 3
    assert s["post_wave_exclude"] == C
    assert s["post_wave_completed"] == n - C
    keep = [r for r in res.records if r.index >= C]
    assert s["post_wave_ttft_ms_mean"] == pytest.approx(np.mean([M.ttft_s(r) for r in keep]) * 1e3)
    assert s["post_wave_tpot_ms_mean"] == pytest.approx(np.mean([M.tpot_s(r) for r in keep]) * 1e3)
    # the first C are the first C by send time
    first = sorted(res.records, key=lambda r: r.send_mono)[:C]
    assert {r.index for r in first} == set(range(C))


def test_warmup_prepares_every_prefix(server):
    """With prepared prefixes the warm-up sends one request per prefix (at least ``warmup``), so
    no prefix is first met, and prefilled, inside the measured window; ``warmup=0`` sends none."""
    server.program(ttft_s=0.005, itl_s=0.001)
    res = run_load_sync(
        cfg(server, concurrency=2, num_requests=6, output_len=2, warmup=1, prefixes=5)
    )
    st = server.stats()
    assert st["accepted"] == 6 + 5 and res.summary["warmup"] == 5
    warm, measured = st["prompts"][:5], st["prompts"][5:]
    assert len(set(warm)) == 5 and set(measured) <= set(warm)
    server.program(ttft_s=0.005, itl_s=0.001)
    res = run_load_sync(
        cfg(server, concurrency=2, num_requests=6, output_len=2, warmup=0, prefixes=5)
    )
    assert server.stats()["accepted"] == 6 and res.summary["warmup"] == 0


def test_open_loop_poisson(server):
    server.program(ttft_s=0.01, itl_s=0.002)
    res = run_load_sync(cfg(server, request_rate=200.0, num_requests=60, output_len=3, seed=3))
    s = res.summary
    assert s["completed"] == 60 and s["post_wave_exclude"] is None
    sends = np.sort([r.send_mono for r in res.records])
    gaps = np.diff(sends)
    assert 0.5 / 200 < gaps.mean() < 2.0 / 200
    assert all(r.concurrency is None for r in res.records)
    # rate=inf sends everything at once
    server.program(ttft_s=0.3, itl_s=0.002)
    res = run_load_sync(cfg(server, request_rate=float("inf"), num_requests=50, output_len=2))
    sends = [r.send_mono for r in res.records]
    assert max(sends) - min(sends) < 0.2
    assert server.stats()["max_inflight"] == 50
    # open loop capped at 5 in flight (SGLang's --max-concurrency)
    server.program(ttft_s=0.05, itl_s=0.002)
    res = run_load_sync(
        cfg(server, request_rate=float("inf"), concurrency=5, num_requests=30, output_len=2)
    )
    assert res.summary["completed"] == 30
    assert server.stats()["max_inflight"] == 5
    assert all(r.concurrency == 5 for r in res.records)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_503_retry_after_counted_as_errors(server):
    server.program(ttft_s=0.05, itl_s=0.01, queue_limit=4, retry_after=7)
    res = run_load_sync(cfg(server, concurrency=8, num_requests=40, output_len=4))
    s = res.summary
    rej = [r for r in res.records if r.status == 503]
    assert rej, "expected rejections"
    assert s["errors"] == len(rej) == server.stats()["rejected"]
    assert s["completed"] + s["errors"] == 40
    assert s["errors_by_status"] == {"503": len(rej)}
    for r in rej:
        assert not r.success and r.retry_after == 7.0
        assert r.error.startswith("HTTP 503") and "queue is full" in r.error
    # latency stats only over the successful ones
    ok = [r for r in res.records if r.success]
    assert s["ttft_ms_mean"] == pytest.approx(np.mean([M.ttft_s(r) for r in ok]) * 1e3)


def test_http_500_and_aborts_counted(server):
    server.program(ttft_s=0.01, itl_s=0.005, error_every=5, abort_every=3)
    res = run_load_sync(cfg(server, api="openai", concurrency=4, num_requests=30, output_len=4))
    s = res.summary
    st = server.stats()
    n500 = sum(1 for r in res.records if r.status == 500)
    n_abort = sum(1 for r in res.records if r.status == 200 and not r.success)
    assert n500 == st["rejected"] > 0
    assert n_abort > 0 and all(
        "abort" in r.error for r in res.records if r.status == 200 and not r.success
    )
    assert s["errors"] == n500 + n_abort
    assert s["completed"] == 30 - s["errors"]


def test_status_lines_where_no_progress_bar_can_be_drawn(server, capsys):
    """stderr is not a terminal here (a log, CI): a line every progress_interval seconds."""
    server.program(ttft_s=0.05, itl_s=0.05)
    c = cfg(server, concurrency=2, num_requests=8, disable_progress=False, progress_interval=0.1)
    assert run_load_sync(c).summary["completed"] == 8
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[loadgen] ")]
    assert len(lines) >= 3 and "/8 requests done (0 failed)" in lines[-1]
    run_load_sync(cfg(server, concurrency=2, num_requests=4, progress_interval=0.1))
    assert "[loadgen]" not in capsys.readouterr().err  # disable_progress: nothing


def test_timeout_is_an_error(server):
    server.program(ttft_s=0.05, itl_s=0.5)
    res = run_load_sync(cfg(server, concurrency=2, num_requests=2, output_len=4, timeout=0.3))
    assert res.summary["errors"] == 2
    for r in res.records:
        assert r.error.startswith("timeout") and r.status == 200 and len(r.chunks) == 1


def test_connection_refused_is_an_error():
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    res = run_load_sync(
        LoadConfig(
            url=f"http://127.0.0.1:{port}",
            concurrency=2,
            num_requests=4,
            input_len=4,
            output_len=2,
            disable_progress=True,
            metrics_interval=0,
        )
    )
    assert res.summary["errors"] == 4 and res.summary["completed"] == 0
    assert all(r.status is None and r.error for r in res.records)
    assert res.summary["errors_by_status"] == {"no_response": 4}


def test_cli_against_no_server_says_so_in_one_line(capsys):
    import socket

    from harness.loadgen import main as loadgen_main

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    argv = ["--url", f"http://127.0.0.1:{port}", "--concurrency", "2", "--output-len", "4"]
    assert loadgen_main([*argv, "--num-requests", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot connect to http://127.0.0.1:{port}:") and "refused" in err
    assert loadgen_main([*argv, "--num-requests", "0"]) == 2
    assert capsys.readouterr().err == "error: num_requests must be >= 1, got 0\n"


# ---------------------------------------------------------------------------
# records / metrics files
# ---------------------------------------------------------------------------


def test_records_flushed_per_request_and_survive_cancel(server, tmp_path):
    server.program(ttft_s=0.01, itl_s=0.01)
    out = tmp_path / "records.jsonl"
    summ = tmp_path / "summary.json"

    async def main():
        task = asyncio.create_task(
            run_load(
                cfg(
                    server,
                    concurrency=4,
                    num_requests=10_000,
                    output_len=5,
                    out=str(out),
                    summary_out=str(summ),
                )
            )
        )
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if out.exists():
                n = len(out.read_text().splitlines())
                seen.append(n)
                if n >= 12:
                    break
        # mid-run: complete, parseable lines already on disk
        mid = list(read_jsonl(out))
        assert len(mid) >= 12
        assert all(r["success"] and len(r["chunks"]) == 5 for r in mid)
        assert len(set(seen)) > 2  # the file grew while running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(mid)

    n_mid = asyncio.run(main())
    after = list(read_jsonl(out))
    assert n_mid <= len(after) < 10_000
    s = json.loads(summ.read_text())
    assert s["interrupted"] is True and s["completed"] == len(after)
    # every record field the brief asks for
    r = after[0]
    for key in (
        "rid",
        "phase",
        "concurrency",
        "send_mono",
        "send_epoch",
        "chunks",
        "prompt_tokens",
        "completion_tokens",
        "timing",
        "status",
        "error",
        "success",
    ):
        assert key in r
    assert r["prompt_tokens"] == 16 and r["completion_tokens"] == 5 and r["status"] == 200
    assert set(r["timing"]) >= {
        "arrival_ts",
        "alloc_wait_s",
        "handoff_s",
        "prefill_s",
        "first_token_ts",
        "finish_ts",
    }


def test_cli_writes_records_summary_and_metrics(server, tmp_path):
    server.program(ttft_s=0.02, itl_s=0.01, alloc_wait_s=0.005, handoff_s=0.002)
    out, summ, met = tmp_path / "r.jsonl", tmp_path / "s.json", tmp_path / "m.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "harness.loadgen",
        "--url",
        server.url,
        "--api",
        "generate",
        # 20 tokens 10 ms apart: the run lasts ~1.3 s, so the central half (Active) holds several
        # 0.05 s scrapes even on a loaded CI machine
        "--concurrency",
        "4",
        "--num-requests",
        "24",
        "--input-len",
        "32",
        "--output-len",
        "20",
        "--prefixes",
        "2",
        "--warmup",
        "2",
        "--out",
        str(out),
        "--summary-out",
        str(summ),
        "--metrics-out",
        str(met),
        "--metrics-interval",
        "0.05",
        "--num-gpus",
        "2",
        "--disable-progress",
        "--seed",
        "5",
    ]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "output_tok_s" in p.stdout
    s = json.loads(summ.read_text())
    for key in (
        "completed",
        "errors",
        "duration_s",
        "output_tok_s",
        "output_tok_s_per_gpu",
        "request_throughput",
        "ttft_ms_mean",
        "ttft_ms_median",
        "ttft_ms_p90",
        "ttft_ms_p99",
        "tpot_ms_mean",
        "tpot_ms_median",
        "tpot_ms_p90",
        "tpot_ms_p99",
        "itl_ms_mean",
        "itl_ms_median",
        "itl_ms_p90",
        "itl_ms_p99",
        "itl_per_token_ms_mean",
        "e2e_ms_mean",
        "e2e_ms_median",
        "e2e_ms_p90",
        "e2e_ms_p99",
        "post_wave_ttft_ms_mean",
        "post_wave_ttft_ms_p99",
        "post_wave_tpot_ms_mean",
        "post_wave_tpot_ms_p99",
        "alloc_wait_s_mean",
        "handoff_s_mean",
        "ttft_other_s_mean",
        "active_mean",
        "phases",
    ):
        assert key in s, key
    assert s["completed"] == 24 and s["errors"] == 0
    assert s["output_tok_s_per_gpu"] == pytest.approx(s["output_tok_s"] / 2)
    assert s["alloc_wait_s_mean"] == pytest.approx(0.005)
    assert s["ttft_other_s_mean"] == pytest.approx(s["ttft_ms_mean"] / 1e3 - 0.007)
    recs = list(read_jsonl(out))
    assert len(recs) == 24
    # prepared prefixes: request i uses prefix i % 2 -> server saw 32 prompt tokens
    assert all(r["prompt_tokens"] == 32 for r in recs)
    lines = list(read_jsonl(met))
    assert len(lines) >= 2
    assert all("ts" in ln and 'dhs_num_running_reqs{gpu="0"}' in ln["values"] for ln in lines)
    assert s["active_mean"] is not None and 1.0 <= s["active_mean"] <= 4.0
    # bad invocation
    p = subprocess.run(
        [sys.executable, "-m", "harness.loadgen", "--url", server.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2


def test_config_from_mapping():
    c = LoadConfig.from_mapping({"url": "http://x", "request-rate": 3.0, "num_requests": 5})
    assert c.request_rate == 3.0 and c.mode() == "open"
    assert LoadConfig(concurrency=4).mode() == "closed"
    assert LoadConfig(concurrency=4, request_rate=2.0).mode() == "open"
    assert LoadConfig(concurrency=4, schedule="1:1").mode() == "schedule"
    with pytest.raises(TypeError):
        LoadConfig.from_mapping({"nope": 1})
    with pytest.raises(ValueError):
        LoadConfig().mode()


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"input_len": 0}, "input_len"),
        ({"input_len": -5}, "input_len"),
        ({"output_len": 0}, "output_len"),
        ({"num_requests": 0}, "num_requests"),
        ({"num_requests": -3}, "num_requests"),
        ({"concurrency": 0}, "concurrency"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"warmup": -1}, "warmup"),
        ({"prefixes": 0}, "prefixes"),
        ({"api": "grpc"}, "api"),
        ({"num_gpus": 0}, "num_gpus"),
    ],
)
def test_check_names_the_value_out_of_range(bad, field):
    """A load that cannot succeed fails before a request is sent, naming the value."""
    ok = dict(concurrency=2, num_requests=4, input_len=8, output_len=4)
    LoadConfig(**ok).check()
    with pytest.raises(ValueError, match=f"^{field}"):
        LoadConfig(**{**ok, **bad}).check()


@pytest.mark.parametrize("api", ["generate", "openai"])
@pytest.mark.parametrize("prefixes", [None, 3])
def test_warmup_output_len_caps_the_warm_up_only(api, prefixes):
    """``warmup_output_len``: the warm-up's bodies carry their own output cap, the same prompt
    as a measured request of that prefix; measured bodies keep ``output_len``."""
    from harness.loadgen import LoadConfig, _Bodies

    key = "max_new_tokens" if api == "generate" else "max_tokens"

    def parsed(b: bytes) -> tuple[list, int]:
        d = json.loads(b)
        ids = d["input_ids"] if api == "generate" else d["prompt"]
        return ids, (d["sampling_params"] if api == "generate" else d)[key]

    base = dict(
        url="http://x", api=api, input_len=12, output_len=50, prefixes=prefixes, vocab_size=100
    )
    bodies = _Bodies(LoadConfig(**base, warmup_output_len=4))
    warm_ids, warm_cap = parsed(bodies.body(1, "w-1", warmup=True))
    ids, cap = parsed(bodies.body(1, "m-1"))
    assert (warm_cap, cap) == (4, 50) and len(warm_ids) == len(ids) == 12
    if prefixes:
        assert warm_ids == ids  # the prefix the warm-up prepares is the measured one
    plain = _Bodies(LoadConfig(**base))  # absent: the warm-up runs as long as a request
    assert parsed(plain.body(1, "w-1", warmup=True))[1] == 50
    with pytest.raises(ValueError, match="warmup_output_len"):
        LoadConfig(**base, concurrency=1, num_requests=1, warmup_output_len=0).check()
