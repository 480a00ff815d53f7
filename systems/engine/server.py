"""HTTP server of the bundled engine (aiohttp).

Endpoints, all bound to 127.0.0.1 unless ``--host`` says otherwise:
- ``POST /generate``       SGLang native format, streamed (SSE) or not
- ``POST /v1/completions`` OpenAI completions, streamed (SSE) or not, with ``usage``
- ``GET /metrics``         Prometheus text
- ``GET /health``          200 while the engine serves (its thread, or its process)
- ``GET /v1/models``

Every client error is a 4xx with ``{"error": {"message", "type", "param"}}``; a 400 names the
field. Every request field is checked and either applied or refused (400 saying it is
unsupported), never silently ignored. A full waiting queue is a 503 with Retry-After; a client
that disconnects (streaming or not, queued or running) aborts its request, which frees its queue
slot and memory. A request the engine fails (an isolated fault in its handoff or decode step) is
a 500 with the error's message, or, once a stream has started, a final ``data: {"error": {...}}``
event before ``[DONE]``. No request field reaches config loading or the filesystem: bodies are
parsed into plain values and checked against fixed field sets.

Slow and idle clients are bounded (``ServerConfig``): complete headers within
``header_timeout_s`` of connecting or of the previous response (also the keep-alive idle
timeout), the body within ``body_timeout_s`` (408), every write within ``write_timeout_s`` (the
connection is dropped and its request aborted); at most ``max_connections`` connections, past it
a 503 and close. Local-only by default: POST bodies must be ``application/json`` (415), and while
bound to a loopback address the Host header must name one (403), against DNS rebinding and
cross-site form posts. Serve the app with ``start_server`` / ``serve_forever``: they carry the
timeouts, the cap and the disconnect handling that a plain ``web.AppRunner`` lacks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import json
import logging
import math
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from systems.engine.body_parser import BodyError, BodyParser, TokenIds
from systems.engine.engine import DuplicateRequest, Engine, EngineStopped
from systems.engine.engine_client import EngineClient, LocalEngineClient
from systems.engine.request import Request, SamplingParams
from systems.engine.scheduler import QueueFull
from systems.engine.tokenizer import WordTokenizer
from systems.event_loops import loop_factory, loop_name
from systems.pids import die_with_parent

log = logging.getLogger("dhs.server")

# Counters whose names predate the ``_total`` convention (results read them by these names):
# typed as counters on /metrics all the same.
COUNTERS_NOT_TOTAL = frozenset({"dhs_num_steps"})

MAX_BODY_BYTES = 16 << 20
# the event loop this process's server runs on ("uvloop" | "asyncio"; None before one serves):
# profiling/host.py records it beside the event loop's samples
SERVING_LOOP: str | None = None
LINGER_S = 1.0


@dataclass
class ServerConfig:
    """The server's own limits (``server.*`` in conf/server/default.yaml)."""

    host: str = "127.0.0.1"  # the bind address; a loopback one turns the Host check on
    header_timeout_s: float = 30.0  # connect (or previous response) -> complete headers
    body_timeout_s: float = 30.0  # headers -> complete body
    write_timeout_s: float = 60.0  # longest a single write may wait on a client not reading
    max_connections: int = 1024  # open connections; past it a 503 and close
    # Host header names accepted; None: loopback names when bound to loopback, any otherwise
    allowed_hosts: list[str] | None = None
    # Python's thread switch interval (sys.setswitchinterval), ms, in the server's process and
    # the engine's; None keeps Python's 5 ms. A thread that released the GIL (the engine in a
    # CUDA sync) may wait up to this long to get it back from a thread running Python. Set by
    # `python -m systems.engine.server` (subprocess mode) only.
    gil_switch_interval_ms: float | None = None
    # processes that parse large request bodies (systems/engine/body_parser.py): a 125K-token
    # body's parse would hold the engine thread's GIL ~13 ms; 0 parses every body in-process
    parse_workers: int = 2
    # the event loop of `python -m systems.engine.server` (systems/event_loops.py): "auto" is
    # uvloop where installed. asyncio's socket writes release the GIL, one per stream and step,
    # and each hand-over can leave the writer waiting on the engine thread (or the engine on
    # it) for up to the switch interval; uvloop writes without releasing it
    event_loop: str = "auto"
    # `python -m systems.engine.server` runs the engine in a process of its own
    # (systems/engine/engine_process.py), off this process's GIL; false: a thread beside the
    # event loop, as build_app(engine) always does
    engine_process: bool = True

    def __post_init__(self) -> None:
        ms = self.gil_switch_interval_ms
        if ms is not None and not (isinstance(ms, (int, float)) and 0 < ms <= 1000):
            raise ValueError(f"server.gil_switch_interval_ms must be in (0, 1000], got {ms!r}")
        BodyParser(self.parse_workers)  # the same check as the server's: fail at config time
        loop_factory(self.event_loop)  # unknown name, or uvloop asked for and missing

    @classmethod
    def from_cfg(cls, server: Any, host: str | None = None) -> ServerConfig:
        """From a composed config's ``server`` section (keys this class does not have, such as
        ``mode`` or ``port``, belong to the harness)."""
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k: server[k] for k in (server or {}) if k in names}
        if data.get("allowed_hosts") is not None:
            data["allowed_hosts"] = [str(h) for h in data["allowed_hosts"]]
        if host is not None:
            data["host"] = host
        return cls(**data)


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host of a Host header, without its port: ``[::1]:80`` -> ``::1``."""
    h = header.strip()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


# Fields SGLang clients (bench_serving) send. Each is validated; the ones that would change the
# answer in a way this engine cannot (logprobs, LoRA, images, ...) are refused unless neutral.
_GENERATE_FIELDS = {
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "lora_path",
    "return_text_in_logprobs",
    "modalities",
    "image_data",
    "custom_logit_processor",
    "return_routed_experts",
}
_SAMPLING_FIELDS = {
    "max_new_tokens",
    "temperature",
    "ignore_eos",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "skip_special_tokens",
    "n",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stop_token_ids",
}
_OPENAI_FIELDS = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "stream",
    "ignore_eos",
    "stream_options",
    "n",
    "top_p",
    "top_k",
    "logprobs",
    "echo",
    "stop",
    "user",
    "seed",
    "best_of",
    "presence_penalty",
    "frequency_penalty",
}
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 256


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class BodyTimeout(Exception):
    """The body did not arrive within body_timeout_s (408, connection closed)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any, field: str, lo: int | None, hi: int | None) -> int:
    if not _is_int(v):
        raise BadRequest(f"{field} must be an integer", field)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(
            f"{field}={v} outside [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]",
            field,
        )
    return v


def _number(v: Any, field: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if (
        not isinstance(v, (int, float))
        or isinstance(v, bool)
        or (isinstance(v, float) and not math.isfinite(v))
        or not (lo < v if lo_open else lo <= v)
        or not v <= hi
    ):  # ints compare exactly
        raise BadRequest(
            f"{field} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]", field
        )
    return float(v)


def _bool(v: Any, field: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{field} must be a boolean", field)
    return v


def _error(
    status: int,
    message: str,
    param: str | None = None,
    etype: str = "invalid_request_error",
    headers: dict | None = None,
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": etype, "param": param}},
        status=status,
        headers=headers,
    )


def _failed(req: Request) -> bool:
    return bool(req.finish_reason) and req.finish_reason.get("type") == "error"


def _error_event(req: Request) -> bytes:
    """The last SSE event of a request the engine failed (both APIs' clients read "error")."""
    fr = req.finish_reason
    out = {
        "id": req.rid,
        "error": {
            "message": fr.get("message") or "request failed",
            "type": "engine_error",
            "param": None,
        },
        "meta_info": {
            "id": req.rid,
            "prompt_tokens": req.num_prompt_tokens,
            "completion_tokens": len(req.output_ids),
            "finish_reason": fr,
        },
    }
    return b"data: " + json.dumps(out).encode() + b"\n\n"


class _StopStrings:
    """The engine's stop matcher for stop strings: called after every new output token, returns
    the stop string the output text now contains. The word tokenizer decodes every token to at
    least 3 characters (`` w0``), so the last ``len // 3 + 2`` tokens hold any occurrence that
    ends in the newest one (earlier ones were seen at their own token)."""

    def __init__(self, tok: WordTokenizer, stops: list[str]):
        self.tok = tok
        self.stops = stops
        self.tail = max(len(x) for x in stops) // 3 + 2

    def __call__(self, output_ids: list[int]) -> str | None:
        text = self.tok.decode(output_ids[-self.tail :])
        for x in self.stops:
            if x in text:
                return x
        return None


class Server:
    def __init__(
        self,
        engine: Engine | EngineClient,
        model_name: str = "dhs-bundled",
        parse_workers: int = 0,
    ):
        # an Engine is one whose thread runs in this process; an engine in a process of its own
        # comes as its client (systems/engine/engine_process.py)
        self.engine = LocalEngineClient(engine) if isinstance(engine, Engine) else engine
        self.parser = BodyParser(parse_workers)
        self.model_name = model_name
        self.tok = WordTokenizer(self.engine.vocab_size)
        self.vocab_size = self.engine.vocab_size
        self.max_total = self.engine.max_total_tokens
        self.started = time.time()

    # ------------------------------------------------------------------ validation
    async def _json(self, request: web.Request, timeout_s: float) -> dict:
        try:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()  # over MAX_BODY_BYTES (after Content-Encoding): 413
        except TimeoutError:
            raise BodyTimeout(f"request body not received within {timeout_s:g} s") from None
        except web.RequestPayloadError as e:  # e.g. a body that does not match its encoding
            cause = e.__cause__ or e
            msg = getattr(cause, "message", None) or str(cause)
            raise BadRequest(f"request body could not be read: {msg}".strip(), "body") from None
        try:
            return await self.parser.parse(raw)
        except BodyError as e:
            raise BadRequest(str(e), "body") from None

    @staticmethod
    def _check_fields(body: dict, allowed: set[str], where: str, prefix: str = "") -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise BadRequest(
                f"unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}",
                prefix + (unknown[0] or '""'),
            )

    def _too_long(self, field: str) -> BadRequest:
        return BadRequest(
            f"{field} has more than {self.max_total} tokens, the context of this server", field
        )

    def _prompt_ids(self, value: Any, field: str, text_ok: bool = True) -> Sequence[int]:
        # the context bounds the prompt before any per-token work is done on it
        if isinstance(value, TokenIds):
            # packed by the body parser (ints, range known): no per-token work on this thread
            if value.n > self.max_total:
                raise self._too_long(field)
            ids = value.to_array()
            self._check_vocab(ids, value.lo, value.hi, field)
        elif isinstance(value, str) and text_ok:
            if len(value.split(None, self.max_total)) > self.max_total:
                raise self._too_long(field)
            try:
                ids = self.tok.encode(value)
            except UnicodeEncodeError:
                raise BadRequest(f"{field} is not valid Unicode (lone surrogate)", field) from None
        elif isinstance(value, list) and len(value) > self.max_total:
            raise self._too_long(field)
        elif isinstance(value, list) and set(map(type, value)) <= {int}:
            # C-level passes over the ids (type set, min, max): a 125,000-token prompt's checks
            # hold the GIL ~5 ms instead of ~12 ms per-item in Python, time the engine thread
            # waits for (bool, an int subclass, is its own type here and so refused)
            ids = value
            if ids:
                self._check_vocab(ids, min(ids), max(ids), field)
        elif text_ok:
            raise BadRequest(f"{field} must be a string or a list of integer token ids", field)
        else:
            raise BadRequest(f"{field} must be a list of integer token ids", field)
        if not ids:
            raise BadRequest(f"{field} is empty", field)
        return ids

    def _check_vocab(self, ids: Sequence[int], lo: int, hi: int, field: str) -> None:
        """A 400 naming the first id outside the vocabulary, where ``lo`` / ``hi`` (the ids'
        range) say there is one."""
        V = self.vocab_size
        if lo < 0 or hi >= V:
            bad = next(t for t in ids if not 0 <= t < V)
            raise BadRequest(f"{field}: token id {bad} outside [0, {V})", field)

    def _check_lengths(self, ids: list[int], max_new: Any, field: str, mfield: str) -> int:
        cap = self.engine.max_new_tokens_cap
        max_new = _int(max_new, mfield, 1, cap)
        if len(ids) + max_new > self.max_total:
            raise BadRequest(
                f"{field} has {len(ids)} tokens; with {mfield}={max_new} it exceeds "
                f"the context of {self.max_total} tokens",
                field,
            )
        return max_new

    def _sampling(
        self,
        get,
        prefix: str,
        temperature_default: float,
        ignore_eos_default: bool,
        ids: list[int],
        field: str,
        mfield: str,
        max_new_default: int,
        max_stops: int,
    ) -> SamplingParams:
        """The sampling fields both APIs share, read with ``get(name, default)``; ``prefix``
        names them in errors (``sampling_params.`` for /generate)."""
        max_new = self._check_lengths(
            ids, get(mfield.removeprefix(prefix), max_new_default), field, mfield
        )
        temperature = _number(
            get("temperature", temperature_default), prefix + "temperature", 0, 100
        )
        top_p = _number(get("top_p", 1.0), prefix + "top_p", 0, 1, lo_open=True)
        top_k = _int(get("top_k", -1), prefix + "top_k", -1, None)
        if top_k == 0:
            raise BadRequest(f"{prefix}top_k must be -1 (all tokens) or >= 1", prefix + "top_k")
        min_p = _number(get("min_p", 0.0), prefix + "min_p", 0, 1)
        # the sampler draws from the whole distribution: a filter that would change a draw is
        # refused; greedy decoding (temperature 0) is the same under every filter
        if temperature > 0:
            for name, neutral in (
                ("top_p", top_p == 1),
                ("min_p", min_p == 0),
                ("top_k", top_k == -1 or top_k >= self.vocab_size),
            ):
                if not neutral:
                    raise BadRequest(
                        f"{prefix}{name} is not supported with temperature > 0 "
                        "(the sampler draws from the full distribution); use its "
                        "neutral value or temperature 0",
                        prefix + name,
                    )
        stops = get("stop", None)
        if stops is not None:
            stops = [stops] if isinstance(stops, str) else stops
            if (
                not isinstance(stops, list)
                or not all(isinstance(x, str) for x in stops)
                or len(stops) > max_stops
                or not all(0 < len(x) <= MAX_STOP_CHARS for x in stops)
            ):
                raise BadRequest(
                    f"{prefix}stop must be a string or a list of at most "
                    f"{max_stops} strings, each of 1 to {MAX_STOP_CHARS} characters",
                    prefix + "stop",
                )
            if any("\ud800" <= c <= "\udfff" for x in stops for c in x):
                raise BadRequest(
                    f"{prefix}stop is not valid Unicode (lone surrogate)", prefix + "stop"
                )
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            ignore_eos=_bool(get("ignore_eos", ignore_eos_default), prefix + "ignore_eos"),
            stop=_StopStrings(self.tok, stops) if stops else None,
        )

    def _parse_generate(self, body: dict) -> tuple:
        self._check_fields(body, _GENERATE_FIELDS, "the request")
        if ("text" in body) == ("input_ids" in body):
            raise BadRequest("exactly one of text / input_ids is required", "text")
        field = "text" if "text" in body else "input_ids"
        ids = self._prompt_ids(body[field], field, text_ok=field == "text")
        sp = body.get("sampling_params", {})
        if sp is None:
            sp = {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object", "sampling_params")
        self._check_fields(sp, _SAMPLING_FIELDS, "sampling_params")
        P = "sampling_params."
        if _int(sp.get("n", 1), P + "n", None, None) != 1:
            raise BadRequest("sampling_params.n must be 1", P + "n")
        params = self._sampling(
            sp.get, P, 1.0, False, ids, field, P + "max_new_tokens", 128, MAX_STOP_STRINGS
        )
        stop_ids = sp.get("stop_token_ids")
        if stop_ids is not None:
            if (
                not isinstance(stop_ids, list)
                or len(stop_ids) > MAX_STOP_TOKEN_IDS
                or not all(_is_int(t) and 0 <= t < self.vocab_size for t in stop_ids)
            ):
                raise BadRequest(
                    f"sampling_params.stop_token_ids must be a list of at most "
                    f"{MAX_STOP_TOKEN_IDS} token ids in [0, {self.vocab_size})",
                    P + "stop_token_ids",
                )
            params.stop_token_ids = frozenset(stop_ids)
        # the word tokenizer has no special-token text: these two cannot change the output
        for f in ("skip_special_tokens", "spaces_between_special_tokens"):
            _bool(sp.get(f, True), P + f)
        no_stop_trim = _bool(sp.get("no_stop_trim", False), P + "no_stop_trim")
        stream = _bool(body.get("stream", False), "stream")
        rid = body.get("rid")
        if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= 128):
            raise BadRequest("rid must be a non-empty string of at most 128 characters", "rid")
        # SGLang request fields this engine cannot honour: accepted only at their neutral value
        if _bool(body.get("return_logprob", False), "return_logprob"):
            raise BadRequest("return_logprob is not supported", "return_logprob")
        _int(body.get("logprob_start_len", -1), "logprob_start_len", -1, None)
        _int(body.get("top_logprobs_num", 0), "top_logprobs_num", 0, None)
        _bool(body.get("return_text_in_logprobs", False), "return_text_in_logprobs")
        if _bool(body.get("return_routed_experts", False), "return_routed_experts"):
            raise BadRequest("return_routed_experts is not supported", "return_routed_experts")
        for f in ("lora_path", "modalities", "image_data", "custom_logit_processor"):
            if body.get(f) not in (None, "", [], {}):
                raise BadRequest(f"{f} is not supported", f)
        return ids, params, stream, rid, no_stop_trim

    def _parse_openai(self, body: dict) -> tuple:
        self._check_fields(body, _OPENAI_FIELDS, "the request")
        if "prompt" not in body:
            raise BadRequest("prompt is required", "prompt")
        prompt = body["prompt"]
        if (
            isinstance(prompt, list)
            and len(prompt) == 1
            and isinstance(prompt[0], (str, list, TokenIds))
        ):
            prompt = prompt[0]  # a batch of one
        ids = self._prompt_ids(prompt, "prompt")
        for f in ("model", "user"):
            if body.get(f) is not None and not isinstance(body[f], str):
                raise BadRequest(f"{f} must be a string", f)
        for f in ("n", "best_of"):
            if body.get(f) is not None and _int(body[f], f, None, None) != 1:
                raise BadRequest(f"{f} must be 1", f)
        if _bool(body.get("echo", False), "echo"):
            raise BadRequest("echo is not supported", "echo")
        if body.get("logprobs") is not None and _int(body["logprobs"], "logprobs", 0, 5):
            raise BadRequest("logprobs is not supported", "logprobs")
        if body.get("seed") is not None:
            _int(body["seed"], "seed", None, None)
            raise BadRequest(
                "seed is not supported: sampling draws from the engine's shared "
                "generator, so a seed cannot make one request reproducible; use "
                "temperature 0 for reproducible output",
                "seed",
            )
        for f in ("presence_penalty", "frequency_penalty"):
            if body.get(f) is not None and _number(body[f], f, -2, 2) != 0:
                raise BadRequest(f"{f} is not supported (only 0)", f)
        params = self._sampling(body.get, "", 1.0, False, ids, "prompt", "max_tokens", 16, 4)
        stream = _bool(body.get("stream", False), "stream")
        so = body.get("stream_options")
        if so is None:
            so = {}
        if not isinstance(so, dict):
            raise BadRequest("stream_options must be an object", "stream_options")
        self._check_fields(so, {"include_usage"}, "stream_options", "stream_options.")
        include_usage = _bool(so.get("include_usage", True), "stream_options.include_usage")
        return ids, params, stream, include_usage, False

    # ------------------------------------------------------------------ engine bridge
    async def _submit(self, ids: list[int], params: SamplingParams, rid: str | None):
        req = Request(rid or self.engine.new_rid(), ids, params)
        return req, await self.engine.submit(req)

    async def _run(self, request: web.Request, parse, stream_writer, respond_full):
        cfg: ServerConfig = request.app[CONFIG]
        try:
            body = await self._json(request, cfg.body_timeout_s)
            parsed = parse(body)
        except BadRequest as e:
            return _error(400, str(e), e.param)
        except BodyTimeout as e:
            resp = _error(408, str(e), "body", "request_timeout")
            resp.force_close()
            return resp
        ids, params, stream = parsed[0], parsed[1], parsed[2]
        try:
            req, q = await self._submit(
                ids, params, parsed[3] if parse == self._parse_generate else None
            )
        except QueueFull as e:
            return _error(503, str(e), None, "server_overloaded", {"Retry-After": "1"})
        except DuplicateRequest as e:
            return _error(400, str(e), "rid")
        except EngineStopped as e:
            return _error(503, str(e), None, "engine_error")
        finished = False
        try:
            # A disconnect cancels this handler (the runner's handler_cancellation) wherever it
            # waits, queued or running, streaming or not: the finally below aborts the request.
            if stream:
                resp = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                write_chunk = stream_writer(req, parsed)
                try:
                    await _bounded_write(request, cfg, resp.prepare(request))
                    while not finished:
                        # every output queued by now goes out in one write: a stream the loop
                        # fell behind on catches up with one send, not one per step
                        parts = []
                        item = await q.get()
                        while True:
                            new_ids, finished, n = item
                            if finished and _failed(req):
                                parts.append(_error_event(req))
                            else:
                                parts.append(write_chunk(new_ids, finished, n))
                            if finished or q.empty():
                                break
                            item = q.get_nowait()
                        data = parts[0] if len(parts) == 1 else b"".join(parts)
                        await _write_chunk(request, cfg, resp, data)
                    await _bounded_write(request, cfg, resp.write(b"data: [DONE]\n\n"))
                    await _bounded_write(request, cfg, resp.write_eof())
                except ConnectionResetError:  # the client left: abort below, nothing to log
                    pass
                return resp
            while not finished:
                _, finished, _ = await q.get()
            if _failed(req):
                return _error(
                    500, req.finish_reason.get("message") or "request failed", None, "engine_error"
                )
            return web.json_response(respond_full(req, parsed))
        finally:
            if not finished:  # client went away (or we were cancelled): free its memory now
                self.engine.abort(req)

    def _text(self, req: Request, parsed) -> str:
        """The output text; a matched stop string and what follows it are cut unless
        ``no_stop_trim`` (SGLang; OpenAI never returns the stop sequence)."""
        text = self.tok.decode(req.output_ids)
        matched = (req.finish_reason or {}).get("matched")
        if isinstance(matched, str) and not parsed[4]:
            text = text[: text.find(matched)]
        return text

    # ------------------------------------------------------------------ /generate
    def _meta(self, req: Request, finished: bool, n: int | None = None) -> dict:
        meta = {
            "id": req.rid,
            "prompt_tokens": req.num_prompt_tokens,
            "completion_tokens": len(req.output_ids) if n is None else n,
            "finish_reason": req.finish_reason if finished else None,
        }
        if finished:
            meta["timing"] = req.timing()
        return meta

    def _generate_stream(self, req, parsed) -> Callable[[list[int], bool, int], bytes]:
        """The chunk writer of one /generate stream. Each chunk carries the whole text so far
        (SGLang's default), kept here JSON-escaped and extended by each chunk's tokens: decoding
        the whole output at every token costs O(n) per token (0.47 ms at 4,000 tokens, 15 ms a
        step for 32 streams) on the thread the engine shares the GIL with. The tokenizer decodes
        token by token and JSON escapes character by character, so the pieces concatenate to the
        whole's escaping (tests/engine/test_server.py compares the bytes)."""
        seen, escaped = 0, ""
        # a running chunk's meta_info, json.dumps(self._meta(...))'s bytes without a dict and an
        # encoder per chunk (this runs once per request and step on the event loop)
        meta_head = f'{{"id": {json.dumps(req.rid)}, "prompt_tokens": {req.num_prompt_tokens}, '

        def chunk(new_ids: list[int], finished: bool, n: int) -> bytes:
            nonlocal seen, escaped
            if finished:  # a matched stop string cuts the text: the whole output, once
                meta = json.dumps(self._meta(req, finished, n))
                text = json.dumps(self._text(req, parsed))
            else:
                meta = f'{meta_head}"completion_tokens": {n}, "finish_reason": null}}'
                escaped += json.dumps(self.tok.decode(req.output_ids[seen:n]))[1:-1]
                seen, text = n, f'"{escaped}"'
            ids = f"[{', '.join(map(str, new_ids))}]"
            return (
                f'data: {{"text": {text}, "output_ids": {ids}, "meta_info": {meta}}}\n\n'.encode()
            )

        return chunk

    def _generate_full(self, req, parsed) -> dict:
        return {
            "text": self._text(req, parsed),
            "output_ids": req.output_ids,
            "meta_info": self._meta(req, True),
        }

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._run(
            request, self._parse_generate, self._generate_stream, self._generate_full
        )

    # ------------------------------------------------------------------ /v1/completions
    def _usage(self, req: Request) -> dict:
        n = len(req.output_ids)
        return {
            "prompt_tokens": req.num_prompt_tokens,
            "completion_tokens": n,
            "total_tokens": req.num_prompt_tokens + n,
        }

    @staticmethod
    def _finish(req: Request) -> str | None:
        fr = req.finish_reason
        if not fr:
            return None
        return {"length": "length", "stop": "stop"}.get(fr["type"], fr["type"])

    def _openai_stream(self, req, parsed) -> Callable[[list[int], bool, int], bytes]:
        """The chunk writer of one /v1/completions stream: each chunk carries its own tokens'
        text (OpenAI's)."""
        return lambda new_ids, finished, n: self._openai_chunk(req, new_ids, finished, parsed)

    def _openai_chunk(self, req, new_ids, finished, parsed) -> bytes:
        include_usage = parsed[3]
        text = self.tok.decode(new_ids)
        if finished and isinstance(req.finish_reason.get("matched"), str):
            # the last chunk ends where the stop string starts; text already sent stays sent
            sent = len(self.tok.decode(req.output_ids[: len(req.output_ids) - len(new_ids)]))
            text = self._text(req, parsed)[sent:]
        out = {
            "id": req.rid,
            "object": "text_completion",
            "created": int(req.arrival_ts),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "num_tokens": len(new_ids),
                    "finish_reason": self._finish(req) if finished else None,
                }
            ],
            "usage": None,
        }
        if finished and include_usage:
            out["usage"] = self._usage(req)
            out["timing"] = req.timing()
        return b"data: " + json.dumps(out).encode() + b"\n\n"

    def _openai_full(self, req, parsed) -> dict:
        return {
            "id": req.rid,
            "object": "text_completion",
            "created": int(req.arrival_ts),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": self._text(req, parsed),
                    "finish_reason": self._finish(req),
                    "logprobs": None,
                }
            ],
            "usage": self._usage(req),
            "timing": req.timing(),
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._run(request, self._parse_openai, self._openai_stream, self._openai_full)

    # ------------------------------------------------------------------ observability
    async def metrics(self, request: web.Request) -> web.Response:
        # the text format wants one TYPE line per metric family, its samples right below it
        families: dict[str, list[str]] = {}
        try:
            metrics = await self.engine.metrics()  # no wait for the GPU
        except (EngineStopped, TimeoutError) as e:  # an engine process gone or not answering
            return _error(503, str(e) or "engine not answering", None, "engine_error")
        for where, n in self.parser.parsed.items():
            metrics[f'dhs_http_bodies_parsed_total{{where="{where}"}}'] = n
        # the event loop's own CPU seconds (this handler runs on it): how busy the server's side
        # is, apart from the engine (harness.results.server_loop_busy_share)
        metrics["dhs_server_loop_cpu_seconds_total"] = time.thread_time()
        for name, value in metrics.items():
            families.setdefault(name.split("{", 1)[0], []).append(f"{name} {_sample(value)}")
        lines = []
        for base, samples in families.items():
            kind = "counter" if base.endswith("_total") or base in COUNTERS_NOT_TOTAL else "gauge"
            lines.append(f"# TYPE {base} {kind}")
            lines.extend(samples)
        return web.Response(
            text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8"
        )

    async def health(self, request: web.Request) -> web.Response:
        stopped = await self.engine.stopped()
        if stopped is not None:
            return _error(503, stopped, None, "engine_error")
        return web.json_response({"status": "ok", "uptime_s": time.time() - self.started})

    async def models(self, request: web.Request) -> web.Response:
        # max_model_len as vLLM names it; the load generator reads it and vocab_size to fit its
        # random prompts to this server when it is not told their length and id range
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "owned_by": "dhs",
                        "max_model_len": self.max_total,
                        "vocab_size": self.vocab_size,
                        "max_new_tokens_cap": self.engine.max_new_tokens_cap,
                    }
                ],
            }
        )


def _sample(value: float) -> str:
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)  # exact: a counter past 1e6 keeps its last digits


def _refuse(status: int, message: str, param: str | None, etype: str) -> web.Response:
    """A refusal before the body is read: the connection closes instead of draining it."""
    resp = _error(status, message, param, etype)
    resp.force_close()
    return resp


def _precheck(request: web.Request) -> web.Response | None:
    """What is refused before a body is read: a Host that is not allowed, a declared body over
    the cap, a body that is not JSON. Also answers ``Expect: 100-continue`` (no 100 for them)."""
    cfg: ServerConfig = request.app[CONFIG]
    allowed = request.app[ALLOWED_HOSTS]
    if allowed is not None:
        host = _host_name(request.headers.get("Host", ""))
        if not (_is_loopback(host) if allowed == LOOPBACK else host.lower() in allowed):
            return _refuse(
                403,
                f"Host {host!r} is not allowed: the server is bound to "
                f"{cfg.host}; bind elsewhere (--host) or set server.allowed_hosts to "
                "serve other names",
                "Host",
                "forbidden_host",
            )
    if request.method == "POST":
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _refuse(
                413, f"request body exceeds {MAX_BODY_BYTES} bytes", "body", "invalid_request_error"
            )
        mime = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if mime != "application/json":
            # a browser may post text/plain or a form to any address without a CORS preflight
            return _refuse(
                415,
                f"Content-Type must be application/json, got {mime!r}",
                "Content-Type",
                "unsupported_media_type",
            )
    return None


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: refuse at once instead of inviting a body we would refuse."""
    refusal = _precheck(request)
    if refusal is not None:
        return refusal
    expect = request.headers.get("Expect", "").lower()
    if expect != "100-continue":
        return _refuse(417, f"unknown Expect: {expect!r}", "Expect", "invalid_request_error")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # as aiohttp's own handler: the 100 is not the response
    return None


async def _write_chunk(
    request: web.Request, cfg: ServerConfig, resp: web.StreamResponse, data: bytes
) -> None:
    """A stream's chunk. A write waits on the client only when the transport pauses it (its
    buffer past the high-water mark, until it drains to the low one): while buffer and chunk
    stay under the low mark the write cannot wait, and goes without the timeout's timer (one
    per request and step on the event loop)."""
    tr = request.transport
    if tr is not None and tr.get_write_buffer_size() + len(data) <= tr.get_write_buffer_limits()[0]:
        await resp.write(data)
        return
    await _bounded_write(request, cfg, resp.write(data))


async def _bounded_write(request: web.Request, cfg: ServerConfig, write) -> None:
    """One write (or prepare / write_eof) that may wait on the client at most write_timeout_s;
    past it the connection is dropped (ConnectionResetError), which aborts the request."""
    try:
        async with asyncio.timeout(cfg.write_timeout_s):
            await write
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError(f"client did not read for {cfg.write_timeout_s:g} s") from None


@web.middleware
async def _guard(request: web.Request, handler):
    """Outermost: refusals before the body, and the write timeout for whole responses."""
    refusal = _precheck(request)
    if refusal is not None:
        return refusal
    resp = await handler(request)
    if not resp.prepared:
        cfg: ServerConfig = request.app[CONFIG]
        await _bounded_write(request, cfg, resp.prepare(request))
        await _bounded_write(request, cfg, resp.write_eof())
    return resp


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body exceeds {MAX_BODY_BYTES} bytes", "body")
    except web.HTTPNotFound:  # name what is served, as an OpenAI-style client would want
        routes = sorted(
            {
                f"{r.method} {r.resource.canonical}"
                for r in request.app.router.routes()
                if r.method != "HEAD"  # aiohttp's twin of each GET
            }
        )
        return _error(
            404,
            f"no endpoint {request.method} {request.path}; this server answers "
            + ", ".join(routes),
            None,
        )
    except web.HTTPException as e:
        if e.status >= 400:
            return _error(e.status, e.reason or "error", None)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away; there is no one to answer
    except Exception as e:  # a bug: answer JSON with the message instead of a bare 500
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}", None, "internal_error")


CONFIG = web.AppKey("server_config", ServerConfig)
PARSER = web.AppKey("body_parser", BodyParser)  # its parser processes, for tests and tools
ALLOWED_HOSTS = web.AppKey("allowed_hosts", object)  # a set of names, LOOPBACK, or None: any
LOOPBACK = "loopback names and addresses"


def build_app(
    engine: Engine | EngineClient,
    model_name: str = "dhs-bundled",
    config: ServerConfig | None = None,
) -> web.Application:
    cfg = config or ServerConfig()
    srv = Server(engine, model_name, cfg.parse_workers)
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_guard, _errors])
    app[CONFIG] = cfg
    app[PARSER] = srv.parser
    if cfg.allowed_hosts is not None:
        app[ALLOWED_HOSTS] = {_host_name(h).lower() for h in cfg.allowed_hosts}
    else:  # bound to loopback: loopback names only; bound elsewhere on purpose: any name
        app[ALLOWED_HOSTS] = LOOPBACK if _is_loopback(cfg.host) else None
    app.router.add_post("/generate", srv.generate, expect_handler=_expect)
    app.router.add_post("/v1/completions", srv.completions, expect_handler=_expect)
    app.router.add_get("/metrics", srv.metrics)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/v1/models", srv.models)

    async def close_parser(app):
        await srv.parser.close()

    app.on_cleanup.append(close_parser)  # the parser processes start with the first large body
    return app


# ---------------------------------------------------------------------- serving
class _Refusal(asyncio.Protocol):
    """A connection over the cap: a 503 with Retry-After, then close. The client's request is
    read and dropped until it half-closes or for a second, so the close does not reset the
    connection before the client has read the answer."""

    def __init__(self, cap: int):
        body = json.dumps(
            {
                "error": {
                    "message": f"too many connections (server.max_connections={cap})",
                    "type": "server_overloaded",
                    "param": None,
                }
            }
        ).encode()
        self.response = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
            b"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        transport.write(self.response)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(1.0, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _CappedSite(web.TCPSite):
    """A TCP site whose protocol factory refuses connections past ``max_connections``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, cap: int):
        super().__init__(runner, host, port, backlog=1024)
        self.cap = cap

    async def start(self) -> None:
        await web.BaseSite.start(self)
        await self.listen()

    async def listen(self) -> None:
        """Open the listening socket (again, on the port it had: ``Serving``'s watch)."""
        server = self._runner.server

        def factory():
            if len(server.connections) >= self.cap:
                return _Refusal(self.cap)
            return server()

        port = getattr(self, "_bound_port", None) or self._port
        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, port, backlog=self._backlog, reuse_address=True
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


class _AcceptErrors:
    """Event-loop exception handler: out of file descriptors, every failed ``accept()`` is an
    error with a traceback (a flood of them filled a log by 142 MB in a minute). One line per
    ``interval_s`` with a count instead; every other error goes to the default handler."""

    RESOURCE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self.last = -math.inf
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if not (
            "accept" in str(context.get("message", ""))
            or (isinstance(exc, OSError) and exc.errno in self.RESOURCE)
        ):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.suppressed += 1
            return
        log.error(
            "%s: %r (%d more like it in the last %.0f s)",
            context.get("message"),
            exc,
            self.suppressed,
            now - self.last if self.suppressed else 0,
        )
        self.last = now
        self.suppressed = 0


def _fd_cap(cap: int) -> int:
    """The connection cap must leave file descriptors for the engine, logs and the listener:
    raise the soft limit if it is too low for the cap, else lower the cap."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = cap + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
        if soft < need:
            log.warning(
                "max_connections %d lowered to %d: file-descriptor limit %d",
                cap,
                max(1, soft - 256),
                soft,
            )
            return max(1, soft - 256)
    return cap


class Serving:
    """The app on a listening socket of the running loop, with its limits, and a watch that
    opens the socket again if the loop closed it: uvloop closes a listener for good on an
    accept error such as ENOBUFS or ENOMEM, with no log line (asyncio logs it and goes on)."""

    WATCH_S = 1.0  # how often the watch looks

    def __init__(self, runner: web.AppRunner, site: _CappedSite):
        self.runner = runner
        self.site = site
        self.relistens = 0
        self._watch = asyncio.get_running_loop().create_task(self._watch_listener())

    async def _watch_listener(self) -> None:
        while True:
            await asyncio.sleep(self.WATCH_S)
            srv = self.site._server
            if srv is None or srv.is_serving():
                continue
            log.error("the listening socket on port %d was closed: opening it again", self.port)
            try:
                await self.site.listen()
                self.relistens += 1
            except OSError as e:  # e.g. still out of file descriptors: try again next time
                log.error("could not listen again on port %d: %r", self.port, e)

    @property
    def port(self) -> int:
        return self.site.port

    async def close(self) -> None:
        self._watch.cancel()
        await self.runner.cleanup()


async def start_server(app: web.Application, port: int = 0, host: str | None = None) -> Serving:
    """Serve ``app`` (from ``build_app``) on ``host`` (default: the config's) and ``port``
    (0: a free one) with the config's header timeout and connection cap. A lost connection
    cancels its handler (handler_cancellation), which is how a disconnect aborts a request
    that is not streaming or still queued."""
    global SERVING_LOOP
    cfg: ServerConfig = app[CONFIG]
    loop = asyncio.get_running_loop()
    SERVING_LOOP = loop_name(loop)
    if not isinstance(loop.get_exception_handler(), _AcceptErrors):
        loop.set_exception_handler(_AcceptErrors())
    # lingering_time: the unread body of a refused request (403 / 408 / 413 / 415) is read and
    # dropped for at most this long before the close, so that the client, still sending, is not
    # reset before it reads the answer (aiohttp's default of 10 s would hold a slow client on)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        keepalive_timeout=cfg.header_timeout_s,
        lingering_time=LINGER_S,
        shutdown_timeout=10.0,
    )
    await runner.setup()
    site = _CappedSite(runner, host or cfg.host, port, _fd_cap(cfg.max_connections))
    await site.start()
    return Serving(runner, site)


def serve_forever(
    start_engine: Callable[[], Awaitable[EngineClient]], config: ServerConfig, port: int
) -> None:
    """Start the engine (``await start_engine()``), serve it on ``config.host``:``port`` on
    ``config.event_loop`` until SIGTERM or SIGINT, then stop it. A signal that arrives while the
    engine starts (model, pools, CUDA graphs: minutes on a large preset) stops it as well."""

    async def run():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        starting = asyncio.ensure_future(start_engine())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return
        engine = starting.result()  # a failed start raises here
        try:
            serving = await start_server(build_app(engine, config=config), port, config.host)
            log.info(
                "serving on http://%s:%d (event loop: %s)",
                config.host,
                serving.port,
                loop_name(loop),
            )
            try:
                await stop.wait()
            finally:
                await serving.close()
        finally:
            await engine.close()

    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        runner.run(run())


def apply_switch_interval(cfg: ServerConfig) -> float:
    """Set this process's thread switch interval from ``cfg`` (unchanged when None); returns
    the interval in effect, in seconds."""
    if cfg.gil_switch_interval_ms is not None:
        sys.setswitchinterval(cfg.gil_switch_interval_ms / 1e3)
    return sys.getswitchinterval()


def _port(text: str) -> int:
    """argparse type of --port: 0 (any free port) to 65535."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free port), got {n}")
    return n


def check_can_listen(host: str, port: int) -> None:
    """Bind ``host``:``port`` once and let go, with the options the server's listener uses, so
    that an address in use fails in one line before the engine is built (minutes on a large
    preset) rather than after it."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            why = "in use" if e.errno == errno.EADDRINUSE else e.strerror
            raise ValueError(f"cannot listen on {host}:{port}: {why}") from None


def main(argv: list[str] | None = None) -> None:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from systems.engine.config import check_known_keys, compose, resolve_engine_config

    ap = argparse.ArgumentParser(description="Serve the bundled engine over HTTP.")
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default 127.0.0.1; use 0.0.0.0 only on trusted networks)",
    )
    ap.add_argument(
        "--port", type=_port, default=30000, help="port (default 30000; 0: any free port)"
    )
    ap.add_argument("--config", help="a resolved config YAML written by the runner")
    ap.add_argument(
        "--parent-pid", type=int, help="exit when this process (the runner that started us) dies"
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. system=hisparse model=tiny")
    args = ap.parse_args(argv)
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:  # the user's mistakes in one line, before the engine is built
        if args.config:
            cfg = OmegaConf.load(args.config)  # the runner's resolved config, already checked
            if args.overrides:
                cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(args.overrides))
        else:
            cfg = compose(args.overrides)
            check_known_keys(cfg)
        ecfg = resolve_engine_config(cfg)
        scfg = ServerConfig.from_cfg(cfg.get("server"), host=args.host)
        check_can_listen(scfg.host, args.port)
    except (ValueError, OSError, HydraException, OmegaConfBaseException) as e:
        ap.exit(2, f"error: {e}\n")
    apply_switch_interval(scfg)

    def log_up(client: EngineClient, where: str) -> EngineClient:
        log.info(
            "engine up (%s): backend=%s model=%s device=%s; start-up %s",
            where,
            ecfg.kv.backend,
            ecfg.model.name,
            ecfg.device,
            ", ".join(f"{k} {v:.1f} s" for k, v in client.startup_s.items()),
        )
        return client

    if scfg.engine_process:
        from systems.engine.engine_process import EngineProcessClient

        async def start_engine() -> EngineClient:
            client = await EngineProcessClient.start(
                ecfg,
                switch_interval_ms=scfg.gil_switch_interval_ms,
                server_loop=loop_name(asyncio.get_running_loop()),
            )
            return log_up(client, f"process {client.proc.pid}")

    else:
        # built before the loop installs its signal handlers: a SIGTERM during the build (minutes
        # on a large preset) ends the process at once
        engine = Engine(ecfg)
        engine.start()

        async def start_engine() -> EngineClient:
            return log_up(LocalEngineClient(engine), "thread")

    serve_forever(start_engine, scfg, args.port)


if __name__ == "__main__":
    main()
