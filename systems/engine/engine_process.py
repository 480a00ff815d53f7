"""The engine in a process of its own beside the HTTP server's (``server.engine_process``).

In one process the engine thread and the server's event loop share a GIL. Served at ours C256
on dsv41_h200 (Fig. 10's host profile), the engine thread spent ~13 ms of a ~72 ms step
waiting to get the GIL back after its host-to-device copies while the event loop wrote ~200
streams a step. SGLang runs its scheduler in a process apart from the HTTP front end, vLLM its
engine core; here:

- the server's process keeps HTTP, validation, the tokenizer and the streams;
- the engine process (spawned) runs ``Engine`` on its thread; its main thread receives
  submissions, aborts and queries and answers them;
- one socket pair carries length-prefixed pickles both ways. The engine thread sends what it
  emitted as one message at each ``Engine.flush_outputs``: after admission (first tokens) and
  after the decode step; the server's side applies it to its copy of each request (tokens; at
  the end the finish reason and timestamps) and hands it to the request's stream.

The server's side never blocks on the engine's: it reads and writes the socket as an asyncio
stream, and a call (submit, metrics, health) awaits its reply. A request is numbered by the
server's side (``seq``), so an abort can never reach a later request that reuses its id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from typing import Any

from systems.engine.engine import DuplicateRequest, EngineConfig, EngineStopped
from systems.engine.prefill import packed_ids
from systems.engine.request import ReqStatus, Request

log = logging.getLogger("dhs.engine_process")

_HEADER = struct.Struct("!Q")  # the length of the pickle that follows
# what the server's copy of a request learns when it finishes (Request.timing's inputs)
FINISH_FIELDS = (
    "finish_reason",
    "prefill_done_ts",
    "prefill_s",
    "alloc_ts",
    "handoff_done_ts",
    "first_token_ts",
    "finish_ts",
)
LOG_FORMAT = "%(asctime)s %(name)s %(message)s"
# in an engine process: the event loop the server's process serves on (a host profile of the
# engine records it; profiling/host.py)
SERVER_LOOP: str | None = None


def _dumps(msg: Any) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------- server's side
class EngineProcessClient:
    """The server's handle on an engine process (the interface of
    systems/engine/engine_client.py). ``await EngineProcessClient.start(cfg)`` returns once the
    engine is built (model, pools, CUDA graphs) and serving."""

    STOP_GRACE_S = 60.0  # the engine's exit writes its profiles; then SIGTERM, then SIGKILL

    def __init__(self, proc, reader, writer, info: dict):
        self.proc = proc
        self._reader, self._writer = reader, writer
        self.info = info
        self.vocab_size = info["vocab_size"]
        self.max_total_tokens = info["max_total_tokens"]
        self.max_new_tokens_cap = info["max_new_tokens_cap"]
        self.startup_s: dict[str, float] = info["startup_s"]
        self._rids = itertools.count()
        self._seqs = itertools.count()
        self._call_ids = itertools.count()
        self._live: dict[int, tuple[Request, asyncio.Queue]] = {}
        self._seq_of: dict[int, int] = {}  # id(req) -> seq, while it is live
        self._calls: dict[int, asyncio.Future] = {}
        self._down: str | None = None
        self._closing = False
        self._reading = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def start(
        cls,
        cfg: EngineConfig,
        *,
        switch_interval_ms: float | None = None,
        server_loop: str | None = None,
    ) -> EngineProcessClient:
        """Spawn the engine process and wait until it serves. Raises RuntimeError with the
        engine's traceback if it fails to start. Call from the thread that stays alive as long
        as the server (the child dies with it: PR_SET_PDEATHSIG follows that thread)."""
        ours, theirs = socket.socketpair()
        ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
        proc = ctx.Process(
            target=run_engine_process,
            args=(theirs, cfg, os.getpid(), switch_interval_ms, server_loop),
            name="dhs-engine",
        )
        proc.start()
        theirs.close()
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        try:
            msg = await _read(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            await loop.run_in_executor(None, _stop_process, proc, 10.0)
            raise RuntimeError(
                f"the engine process exited (code {proc.exitcode}) before it was ready"
            ) from None
        except BaseException:  # cancelled while the engine starts (SIGTERM): take it down now
            writer.close()
            proc.terminate()  # its SIGTERM handler unwinds the engine's construction
            await loop.run_in_executor(None, _stop_process, proc, 10.0)
            raise
        if msg[0] == "failed":
            writer.close()
            await loop.run_in_executor(None, _stop_process, proc, 10.0)
            raise RuntimeError(f"the engine failed to start:\n{msg[1]}")
        log.info("engine process %d up", proc.pid)
        return cls(proc, reader, writer, msg[1])

    # ------------------------------------------------------------------ engine client
    def new_rid(self) -> str:
        return f"req-{next(self._rids)}"

    async def submit(self, req: Request) -> asyncio.Queue:
        ids = packed_ids(req.prompt_ids)  # pickled as bytes, not one object per token
        if id(req) in self._seq_of:  # this very object is in flight already
            raise DuplicateRequest(f"request id {req.rid!r} is already in flight")
        seq = next(self._seqs)
        q: asyncio.Queue = asyncio.Queue()
        # registered before it is sent: the engine thread may emit before the reply is written
        self._live[seq] = (req, q)
        self._seq_of[id(req)] = seq
        try:
            await self._call("submit", seq, req.rid, ids, req.params, req.arrival_ts)
        except asyncio.CancelledError:  # it may have been taken in: free it there
            self._send(("abort", seq))
            self._forget(seq, req)
            raise
        except BaseException:
            self._forget(seq, req)
            raise
        return q

    def abort(self, req: Request) -> None:
        seq = self._seq_of.get(id(req))
        if seq is not None and self._down is None:
            self._send(("abort", seq))  # its last output still comes back and ends it here

    async def metrics(self) -> dict[str, float]:
        return await self._call("metrics", timeout_s=30.0)

    async def stopped(self) -> str | None:
        try:
            return await self._call("health", timeout_s=30.0)
        except EngineStopped as e:
            return str(e)
        except TimeoutError:
            return "engine process not answering"

    async def close(self) -> None:
        """Stop the engine (its collectors write their files) and wait for its process."""
        self._closing = True
        if self._down is None:
            self._send(("stop",))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _stop_process, self.proc, self.STOP_GRACE_S)
        self._reading.cancel()
        self._writer.close()
        self._lost(f"closed (exit code {self.proc.exitcode})")

    # ------------------------------------------------------------------ wire
    def _send(self, msg: Any) -> None:
        if not self._writer.is_closing():
            self._writer.write(_dumps(msg))

    async def _call(self, kind: str, *args, timeout_s: float | None = None) -> Any:
        if self._down is not None:
            raise EngineStopped(f"engine stopped: {self._down}")
        cid = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        try:
            self._send((kind, cid, *args))
            async with asyncio.timeout(timeout_s):
                return await fut
        finally:
            self._calls.pop(cid, None)

    def _forget(self, seq: int, req: Request) -> None:
        self._live.pop(seq, None)
        if self._seq_of.get(id(req)) == seq:
            del self._seq_of[id(req)]

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await _read(self._reader)
                if msg[0] == "out":
                    self._deliver(msg[1])
                else:  # ("reply", call id, ok, value)
                    fut = self._calls.get(msg[1])
                    if fut is not None and not fut.done():
                        if msg[2]:
                            fut.set_result(msg[3])
                        else:
                            fut.set_exception(msg[3])
        except (asyncio.IncompleteReadError, ConnectionError):
            # its exit status, where it comes within a moment of the connection closing
            await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 2.0)
            code = self.proc.exitcode
            self._lost("the engine process exited" + ("" if code is None else f" (code {code})"))
        except Exception as e:  # a message that does not unpickle: nothing after it can be read
            log.exception("engine process connection broken")
            self._lost(f"connection to the engine process broken: {e!r}")

    def _deliver(self, items: list) -> None:
        for seq, new_ids, done, state in items:
            entry = self._live.get(seq)
            if entry is None:
                continue
            req, q = entry
            if new_ids:
                req.output_ids.extend(new_ids)
            if done:
                self._forget(seq, req)
                for name, value in state.items():
                    setattr(req, name, value)
                req.status = ReqStatus.FINISHED
            q.put_nowait((new_ids, done, len(req.output_ids)))

    def _lost(self, reason: str) -> None:
        """The engine is gone: every request still streaming ends with an error, every call
        fails, and later submissions are refused (503)."""
        if self._down is not None:
            return
        self._down = reason
        (log.info if self._closing else log.error)("engine process: %s", reason)
        now = time.time()
        for seq, (req, q) in list(self._live.items()):
            self._forget(seq, req)
            req.finish_reason = {"type": "error", "message": f"engine stopped: {reason}"}
            req.finish_ts = now
            req.status = ReqStatus.FINISHED
            q.put_nowait(([], True, len(req.output_ids)))
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineStopped(f"engine stopped: {reason}"))


async def _read(reader: asyncio.StreamReader) -> Any:
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(n))


def _stop_process(proc, grace_s: float) -> None:
    proc.join(grace_s)
    for stop in (proc.terminate, proc.kill):
        if proc.exitcode is not None:
            return
        stop()
        proc.join(10.0)


# ---------------------------------------------------------------------- engine's side
class _Wire:
    """The engine process's end of the socket pair: whole messages, sent from two threads (the
    engine thread's outputs, the main thread's replies)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, msg: Any) -> None:
        data = _dumps(msg)
        with self._lock:
            self.sock.sendall(data)

    def recv(self) -> Any:
        (n,) = _HEADER.unpack(self._exactly(_HEADER.size))
        return pickle.loads(self._exactly(n))

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError("the server's process closed the connection")
            got += k
        return buf


class _Outputs:
    """What the engine thread emitted since the last round, sent as one message per round."""

    def __init__(self, wire: _Wire, live: dict[int, Request]):
        self.wire = wire
        self.live = live
        self._items: list = []
        self._lock = threading.Lock()

    def callback(self, seq: int):
        def on_output(req: Request, new_ids: list[int], done: bool) -> None:  # engine thread
            state = None
            if done:
                state = {name: getattr(req, name) for name in FINISH_FIELDS}
                self.live.pop(seq, None)
            with self._lock:
                self._items.append((seq, list(new_ids), done, state))

        return on_output

    def flush(self) -> None:  # Engine.flush_outputs
        with self._lock:
            items, self._items = self._items, []
        if items:
            try:
                self.wire.send(("out", items))
            except OSError:  # the server's process is gone; the main thread sees it too
                pass


def _exit_on_sigterm(signum, frame):
    raise SystemExit(0)


def run_engine_process(
    sock: socket.socket,
    cfg: EngineConfig,
    parent_pid: int,
    switch_interval_ms: float | None,
    server_loop: str | None,
) -> None:
    """The engine process's main: build the engine, start its thread, then serve the server
    process's messages until it says stop or goes away."""
    global SERVER_LOOP
    from systems.engine.engine import Engine
    from systems.pids import die_with_parent

    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the server stops us
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwind: the engine's collectors finish
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if switch_interval_ms is not None:
        sys.setswitchinterval(switch_interval_ms / 1e3)
    SERVER_LOOP = server_loop or "unknown"
    wire = _Wire(sock)
    try:
        engine = Engine(cfg)
    except BaseException:
        wire.send(("failed", traceback.format_exc()))
        raise SystemExit(1) from None
    live: dict[int, Request] = {}
    outputs = _Outputs(wire, live)
    engine.flush_outputs = outputs.flush
    engine.start()
    wire.send(
        (
            "ready",
            {
                "pid": os.getpid(),
                "vocab_size": cfg.model.vocab_size,
                "max_total_tokens": engine.backend.max_total_tokens,
                "max_new_tokens_cap": cfg.max_new_tokens_cap,
                "startup_s": engine.startup_s,
            },
        )
    )
    try:
        _serve(wire, engine, live, outputs)
    finally:
        engine.stop()


def _serve(wire: _Wire, engine, live: dict[int, Request], outputs: _Outputs) -> None:
    while True:
        try:
            msg = wire.recv()
        except (EOFError, ConnectionError):
            return  # the server's process is gone
        kind = msg[0]
        if kind == "abort":
            req = live.get(msg[1])
            if req is not None:
                engine.abort(req)
            continue
        if kind == "stop":
            return
        cid = msg[1]
        try:
            if kind == "submit":
                seq, rid, ids, params, arrival_ts = msg[2:]
                req = Request(
                    rid, ids, params, on_output=outputs.callback(seq), arrival_ts=arrival_ts
                )
                live[seq] = req
                try:
                    engine.submit(req)
                except BaseException:
                    live.pop(seq, None)
                    raise
                value = None
            elif kind == "metrics":
                value = dict(engine.metrics(sync=False))
            elif kind == "health":
                value = engine.stopped()
            else:
                raise ValueError(f"unknown message {kind!r}")
            reply = ("reply", cid, True, value)
        except Exception as e:
            reply = ("reply", cid, False, _picklable(e))
        wire.send(reply)
