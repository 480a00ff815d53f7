"""What the HTTP server needs of an engine, wherever the engine runs.

The server (systems/engine/server.py) talks to an *engine client*, one of:

- ``LocalEngineClient``: the engine's thread runs in the server's own process (tests,
  ``server.mode=inprocess``, ``server.engine_process=false``);
- ``EngineProcessClient`` (systems/engine/engine_process.py): the engine runs in a process of
  its own and the two exchange messages over a socket pair, as SGLang's HTTP front end and
  scheduler do.

Both offer the same surface, all of it called on the server's event loop:

- ``vocab_size``, ``max_total_tokens``, ``max_new_tokens_cap``: what requests are checked
  against;
- ``new_rid()``;
- ``await submit(req)`` -> an ``asyncio.Queue`` of ``(new_ids, finished, n)``, where ``n`` is
  the number of output tokens as of this item (``req.output_ids`` may already hold more); it
  raises ``QueueFull``, ``DuplicateRequest``, ``EngineStopped`` or ``ValueError`` as
  ``Engine.submit`` does. When the last item arrives, ``req``'s finish reason and timestamps
  are set;
- ``abort(req)``: the request's memory is freed; its queue still gets a last item;
- ``await metrics()``: ``Engine.metrics(sync=False)``, read without waiting for the device;
- ``await stopped()``: why the engine cannot serve any more, or None.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Protocol

from systems.engine.engine import Engine
from systems.engine.request import Request


class EngineClient(Protocol):
    vocab_size: int
    max_total_tokens: int
    max_new_tokens_cap: int | None
    startup_s: dict[str, float]  # wall seconds of each start-up phase

    def new_rid(self) -> str: ...
    async def submit(self, req: Request) -> asyncio.Queue: ...
    def abort(self, req: Request) -> None: ...
    async def metrics(self) -> dict[str, float]: ...
    async def stopped(self) -> str | None: ...
    async def close(self) -> None: ...


class _Outbox:
    """Outputs the engine thread hands to the event loop, one wake-up per batch.

    A step emits tokens for every running request. Handing each to its stream with
    ``call_soon_threadsafe`` costs a self-pipe write and an event-loop iteration per request:
    at 200 running requests, ~400 socket sends a step on the thread the engine shares the GIL
    with (profile=host on dsv41_h200 at ours C256). Here the engine thread appends to a deque
    and schedules one drain while none is pending; the drain hands every queued output to its
    stream's queue in the order they were put (a stream's outputs stay in order)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: deque = deque()
        self._lock = threading.Lock()  # put's check-and-schedule against the drain's swap
        self._scheduled = False

    def put(self, q: asyncio.Queue, item) -> None:  # engine thread
        with self._lock:
            self._items.append((q, item))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed under a running batch: nobody is listening
            pass

    def _drain(self) -> None:  # event loop
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for q, item in items:
            q.put_nowait(item)


class LocalEngineClient:
    """An engine whose thread runs in this process (started and stopped by its owner)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.vocab_size = engine.cfg.model.vocab_size
        self.max_total_tokens = engine.backend.max_total_tokens
        self.max_new_tokens_cap = engine.cfg.max_new_tokens_cap
        self.startup_s = engine.startup_s
        self._outbox: _Outbox | None = None

    def new_rid(self) -> str:
        return self.engine.new_rid()

    async def submit(self, req: Request) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = _Outbox(loop)
        outbox = self._outbox
        q: asyncio.Queue = asyncio.Queue()

        def on_output(req, new_ids, done):  # engine thread
            if loop.is_closed():  # server shutting down under a running batch: nobody is listening
                return
            # the count as of this output: the engine thread may append the next token before
            # the event loop writes this chunk
            outbox.put(q, (list(new_ids), done, len(req.output_ids)))

        req.on_output = on_output
        self.engine.submit(req)
        return q

    def abort(self, req: Request) -> None:
        self.engine.abort(req)

    async def metrics(self) -> dict[str, float]:
        return dict(self.engine.metrics(sync=False))  # on the loop: no wait for the GPU

    async def stopped(self) -> str | None:
        return self.engine.stopped()

    async def close(self) -> None:
        self.engine.stop()
