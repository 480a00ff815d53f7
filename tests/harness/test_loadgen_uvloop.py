"""Event-loop selection in harness.loadgen (uvloop is an optional extra, ``fast``)
and the SSE parser's one-event-per-read fast path (issue 3 client overhead)."""

from __future__ import annotations

import random
import sys

import pytest

from harness.loadgen import (
    GenerateStreamParser,
    LoadConfig,
    OpenAIStreamParser,
    build_arg_parser,
    config_from_args,
    run_load_sync,
)
from systems.event_loops import loop_factory
from tests.harness.fake_server import Program, start_server_process

try:
    import uvloop  # noqa: F401

    HAVE_UVLOOP = True
except ImportError:
    HAVE_UVLOOP = False

NEED_UVLOOP = pytest.mark.skipif(
    not HAVE_UVLOOP,
    reason="uvloop not installed (optional extra: pip install -e '.[fast]'); asyncio path still tested",
)

TTFT_S, ITL_S, C, N, OUT = 0.02, 0.005, 4, 12, 4


@pytest.fixture(scope="module")
def server():
    sp = start_server_process(Program(ttft_s=TTFT_S, itl_s=ITL_S))
    try:
        yield sp
    finally:
        sp.stop()


def _closed_loop(server, event_loop: str) -> dict:
    res = run_load_sync(
        LoadConfig(
            url=server.url,
            concurrency=C,
            num_requests=N,
            input_len=16,
            output_len=OUT,
            warmup=2,
            disable_progress=True,
            metrics_interval=0,
            event_loop=event_loop,
        )
    )
    s = res.summary
    assert s["completed"] == N and s["errors"] == 0
    assert s["total_output_tokens"] == N * OUT
    assert all(sum(n for _, n in r.chunks) == OUT for r in res.records)
    # TTFT is about the programmed wait (the fake server fires timers up to 0.5 ms early);
    # the upper bound is loose (shared CPU), it only catches a loop that delivers reads late
    assert TTFT_S * 1e3 - 1 <= s["ttft_ms_mean"] < TTFT_S * 1e3 + 100
    assert s["config"]["event_loop"] == event_loop
    return s


def test_closed_loop_on_available_loop(server):
    """Default ("auto"): uvloop when importable, else asyncio; recorded as event_loop."""
    s = _closed_loop(server, "auto")
    assert s["event_loop"] == ("uvloop" if HAVE_UVLOOP else "asyncio")


def test_closed_loop_on_asyncio(server):
    assert _closed_loop(server, "asyncio")["event_loop"] == "asyncio"


@NEED_UVLOOP
def test_closed_loop_on_uvloop(server):
    assert _closed_loop(server, "uvloop")["event_loop"] == "uvloop"


def test_loop_factory_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert loop_factory("auto") is None  # falls back to asyncio's default loop
    assert loop_factory("asyncio") is None
    with pytest.raises(RuntimeError, match="not installed"):
        loop_factory("uvloop")
    with pytest.raises(ValueError):
        loop_factory("trio")


def test_cli_event_loop_flag():
    args = build_arg_parser().parse_args(
        ["--concurrency", "1", "--num-requests", "1", "--event-loop", "asyncio"]
    )
    assert config_from_args(args).event_loop == "asyncio"
    assert (
        config_from_args(build_arg_parser().parse_args(["--concurrency", "1"])).event_loop == "auto"
    )


# ---------------------------------------------------------------------------
# fast path (one whole event per read) == general path (any other split)
# ---------------------------------------------------------------------------


def _generate_stream(k: int) -> list[bytes]:
    ev = [b": keep-alive comment\n\n"]
    for i in range(1, k + 1):
        ev.append(
            b'data: {"text":"%s","output_ids":[%d],"meta_info":{"id":"r","prompt_tokens":5,'
            b'"completion_tokens":%d,"finish_reason":null}}\n\n' % (b" t" * i, i, i)
        )
    ev.append(b"data:   \n\n")  # empty payload: ignored
    ev.append(
        b'data: {"text":"x","output_ids":[1,2],"meta_info":{"id":"r","prompt_tokens":5,'
        b'"completion_tokens":%d,"finish_reason":{"type":"length"}}}\r\n\r\n' % (k + 2)
    )
    ev.append(b"data: [DONE]\n\n")
    return ev


def _openai_stream(k: int) -> list[bytes]:
    ev = []
    for _ in range(k):
        ev.append(
            b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":" t t","logprobs":null,"finish_reason":null,"num_tokens":2}],"usage":null}\n\n'
        )
    ev.append(
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n'
        % (2 * k)
    )
    ev.append(b"data: [DONE]\n\n")
    return ev


def _parse(cls, reads: list[bytes]) -> tuple:
    p = cls()
    for i, data in enumerate(reads):
        p.feed(data, float(i))  # stamp = index of the read
    p.finish(1e9)
    return (p.chunks, p.done, p.finish_reason, p.prompt_tokens, p.completion_tokens, p.error, p.buf)


def _expected_stamps(events: list[bytes], reads: list[bytes]) -> list[float]:
    """Each JSON event is stamped with the read that brought its line's first newline."""
    ends, off = [], 0
    for r in reads:
        off += len(r)
        ends.append(off)
    out, off = [], 0
    for e in events:
        if e.startswith(b"data: {"):
            nl = off + e.find(b"\n")
            out.append(float(next(i for i, end in enumerate(ends) if nl < end)))
        off += len(e)
    return out


@pytest.mark.parametrize(
    "cls,make", [(GenerateStreamParser, _generate_stream), (OpenAIStreamParser, _openai_stream)]
)
def test_fast_path_matches_general_path(cls, make):
    rng = random.Random(0)
    for k in (1, 2, 7):
        events = make(k)
        whole = _parse(cls, events)  # one event per read: the fast path
        assert whole[1] and whole[5] is None
        assert [t for t, _ in whole[0]] == _expected_stamps(events, events)
        tokens = [n for _, n in whole[0]]
        blob = b"".join(events)
        splits = [[blob]]  # everything in one read
        for _ in range(
            30
        ):  # random splits: the general path (and the fast path where a read is one event)
            cuts = sorted(rng.sample(range(1, len(blob)), rng.randint(1, min(20, len(blob) - 1))))
            splits.append([blob[a:b] for a, b in zip([0] + cuts, cuts + [len(blob)])])
        for reads in splits:
            got = _parse(cls, reads)
            assert got[1:] == whole[1:]
            assert [n for _, n in got[0]] == tokens
            assert [t for t, _ in got[0]] == _expected_stamps(events, reads)


@pytest.mark.parametrize("choice", ["asyncio", pytest.param("uvloop", marks=NEED_UVLOOP)])
def test_ctrl_c_cancels_the_main_task_on_either_loop(choice):
    """One SIGINT cancels the awaited coroutine (its cleanup runs) and ends in
    KeyboardInterrupt, on asyncio's loop and on uvloop's, even while socket callbacks run."""
    import asyncio
    import os
    import signal

    from harness.loadgen import _ctrl_c_cancels

    cleaned = []

    async def busy():
        # a stream of callbacks, as a load's socket reads are, with the signal among them
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        loop.add_reader(r, lambda: os.read(r, 1))
        loop.call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
        try:
            for _ in range(2000):
                os.write(w, b"x")
                await asyncio.sleep(0.005)
        finally:
            loop.remove_reader(r)
            os.close(r), os.close(w)
            cleaned.append(True)

    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        with pytest.raises(KeyboardInterrupt):
            runner.run(_ctrl_c_cancels(busy()))
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
