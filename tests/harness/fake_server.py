"""Programmable fake streaming server for load-generator tests and benchmarks.

A real aiohttp web server on 127.0.0.1 that speaks

* ``POST /generate`` (SGLang native streaming protocol),
* ``POST /v1/completions`` (OpenAI style, with ``usage`` + ``timing``),
* ``GET /metrics`` (Prometheus text: its own in-flight count as
  ``dhs_num_running_reqs`` plus selected-row counters),
* ``GET /health``,

and a small control API used by tests:

* ``GET /stats`` -> in-flight, max in-flight, request counts, in-flight timeline
* ``POST /reset`` -> zero the statistics
* ``POST /program`` (JSON) -> change the :class:`Program` fields given

Token emission follows a programmed schedule with absolute deadlines measured
from the request's arrival in the handler: chunk ``k`` (0-based) is sent at
``arrival + ttft_s + k * itl_s`` and carries ``tokens_per_chunk`` tokens (the
last one fewer if ``max_new_tokens`` is not a multiple).  Emission runs from
``loop.call_at`` callbacks that write pre-framed HTTP chunks straight to the
transport: the response headers (buffered by ``prepare()``) go out with the
first event and the chunked-body terminator with the last, so a request costs
one ``send()`` per event and nothing more.  When the server falls behind,
every event already due is written in one ``transport.write`` (events are
never merged; only the syscall is).

The in-flight count is decremented just before the final event is written, so
a closed-loop client that starts a new request after reading ``[DONE]`` can
never make the server see C+1 concurrent requests.

Run standalone: ``python -m tests.harness.fake_server --port 30000 --ttft 0.05 --itl 0.01``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["Program", "FakeServer", "start_server_process", "ServerProcess"]


@dataclass
class Program:
    ttft_s: float = 0.02  # arrival -> first chunk
    itl_s: float = 0.005  # gap between consecutive token chunks
    tokens_per_chunk: int = 1
    empty_chunk_every: int = (
        0  # k > 0: after every k-th token chunk also send a 0-token chunk (same instant + itl/2)
    )
    token_text: str = " t"  # text of one token
    openai_num_tokens: bool = True  # add "num_tokens" to each OpenAI choice
    alloc_wait_s: float = 0.0  # reported in timing
    handoff_s: float = 0.0  # reported in timing
    queue_limit: int = 0  # > 0: 503 + Retry-After when in-flight >= limit
    retry_after: int = 1
    error_every: int = 0  # k > 0: every k-th request (1-based) gets HTTP error_status
    error_status: int = 500
    abort_every: int = 0  # k > 0: every k-th request is aborted after its first chunk
    host_threshold: int = 0  # selected rows come from host when in-flight > threshold (0: never)
    rows_per_token: int = 10
    batch_due: bool = True  # write all due events of a stream in one syscall when behind
    # epoll rounds timeouts up to whole ms, so call_at() fires 0-1 ms late; firing
    # this much early centres the emission error on zero.
    timer_advance_s: float = 0.0005


class _Stream:
    __slots__ = (
        "srv",
        "transport",
        "api",
        "rid",
        "n_total",
        "prompt_tokens",
        "arrival_mono",
        "arrival_ts",
        "first_token_ts",
        "sent_tokens",
        "k",
        "events",
        "done",
        "abort",
        "handle",
        "created",
        "closed",
        "pre",
        "writer",
        "headers_sent",
    )


class FakeServer:
    def __init__(self, program: Program | None = None):
        self.program = program or Program()
        self.reset_stats()
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_post("/generate", self.h_generate)
        self.app.router.add_post("/v1/completions", self.h_completions)
        self.app.router.add_get("/metrics", self.h_metrics)
        self.app.router.add_get("/health", self.h_health)
        self.app.router.add_get("/stats", self.h_stats)
        self.app.router.add_post("/reset", self.h_reset)
        self.app.router.add_post("/program", self.h_program)
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self._tok_esc = b" t"

    # ---- statistics ---------------------------------------------------

    def reset_stats(self) -> None:
        self.inflight = 0
        self.max_inflight = 0
        self.requests = 0  # accepted + rejected
        self.accepted = 0
        self.rejected = 0
        self.completed = 0
        self.prompts: list[int] = []  # each accepted request's prompt, as a hash, in order
        self.tokens_emitted = 0
        self.events_emitted = 0
        self.writes = 0
        self.write_s = 0.0
        self.rows_total = 0
        self.rows_host = 0
        self.max_lateness_s = 0.0
        self.lateness_sum = 0.0
        self.lateness_n = 0
        self.timeline: list[tuple[float, int]] = []  # (epoch, in-flight) after each change
        self.first_token_lateness: list[float] = []

    def _inflight_change(self, d: int) -> None:
        self.inflight += d
        if self.inflight > self.max_inflight:
            self.max_inflight = self.inflight
        self.timeline.append((time.time(), self.inflight))

    # ---- lifecycle ------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, backlog=8192, reuse_address=True)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    # ---- control endpoints ---------------------------------------------

    async def h_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def h_stats(self, request: web.Request) -> web.Response:
        d = {
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "requests": self.requests,
            "accepted": self.accepted,
            "prompts": self.prompts,
            "rejected": self.rejected,
            "completed": self.completed,
            "tokens_emitted": self.tokens_emitted,
            "events_emitted": self.events_emitted,
            "writes": self.writes,
            "write_s": self.write_s,
            "max_lateness_s": self.max_lateness_s,
            "mean_lateness_s": self.lateness_sum / self.lateness_n if self.lateness_n else None,
            "program": dataclasses.asdict(self.program),
            "cpu_s": time.process_time(),
        }
        if request.query.get("timeline"):
            d["timeline"] = self.timeline
        if request.query.get("lateness"):
            d["first_token_lateness"] = self.first_token_lateness
        return web.json_response(d)

    async def h_reset(self, request: web.Request) -> web.Response:
        # streams of an earlier test may still be closing (their client gone, the server not yet
        # told): zeroing the in-flight count under them would let their late decrements hold it
        # below the true count (a run's dhs_num_running_reqs then read 0 with four requests in
        # flight), so the reset waits for them, up to a few seconds
        deadline = asyncio.get_running_loop().time() + 5.0
        while self.inflight > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        self.reset_stats()
        return web.json_response({"ok": True})

    async def h_program(self, request: web.Request) -> web.Response:
        d = await request.json()
        fields = {f.name for f in dataclasses.fields(Program)}
        bad = [k for k in d if k not in fields]
        if bad:
            return _error(400, f"unknown program fields {bad}", "invalid_request_error")
        self.program = dataclasses.replace(self.program, **d)
        return web.json_response(dataclasses.asdict(self.program))

    async def h_metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# HELP dhs_num_running_reqs Requests currently streaming.",
            "# TYPE dhs_num_running_reqs gauge",
            f'dhs_num_running_reqs{{gpu="0"}} {self.inflight}',
            "# TYPE fake_requests_total counter",
            f"fake_requests_total {self.requests}",
            f"fake_tokens_total {self.tokens_emitted}",
            f'dhs_selected_rows_total{{gpu="0"}} {self.rows_total}',
            f'dhs_selected_rows_from_host_total{{gpu="0"}} {self.rows_host}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # ---- generation endpoints --------------------------------------------

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "generate")

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "openai")

    async def _handle(self, request: web.Request, api: str) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrival_mono = loop.time()
        arrival_ts = time.time()
        prog = self.program
        self.requests += 1
        try:
            body = await request.json()
        except Exception:
            return _error(400, "body is not valid JSON", "invalid_request_error")
        if api == "generate":
            ids = body.get("input_ids")
            if ids is None and body.get("text") is not None:
                ids = list(range(len(str(body["text"]).split())))
            sp = body.get("sampling_params") or {}
            n_total = sp.get("max_new_tokens", 16)
            stream = bool(body.get("stream", False))
            rid = body.get("rid") or f"r{self.requests}"
        else:
            prompt = body.get("prompt")
            ids = prompt if isinstance(prompt, list) else list(range(len(str(prompt).split())))
            n_total = body.get("max_tokens", 16)
            stream = bool(body.get("stream", False))
            rid = f"cmpl-{self.requests}"
        if not isinstance(ids, list) or not isinstance(n_total, int) or n_total < 1:
            return _error(
                400,
                "need input_ids/prompt and max tokens >= 1",
                "invalid_request_error",
                "input_ids",
            )
        if not stream:
            return _error(400, "fake server only streams", "invalid_request_error", "stream")
        if prog.queue_limit and self.inflight >= prog.queue_limit:
            self.rejected += 1
            return _error(
                503,
                "server queue is full",
                "server_overloaded",
                headers={"Retry-After": str(prog.retry_after)},
            )
        if prog.error_every and self.requests % prog.error_every == 0:
            self.rejected += 1
            return _error(prog.error_status, "injected failure", "internal_error")

        self.accepted += 1
        self.prompts.append(hash(tuple(ids)))
        self._inflight_change(+1)
        resp = _SSEResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)  # headers stay buffered; sent with the first event
        except BaseException:
            self._inflight_change(-1)
            raise
        st = _Stream()
        st.srv = self
        st.transport = request.transport
        st.writer = resp._payload_writer
        st.headers_sent = False
        st.api = api
        st.rid = rid
        st.n_total = n_total
        st.prompt_tokens = len(ids)
        st.arrival_mono = arrival_mono
        st.arrival_ts = arrival_ts
        st.first_token_ts = None
        st.sent_tokens = 0
        st.k = 0
        st.events = self._plan(n_total, prog)
        st.done = loop.create_future()
        st.abort = bool(prog.abort_every) and self.accepted % prog.abort_every == 0
        st.created = int(arrival_ts)
        st.closed = False
        self._tok_esc = json.dumps(prog.token_text)[1:-1].encode()
        if api == "generate":
            st.pre = b'],"meta_info":{"id":%s,"prompt_tokens":%d,"completion_tokens":' % (
                json.dumps(rid).encode(),
                st.prompt_tokens,
            )
        else:
            nt = b',"num_tokens":%d' if prog.openai_num_tokens else b""
            st.pre = (
                b'data: {"id":%s,"object":"text_completion","created":%d,"model":"fake","choices":[{"index":0,'
                % (json.dumps(rid).encode(), st.created)
                + b'"text":"%s","logprobs":null,"finish_reason":null'
                + nt
                + b'}],"usage":null}\n\n'
            )
        st.handle = loop.call_at(
            arrival_mono + st.events[0][0] - prog.timer_advance_s, self._emit, st
        )
        try:
            await st.done
        except asyncio.CancelledError:  # client went away
            st.handle.cancel()
            if not st.closed:
                st.closed = True
                self._inflight_change(-1)
            raise
        try:
            await resp.write_eof()
        except Exception:
            pass
        return resp

    @staticmethod
    def _plan(n_total: int, prog: Program) -> list[tuple[float, int]]:
        """[(offset_from_arrival_s, n_tokens)] for every event."""
        k = max(1, int(prog.tokens_per_chunk))
        ev: list[tuple[float, int]] = []
        left = n_total
        i = 0
        while left > 0:
            n = min(k, left)
            t = prog.ttft_s + i * prog.itl_s
            ev.append((t, n))
            left -= n
            i += 1
            if prog.empty_chunk_every and i % prog.empty_chunk_every == 0 and left > 0:
                ev.append((t + prog.itl_s / 2, 0))
        return ev

    # ---- emission ------------------------------------------------------------

    def _emit(self, st: _Stream) -> None:
        if st.closed:
            return
        loop = asyncio.get_event_loop()
        now = loop.time()
        prog = self.program
        events = st.events
        parts: list[bytes] = []
        lateness = now - (st.arrival_mono + events[st.k][0])
        if lateness > self.max_lateness_s:
            self.max_lateness_s = lateness
        self.lateness_sum += lateness
        self.lateness_n += 1
        if st.k == 0:
            self.first_token_lateness.append(lateness)
        final = False
        while True:
            off, n = events[st.k]
            st.k += 1
            st.sent_tokens += n
            if st.first_token_ts is None and n > 0:
                st.first_token_ts = time.time()
            final = st.k >= len(events) or (st.abort and st.sent_tokens > 0)
            self.tokens_emitted += n
            self.events_emitted += 1
            rows = n * prog.rows_per_token
            self.rows_total += rows
            if prog.host_threshold and self.inflight > prog.host_threshold:
                self.rows_host += rows
            if final:
                st.closed = True
                self._inflight_change(-1)
                self.completed += 1
                parts.append(self._event(st, n, True))
                parts.append(b"data: [DONE]\n\n")
                break
            parts.append(self._event(st, n, False))
            if not prog.batch_due or st.arrival_mono + events[st.k][0] - prog.timer_advance_s > now:
                break
        payload = b"".join(parts)
        tr = st.transport
        if tr is None or tr.is_closing():
            st.closed = True
            if not final:
                self._inflight_change(-1)
            if not st.done.done():
                st.done.set_result(None)
            return
        _t0 = time.perf_counter()
        frame = b"%x\r\n%s\r\n" % (len(payload), payload)
        if not st.headers_sent:  # first write: prepend the buffered response headers
            st.headers_sent = True
            frame = _take_headers(st.writer) + frame
        if final:  # and the chunked-body terminator, in the same syscall
            frame += _mark_eof(st.writer)
        tr.write(frame)
        self.write_s += time.perf_counter() - _t0
        self.writes += 1
        if final:
            if not st.done.done():
                st.done.set_result(None)
        else:
            st.handle = loop.call_at(
                st.arrival_mono + events[st.k][0] - prog.timer_advance_s, self._emit, st
            )

    def _timing(self, st: _Stream) -> dict:
        prog = self.program
        return {
            "arrival_ts": st.arrival_ts,
            "alloc_wait_s": prog.alloc_wait_s,
            "handoff_s": prog.handoff_s,
            "prefill_s": max(0.0, prog.ttft_s - prog.alloc_wait_s - prog.handoff_s),
            "first_token_ts": st.first_token_ts,
            "finish_ts": time.time(),
        }

    def _event(self, st: _Stream, n: int, final: bool) -> bytes:
        prog = self.program
        if st.api == "generate":
            if final:
                fr: Any = (
                    {"type": "abort", "message": "injected abort"}
                    if st.abort and st.sent_tokens < st.n_total
                    else {"type": "length", "length": st.sent_tokens}
                )
                obj = {
                    "text": prog.token_text * st.sent_tokens,
                    "output_ids": list(range(st.sent_tokens - n, st.sent_tokens)),
                    "meta_info": {
                        "id": st.rid,
                        "prompt_tokens": st.prompt_tokens,
                        "completion_tokens": st.sent_tokens,
                        "finish_reason": fr,
                        "timing": self._timing(st),
                    },
                }
                return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
            # hot path: bytes formatting with per-stream precomputed pieces
            if n == 1:
                ids = b"%d" % (st.sent_tokens - 1)
            else:
                ids = b",".join([b"%d" % i for i in range(st.sent_tokens - n, st.sent_tokens)])
            return b'data: {"text":"%s","output_ids":[%s%s%d,"finish_reason":null}}\n\n' % (
                self._tok_esc * st.sent_tokens,
                ids,
                st.pre,
                st.sent_tokens,
            )
        # OpenAI completions
        if not final and prog.openai_num_tokens:
            return st.pre % (self._tok_esc * n, n)
        choice: dict = {
            "index": 0,
            "text": prog.token_text * n,
            "logprobs": None,
            "finish_reason": None,
        }
        if prog.openai_num_tokens:
            choice["num_tokens"] = n
        if final:
            choice["finish_reason"] = (
                "abort" if (st.abort and st.sent_tokens < st.n_total) else "length"
            )
        head = {"id": st.rid, "object": "text_completion", "created": st.created, "model": "fake"}
        out = (
            b"data: "
            + json.dumps(dict(head, choices=[choice], usage=None), separators=(",", ":")).encode()
            + b"\n\n"
        )
        if final:
            usage = {
                "prompt_tokens": st.prompt_tokens,
                "completion_tokens": st.sent_tokens,
                "total_tokens": st.prompt_tokens + st.sent_tokens,
            }
            last = dict(head, choices=[], usage=usage, timing=self._timing(st))
            out += b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n"
        return out


class _SSEResponse(web.StreamResponse):
    """Streaming response whose headers go out with the first event (one
    syscall fewer per request; aiohttp >= 3.11 buffers them when asked)."""

    _send_headers_immediately = False


def _take_headers(writer: Any) -> bytes:
    """Buffered header bytes of an aiohttp StreamWriter, marked as sent; b"" if
    this aiohttp already sent them."""
    hb = getattr(writer, "_headers_buf", None)
    if hb and not getattr(writer, "_headers_written", True):
        writer._headers_buf = None
        writer._headers_written = True
        return bytes(hb)
    if hasattr(writer, "send_headers"):
        writer.send_headers()
    return b""


def _mark_eof(writer: Any) -> bytes:
    """Terminating chunk written by us; tell aiohttp's writer the body is done so
    the handler's ``write_eof()`` adds nothing."""
    if hasattr(writer, "_eof") and getattr(writer, "chunked", False):
        writer._eof = True
        return b"0\r\n\r\n"
    return b""


def _error(
    status: int, message: str, etype: str, param: str | None = None, headers: dict | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": etype, "param": param}},
        status=status,
        headers=headers,
    )


# --------------------------------------------------------------------------
# running in a separate process
# --------------------------------------------------------------------------

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServerProcess:
    """A fake server in a child process; ``url`` is its base URL."""

    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_server_process(
    program: Program | None = None, port: int = 0, cpu: int | None = None
) -> ServerProcess:
    """Start a :class:`FakeServer` in a child process (``python -m
    tests.harness.fake_server``), optionally pinned to ``cpu``, and wait until
    it listens."""
    cmd = [
        sys.executable,
        "-m",
        "tests.harness.fake_server",
        "--port",
        str(port),
        "--program",
        json.dumps(dataclasses.asdict(program or Program())),
    ]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    env = dict(os.environ)
    env["PYTHONPATH"] = _REPO_ROOT + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=_REPO_ROOT, env=env, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "fake server on http://127.0.0.1:PORT"
    if not line.startswith("fake server on "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return ServerProcess(proc, int(line.rsplit(":", 1)[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--ttft", type=float, default=None)
    ap.add_argument("--itl", type=float, default=None)
    ap.add_argument("--tokens-per-chunk", type=int, default=None)
    ap.add_argument("--program", default=None, help="Program fields as JSON")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    a = ap.parse_args(argv)
    prog = Program(**json.loads(a.program)) if a.program else Program()
    if a.ttft is not None:
        prog.ttft_s = a.ttft
    if a.itl is not None:
        prog.itl_s = a.itl
    if a.tokens_per_chunk is not None:
        prog.tokens_per_chunk = a.tokens_per_chunk
    if a.cpu is not None:
        try:
            os.sched_setaffinity(0, {a.cpu})
        except (AttributeError, OSError):
            pass

    async def run() -> None:
        srv = FakeServer(prog)
        port = await srv.start(port=a.port)
        print(f"fake server on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
