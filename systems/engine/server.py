"""HTTP server of the bundled engine (aiohttp).

Endpoints, all bound to 127.0.0.1 unless ``--host`` says otherwise:
- ``POST /generate``       SGLang native format, streamed (SSE) or not
- ``POST /v1/completions`` OpenAI completions, streamed (SSE) or not, with ``usage``
- ``GET /metrics``         Prometheus text
- ``GET /health``          200 while the engine thread is alive
- ``GET /v1/models``

Every client error is a 400 with ``{"error": {"message", "type", "param"}}`` naming the field; a
full waiting queue is a 503 with Retry-After; a client that disconnects mid-stream aborts its
request, which frees its memory. A request the engine fails (an isolated fault in its handoff or
decode step) is a 500 with the error's message, or, once a stream has started, a final
``data: {"error": {...}}`` event before ``[DONE]``. No request field reaches config loading or
the filesystem: bodies are parsed into plain values and checked against fixed field sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from systems.engine.engine import DuplicateRequest, Engine, EngineStopped
from systems.engine.request import Request, SamplingParams
from systems.engine.scheduler import QueueFull
from systems.engine.tokenizer import WordTokenizer

log = logging.getLogger("dhs.server")

MAX_BODY_BYTES = 16 << 20
# Fields SGLang clients (bench_serving) send that do not change our output; accepted, ignored.
_GENERATE_IGNORED = {"return_logprob", "logprob_start_len", "top_logprobs_num", "lora_path",
                     "return_text_in_logprobs", "modalities", "image_data", "custom_logit_processor",
                     "return_routed_experts"}
_GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "stream", "rid"} | _GENERATE_IGNORED
_SAMPLING_FIELDS = {"max_new_tokens", "temperature", "ignore_eos", "top_p", "top_k", "min_p",
                    "stop", "skip_special_tokens", "n", "spaces_between_special_tokens",
                    "no_stop_trim", "stop_token_ids"}
_OPENAI_FIELDS = {"model", "prompt", "max_tokens", "temperature", "stream", "ignore_eos",
                  "stream_options", "n", "top_p", "top_k", "logprobs", "echo", "stop", "user",
                  "seed", "best_of", "presence_penalty", "frequency_penalty"}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _error(status: int, message: str, param: str | None = None,
           etype: str = "invalid_request_error", headers: dict | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": etype, "param": param}},
                             status=status, headers=headers)


def _failed(req: Request) -> bool:
    return bool(req.finish_reason) and req.finish_reason.get("type") == "error"


def _error_event(req: Request) -> bytes:
    """The last SSE event of a request the engine failed (both APIs' clients read "error")."""
    fr = req.finish_reason
    out = {"id": req.rid,
           "error": {"message": fr.get("message") or "request failed", "type": "engine_error",
                     "param": None},
           "meta_info": {"id": req.rid, "prompt_tokens": req.num_prompt_tokens,
                         "completion_tokens": len(req.output_ids), "finish_reason": fr}}
    return b"data: " + json.dumps(out).encode() + b"\n\n"


class Server:
    def __init__(self, engine: Engine, model_name: str = "dhs-bundled"):
        self.engine = engine
        self.model_name = model_name
        mcfg = engine.cfg.model
        self.tok = WordTokenizer(mcfg.vocab_size)
        self.max_total = engine.backend.max_total_tokens
        self.started = time.time()

    # ------------------------------------------------------------------ validation
    async def _json(self, request: web.Request) -> dict:
        try:
            raw = await request.read()  # over MAX_BODY_BYTES (after any Content-Encoding): 413
        except web.RequestPayloadError as e:  # e.g. a body that does not match its encoding
            cause = e.__cause__ or e
            msg = getattr(cause, "message", None) or str(cause)
            raise BadRequest(f"request body could not be read: {msg}".strip(), "body") from None
        try:
            # JSON between systems is UTF-8 (RFC 8259): a charset parameter is not honoured, so
            # an unknown or hostile one cannot change how the body is read
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise BadRequest("body is not UTF-8 JSON", "body") from None
        except json.JSONDecodeError as e:
            raise BadRequest(f"malformed JSON body: {e.msg} at position {e.pos}", "body") from None
        except RecursionError:
            raise BadRequest("malformed JSON body: nested too deeply", "body") from None
        except ValueError as e:  # e.g. an integer literal longer than Python converts
            raise BadRequest(f"malformed JSON body: {e}", "body") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object", "body")
        return body

    @staticmethod
    def _check_fields(body: dict, allowed: set[str], where: str) -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise BadRequest(f"unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}",
                             unknown[0] or '""')

    def _too_long(self, field: str) -> BadRequest:
        return BadRequest(f"{field} has more than {self.max_total} tokens, the context of this "
                          "server", field)

    def _prompt_ids(self, value: Any, field: str) -> list[int]:
        # the context bounds the prompt before any per-token work is done on it
        if isinstance(value, str):
            if len(value.split(None, self.max_total)) > self.max_total:
                raise self._too_long(field)
            try:
                ids = self.tok.encode(value)
            except UnicodeEncodeError:
                raise BadRequest(f"{field} is not valid Unicode (lone surrogate)", field) from None
        elif isinstance(value, list) and len(value) > self.max_total:
            raise self._too_long(field)
        elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                             for t in value):
            ids = value
            V = self.engine.cfg.model.vocab_size
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise BadRequest(f"{field}: token id {bad[0]} outside [0, {V})", field)
        else:
            raise BadRequest(f"{field} must be a string or a list of integer token ids", field)
        if not ids:
            raise BadRequest(f"{field} is empty", field)
        return ids

    def _check_lengths(self, ids: list[int], max_new: Any, field: str, mfield: str) -> int:
        if not isinstance(max_new, int) or isinstance(max_new, bool):
            raise BadRequest(f"{mfield} must be an integer", mfield)
        cap = self.engine.cfg.max_new_tokens_cap
        if not 1 <= max_new <= cap:
            raise BadRequest(f"{mfield}={max_new} outside [1, {cap}]", mfield)
        if len(ids) + max_new > self.max_total:
            raise BadRequest(f"{field} has {len(ids)} tokens; with {mfield}={max_new} it exceeds "
                             f"the context of {self.max_total} tokens", field)
        return max_new

    @staticmethod
    def _temperature(v: Any, field: str) -> float:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 100:
            raise BadRequest(f"{field} must be a number in [0, 100]", field)
        return float(v)

    @staticmethod
    def _bool(v: Any, field: str) -> bool:
        if not isinstance(v, bool):
            raise BadRequest(f"{field} must be a boolean", field)
        return v

    def _parse_generate(self, body: dict) -> tuple[list[int], SamplingParams, bool, str | None]:
        self._check_fields(body, _GENERATE_FIELDS, "the request")
        if ("text" in body) == ("input_ids" in body):
            raise BadRequest("exactly one of text / input_ids is required", "text")
        field = "text" if "text" in body else "input_ids"
        ids = self._prompt_ids(body[field], field)
        sp = body.get("sampling_params", {}) or {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object", "sampling_params")
        self._check_fields(sp, _SAMPLING_FIELDS, "sampling_params")
        if sp.get("n", 1) != 1:
            raise BadRequest("sampling_params.n must be 1", "sampling_params.n")
        max_new = self._check_lengths(ids, sp.get("max_new_tokens", 128), field,
                                      "sampling_params.max_new_tokens")
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=self._temperature(sp.get("temperature", 1.0),
                                          "sampling_params.temperature"),
            ignore_eos=self._bool(sp.get("ignore_eos", False), "sampling_params.ignore_eos"))
        stream = self._bool(body.get("stream", False), "stream")
        rid = body.get("rid")
        if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= 128):
            raise BadRequest("rid must be a non-empty string of at most 128 characters", "rid")
        return ids, params, stream, rid

    def _parse_openai(self, body: dict) -> tuple[list[int], SamplingParams, bool, bool]:
        self._check_fields(body, _OPENAI_FIELDS, "the request")
        if "prompt" not in body:
            raise BadRequest("prompt is required", "prompt")
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        ids = self._prompt_ids(prompt, "prompt")
        for f, ok in (("n", 1), ("best_of", 1)):
            if body.get(f, ok) not in (ok, None):
                raise BadRequest(f"{f} must be 1", f)
        if body.get("echo"):
            raise BadRequest("echo is not supported", "echo")
        if body.get("logprobs") not in (None, 0, False):
            raise BadRequest("logprobs is not supported", "logprobs")
        max_new = self._check_lengths(ids, body.get("max_tokens", 16), "prompt", "max_tokens")
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=self._temperature(body.get("temperature", 1.0), "temperature"),
            ignore_eos=self._bool(body.get("ignore_eos", False), "ignore_eos"))
        stream = self._bool(body.get("stream", False), "stream")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict):
            raise BadRequest("stream_options must be an object", "stream_options")
        return ids, params, stream, bool(so.get("include_usage", True))

    # ------------------------------------------------------------------ engine bridge
    def _submit(self, ids: list[int], params: SamplingParams, rid: str | None):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def on_output(req, new_ids, done):  # engine thread
            if loop.is_closed():  # server shutting down under a running batch: nobody is listening
                return
            loop.call_soon_threadsafe(q.put_nowait, (list(new_ids), done))

        req = Request(rid or self.engine.new_rid(), ids, params, on_output=on_output)
        self.engine.submit(req)
        return req, q

    async def _run(self, request: web.Request, parse, respond_stream, respond_full):
        try:
            body = await self._json(request)
            parsed = parse(body)
        except BadRequest as e:
            return _error(400, str(e), e.param)
        ids, params, stream = parsed[0], parsed[1], parsed[2]
        try:
            req, q = self._submit(ids, params, parsed[3] if parse == self._parse_generate else None)
        except QueueFull as e:
            return _error(503, str(e), None, "server_overloaded", {"Retry-After": "1"})
        except DuplicateRequest as e:
            return _error(400, str(e), "rid")
        except EngineStopped as e:
            return _error(503, str(e), None, "engine_error")
        finished = False
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
                try:
                    await resp.prepare(request)
                    while not finished:
                        new_ids, finished = await q.get()
                        if finished and _failed(req):
                            await resp.write(_error_event(req))
                        else:
                            await resp.write(respond_stream(req, new_ids, finished, parsed))
                    await resp.write(b"data: [DONE]\n\n")
                    await resp.write_eof()
                except ConnectionResetError:  # the client left: abort below, nothing to log
                    pass
                return resp
            while not finished:
                _, finished = await q.get()
            if _failed(req):
                return _error(500, req.finish_reason.get("message") or "request failed", None,
                              "engine_error")
            return web.json_response(respond_full(req, parsed))
        finally:
            if not finished:  # client went away (or we were cancelled): free its memory now
                self.engine.abort(req.rid)

    # ------------------------------------------------------------------ /generate
    def _meta(self, req: Request, finished: bool) -> dict:
        meta = {"id": req.rid, "prompt_tokens": req.num_prompt_tokens,
                "completion_tokens": len(req.output_ids),
                "finish_reason": req.finish_reason if finished else None}
        if finished:
            meta["timing"] = req.timing()
        return meta

    def _generate_chunk(self, req, new_ids, finished, parsed) -> bytes:
        out = {"text": self.tok.decode(req.output_ids), "output_ids": new_ids,
               "meta_info": self._meta(req, finished)}
        return b"data: " + json.dumps(out).encode() + b"\n\n"

    def _generate_full(self, req, parsed) -> dict:
        return {"text": self.tok.decode(req.output_ids), "output_ids": req.output_ids,
                "meta_info": self._meta(req, True)}

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._run(request, self._parse_generate, self._generate_chunk,
                               self._generate_full)

    # ------------------------------------------------------------------ /v1/completions
    def _usage(self, req: Request) -> dict:
        n = len(req.output_ids)
        return {"prompt_tokens": req.num_prompt_tokens, "completion_tokens": n,
                "total_tokens": req.num_prompt_tokens + n}

    @staticmethod
    def _finish(req: Request) -> str | None:
        fr = req.finish_reason
        if not fr:
            return None
        return {"length": "length", "stop": "stop"}.get(fr["type"], fr["type"])

    def _openai_chunk(self, req, new_ids, finished, parsed) -> bytes:
        include_usage = parsed[3]
        out = {"id": req.rid, "object": "text_completion", "created": int(req.arrival_ts),
               "model": self.model_name,
               "choices": [{"index": 0, "text": self.tok.decode(new_ids),
                            "num_tokens": len(new_ids),
                            "finish_reason": self._finish(req) if finished else None}],
               "usage": None}
        if finished and include_usage:
            out["usage"] = self._usage(req)
            out["timing"] = req.timing()
        return b"data: " + json.dumps(out).encode() + b"\n\n"

    def _openai_full(self, req, parsed) -> dict:
        return {"id": req.rid, "object": "text_completion", "created": int(req.arrival_ts),
                "model": self.model_name,
                "choices": [{"index": 0, "text": self.tok.decode(req.output_ids),
                             "finish_reason": self._finish(req), "logprobs": None}],
                "usage": self._usage(req), "timing": req.timing()}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._run(request, self._parse_openai, self._openai_chunk,
                               self._openai_full)

    # ------------------------------------------------------------------ observability
    async def metrics(self, request: web.Request) -> web.Response:
        lines = []
        for name, value in self.engine.metrics().items():
            base = name.split("{", 1)[0]
            kind = "counter" if base.endswith("_total") else "gauge"
            lines.append(f"# TYPE {base} {kind}")
            lines.append(f"{name} {float(value):.6g}")
        return web.Response(text="\n".join(lines) + "\n",
                            content_type="text/plain", charset="utf-8")

    async def health(self, request: web.Request) -> web.Response:
        t = self.engine._thread
        if self.engine.error is not None or (t is not None and not t.is_alive()):
            return _error(503, f"engine stopped: {self.engine.error!r}", None, "engine_error")
        return web.json_response({"status": "ok", "uptime_s": time.time() - self.started})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "dhs"}]})


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body exceeds {MAX_BODY_BYTES} bytes", "body")
    except web.HTTPException as e:
        if e.status >= 400:
            return _error(e.status, e.reason or "error", None)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away; there is no one to answer
    except Exception as e:  # a bug: answer JSON with the message instead of a bare 500
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}", None, "internal_error")


def build_app(engine: Engine, model_name: str = "dhs-bundled") -> web.Application:
    srv = Server(engine, model_name)
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app.router.add_post("/generate", srv.generate)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_get("/metrics", srv.metrics)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/v1/models", srv.models)
    return app


def main(argv: list[str] | None = None) -> None:
    from systems.engine.config import compose_engine_config

    ap = argparse.ArgumentParser(description="Serve the bundled engine over HTTP.")
    ap.add_argument("--host", default="127.0.0.1",
                    help="bind address (default 127.0.0.1; use 0.0.0.0 only on trusted networks)")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--config", help="a resolved config YAML written by the runner")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. system=hisparse model=tiny")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ecfg = compose_engine_config(args.overrides, config_path=args.config)
    engine = Engine(ecfg)
    engine.start()
    log.info("engine up: backend=%s model=%s device=%s; start-up %s", ecfg.kv.backend,
             ecfg.model.name, ecfg.device,
             ", ".join(f"{k} {v:.1f} s" for k, v in engine.startup_s.items()))
    try:
        web.run_app(build_app(engine), host=args.host, port=args.port, print=None,
                    access_log=None)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
