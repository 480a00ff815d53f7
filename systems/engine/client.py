"""In-process client with the HTTP server's interface, without sockets (tests, notebooks).

    client = InProcessClient(engine)          # engine.start() already called
    out = await client.generate({"input_ids": [...], "sampling_params": {...}})
    async for chunk in client.generate_stream({...}):   # the SSE chunks, as dicts
        ...
    out = await client.completions({"prompt": [...], "max_tokens": 8})

Bodies are validated and answered by the same code as ``systems.engine.server`` (same fields,
same errors, same response shapes); failures raise ``ClientError`` carrying the HTTP status and
the JSON error body the server would have sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from systems.engine.engine import DuplicateRequest, Engine, EngineStopped
from systems.engine.scheduler import QueueFull
from systems.engine.server import BadRequest, Server, _failed


class ClientError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        etype: str = "invalid_request_error",
    ):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = {"error": {"message": message, "type": etype, "param": param}}


class InProcessClient:
    def __init__(self, engine: Engine, model_name: str = "dhs-bundled"):
        self.engine = engine
        self.server = Server(engine, model_name)

    async def _start(self, body: dict, openai: bool):
        srv = self.server
        try:
            parsed = srv._parse_openai(body) if openai else srv._parse_generate(body)
        except BadRequest as e:
            raise ClientError(400, str(e), e.param) from None
        rid = None if openai else parsed[3]
        try:
            req, q = await srv._submit(parsed[0], parsed[1], rid)
        except QueueFull as e:
            raise ClientError(503, str(e), None, "server_overloaded") from None
        except DuplicateRequest as e:
            raise ClientError(400, str(e), "rid") from None
        except EngineStopped as e:
            raise ClientError(503, str(e), None, "engine_error") from None
        return parsed, req, q

    async def _full(self, body: dict, openai: bool) -> dict:
        parsed, req, q = await self._start(body, openai)
        finished = False
        try:
            while not finished:
                _, finished, _ = await q.get()
        finally:
            if not finished:
                self.server.engine.abort(req)
        if _failed(req):
            raise ClientError(
                500, req.finish_reason.get("message") or "request failed", None, "engine_error"
            )
        fmt = self.server._openai_full if openai else self.server._generate_full
        return fmt(req, parsed)

    async def _stream(self, body: dict, openai: bool) -> AsyncIterator[dict]:
        parsed, req, q = await self._start(body, openai)
        stream = self.server._openai_stream if openai else self.server._generate_stream
        write_chunk = stream(req, parsed)
        finished = False
        try:
            while not finished:
                new_ids, finished, n = await q.get()
                if finished and _failed(req):
                    raise ClientError(
                        500,
                        req.finish_reason.get("message") or "request failed",
                        None,
                        "engine_error",
                    )
                yield json.loads(write_chunk(new_ids, finished, n)[len(b"data: ") :])
        finally:
            if not finished:  # the caller stopped iterating: abort, as a disconnect would
                self.server.engine.abort(req)

    async def generate(self, body: dict) -> dict:
        """POST /generate without streaming."""
        return await self._full(body, openai=False)

    def generate_stream(self, body: dict) -> AsyncIterator[dict]:
        """POST /generate with streaming: the chunks as dicts."""
        return self._stream(body, openai=False)

    async def completions(self, body: dict) -> dict:
        """POST /v1/completions without streaming."""
        return await self._full(body, openai=True)

    def completions_stream(self, body: dict) -> AsyncIterator[dict]:
        return self._stream(body, openai=True)

    async def metrics(self) -> dict[str, float]:
        return dict(self.engine.metrics())
