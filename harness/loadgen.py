"""Async load generator for the serving benchmarks.

Speaks SGLang's native ``POST /generate`` streaming API and the OpenAI-style
``POST /v1/completions`` streaming API (see ``docs/metrics.md``).

Modes
-----
* closed loop (``concurrency=C``): exactly ``C`` requests in flight; a new one
  starts as soon as one finishes.
* schedule (``schedule="16:300,256:300,16:300"``): closed loop whose target
  concurrency changes on time.  When the target rises, new requests start at
  once; when it falls, in-flight requests finish and no new one starts until
  in-flight < target.  The run ends when the schedule ends (in-flight
  requests are drained).
* open loop (``request_rate=R``): Poisson arrivals at ``R`` req/s
  (``inf``: all at once), independent of completions.

Python API::

    from harness.loadgen import LoadConfig, run_load, run_load_sync
    result = run_load_sync(LoadConfig(url="http://127.0.0.1:30000", concurrency=64,
                                      num_requests=1000, input_len=1024, output_len=256))
    result.summary["output_tok_s"]

CLI: ``python -m harness.loadgen --help``.

Event loop: ``run_load_sync`` and the CLI run on uvloop when it is importable
(optional extra: ``pip install -e '.[fast]'``) and on asyncio's default loop
otherwise; ``LoadConfig.event_loop`` / ``--event-loop`` force one.  The loop
that ran is logged and recorded in the summary as ``event_loop``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import math
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from yarl import URL

from harness.metrics import parse_prometheus, summarize
from harness.records import JsonlWriter, RequestRecord, atomic_write_json
from systems.event_loops import loop_factory, loop_name

__all__ = [
    "LoadConfig",
    "LoadResult",
    "run_load",
    "run_load_sync",
    "parse_schedule",
    "GenerateStreamParser",
    "OpenAIStreamParser",
    "build_arg_parser",
    "config_from_args",
    "main",
]

_perf = time.perf_counter
_log = logging.getLogger(__name__)

# --------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------


@dataclass
class LoadConfig:
    url: str = "http://127.0.0.1:30000"
    api: str = "generate"  # "generate" | "openai"
    concurrency: int | None = None  # closed loop
    request_rate: float | None = None  # open loop (Poisson); inf = all at once
    schedule: Any = None  # "C:s,C:s" string or [(C, s), ...]
    num_requests: int | None = None
    input_len: int | None = None  # None: 1024, or less to fit the server's context (server_limits)
    output_len: int = 128
    prefixes: int | None = None  # N shared prompts; None = a fresh prompt per request
    vocab_size: int | None = None  # None: the server's vocabulary (server_limits), else 1000
    warmup: int = 0
    # the warm-up requests' output cap (None: output_len); a few tokens prepare every prefix
    # before the load without a warm-up as long as a request
    warmup_output_len: int | None = None
    out: str | None = None  # records JSONL
    summary_out: str | None = None
    metrics_out: str | None = None  # scraped /metrics JSONL
    metrics_interval: float = 1.0  # seconds between /metrics scrapes; <= 0 disables
    seed: int = 0
    timeout: float = 3600.0  # per-request total timeout (s)
    disable_progress: bool = False
    # where stderr is not a terminal (a log file, CI, a GPU batch) the bar is off and a status
    # line is printed every this many seconds instead; <= 0: none
    progress_interval: float = 30.0
    num_gpus: int = 1
    model: str = "default"  # OpenAI "model" field
    temperature: float = 0.0
    ignore_eos: bool = True
    active_metric: Any = ("dhs_num_running_reqs", "sglang:num_running_reqs")
    host_metric: str = "dhs_selected_rows_from_host_total"
    total_metric: str = "dhs_selected_rows_total"
    read_bufsize: int = 10 * 1024 * 1024
    quiet: bool = False  # do not print the summary table (CLI)
    # "auto": uvloop if importable, else asyncio; "uvloop" | "asyncio": force one.
    # Used by run_load_sync / the CLI (run_load runs on the caller's loop).
    event_loop: str = "auto"

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> LoadConfig:
        """Build from a dict / OmegaConf mapping; ``-`` in keys is accepted as ``_``.
        Unknown keys raise ``TypeError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in dict(m).items():
            k2 = str(k).replace("-", "_")
            if k2 not in known:
                raise TypeError(f"unknown LoadConfig key: {k!r}")
            kw[k2] = v
        return cls(**kw)

    def check(self) -> None:
        """Every value in range, or a ValueError naming it: a load that cannot succeed fails
        here, before a request is sent, not as a run whose every request the server refused."""
        mode = self.mode()
        if mode == "closed" and int(self.concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency!r}")
        if mode == "open" and self.concurrency is not None and int(self.concurrency) < 1:
            raise ValueError(f"concurrency (cap) must be >= 1, got {self.concurrency!r}")
        if mode == "open" and not (float(self.request_rate) > 0):
            raise ValueError(f"request_rate must be > 0, got {self.request_rate!r}")
        if mode in ("closed", "open"):
            if self.num_requests is None:
                raise ValueError("num_requests is required without a schedule")
            if int(self.num_requests) < 1:
                raise ValueError(f"num_requests must be >= 1, got {self.num_requests!r}")
        for name in ("input_len", "output_len", "warmup_output_len", "prefixes", "vocab_size"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v!r}")
        if int(self.warmup) < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup!r}")
        if int(self.num_gpus) < 1:  # the summary divides by it, after the whole load has run
            raise ValueError(f"num_gpus must be >= 1, got {self.num_gpus!r}")
        if not float(self.temperature) >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.api not in ("generate", "openai"):
            raise ValueError(f"api must be 'generate' or 'openai', got {self.api!r}")

    def mode(self) -> str:
        """``schedule`` > ``open`` (request_rate set; concurrency, if also set,
        caps the requests in flight like SGLang's --max-concurrency) > ``closed``."""
        if self.schedule:
            return "schedule"
        if self.request_rate is not None:
            return "open"
        if self.concurrency is not None:
            return "closed"
        raise ValueError("one of concurrency, request_rate or schedule is required")


@dataclass
class LoadResult:
    records: list[RequestRecord]
    summary: dict
    samples: list[dict] = field(default_factory=list)  # scraped /metrics
    phases: list[dict] = field(default_factory=list)
    config: LoadConfig | None = None


def warmup_request_count(warmup: int | None, prefixes: int | None) -> int:
    """The warm-up's requests: ``warmup``, raised to one request per prepared prefix. A prefix
    first met while measuring is prefilled then, on the serving GPU and inside the measured
    window, where the paper's prepared prefixes exist before the benchmark starts.
    ``warmup=0`` stays 0 (the profiled experiments count engine steps from the start)."""
    n = int(warmup or 0)
    return max(n, int(prefixes or 0)) if n > 0 else 0


def first_wave(mode: str, concurrency: int | None, phases: list[tuple[int, float]]) -> int | None:
    """How many requests the first wave sends at once (post-wave statistics leave them out):
    the closed loop's concurrency, a schedule's first phase that sends anything (a leading idle
    phase, C0, sends nothing), None for an open loop (no wave)."""
    if mode == "closed":
        return int(concurrency)
    if mode == "schedule":
        return next((int(c) for c, _ in phases if int(c) > 0), 0)
    return None


def parse_schedule(spec: Any) -> list[tuple[int, float]]:
    """``"16:300,256:300"`` -> ``[(16, 300.0), (256, 300.0)]``; lists pass through."""
    if spec is None or spec == "":
        return []
    if isinstance(spec, str):
        phases = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            c, _, s = part.partition(":")
            if not s:
                raise ValueError(f"bad schedule phase {part!r}; expected CONCURRENCY:SECONDS")
            phases.append((int(c), float(s)))
    else:
        phases = [(int(p[0]), float(p[1])) for p in spec]
    for c, s in phases:
        if c < 0 or s <= 0:
            raise ValueError(f"bad schedule phase {c}:{s}")
    if not phases:
        raise ValueError("empty schedule")
    return phases


# --------------------------------------------------------------------------
# SSE stream parsers
# --------------------------------------------------------------------------

_K_CT = b'"completion_tokens":'
_K_FR = b'"finish_reason":'
_K_USAGE = b'"usage":'
_K_NTOK = b'"num_tokens":'


class _StreamParserBase:
    """Incremental SSE parser.  ``feed(data, now)`` consumes raw body bytes and
    appends ``[now, n_tokens]`` to ``chunks`` for every ``data:`` event.

    Intermediate events are decoded with a byte-level fast path (``rfind`` of
    the keys it needs; a JSON key with an unescaped closing quote cannot occur
    inside a JSON string, so this never matches text content).  The first
    event, any event with a non-null ``finish_reason``/``usage``, and anything
    the fast path does not recognise go through ``json.loads``.
    """

    __slots__ = (
        "buf",
        "chunks",
        "last_ct",
        "prompt_tokens",
        "completion_tokens",
        "timing",
        "finish_reason",
        "error",
        "done",
        "n_events",
    )

    def __init__(self) -> None:
        self.buf = b""
        self.chunks: list = []
        self.last_ct = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.timing: dict | None = None
        self.finish_reason: Any = None
        self.error: str | None = None
        self.done = False
        self.n_events = 0

    def _object(self, p: bytes) -> dict | None:
        """A chunk's JSON object, or None (recording a malformed chunk or a server error)."""
        try:
            obj = json.loads(p)
        except ValueError:
            self._bad(p)
            return None
        if not isinstance(obj, dict):
            self._bad(p)
            return None
        if obj.get("error"):
            self.error = _error_message(obj["error"])
            return None
        return obj

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        # Fast path for the common read: exactly one complete event,
        # b"data: ...\n\n" (its only newlines are the final two).  It does what
        # the general loop below does for that input (same payload, same stamp)
        # without the slice, split and loop: ~40 % less time in feed() per event
        # (about 1 us of ~2.7 on the bench_client host).
        if buf.find(b"\n") == len(buf) - 2 and buf[-1] == 10 and buf.startswith(b"data:"):
            self.buf = b""
            payload = buf[5:-2].strip()
            if payload == b"[DONE]":
                self.done = True
            elif payload:
                n = self._event(payload)
                if n is not None:
                    self.chunks.append((now, n))
            return
        end = buf.rfind(b"\n")
        if end < 0:
            self.buf = buf
            return
        self.buf = buf[end + 1 :]
        append = self.chunks.append
        event = self._event
        for line in buf[:end].split(b"\n"):
            if not line or not line.startswith(b"data:"):
                continue  # blank separators, comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            elif payload:
                n = event(payload)
                if n is not None:
                    # tuples, not lists: the GC untracks tuples of atoms, so
                    # millions of chunks do not slow down full collections
                    append((now, n))

    def finish(self, now: float) -> None:
        """Flush a trailing event without a final newline; then a stream that did not end, or
        ended without a token, is an error (a request asks for at least one: without one it
        has no TTFT or E2E, and counted as completed it would dilute every rate)."""
        if self.buf.strip():
            self.feed(b"\n", now)
        if self.error is None and not self.complete:
            self.error = "stream ended without [DONE] or finish_reason"
        if self.error is None and not any(n > 0 for _, n in self.chunks):
            self.error = "stream ended without a token"

    def _bad(self, payload: bytes) -> None:
        self.error = f"unparsable SSE payload: {payload[:200]!r}"

    def _event(self, p: bytes) -> int | None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None


def _error_message(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


class GenerateStreamParser(_StreamParserBase):
    """SGLang ``/generate`` stream: tokens per event = delta of cumulative
    ``meta_info.completion_tokens`` (fallback: ``len(output_ids)``)."""

    __slots__ = ()

    def _event(self, p: bytes) -> int | None:
        if self.prompt_tokens is not None:
            j = p.rfind(_K_FR)
            if j >= 0 and (p.startswith(b"null", j + 16) or p.startswith(b" null", j + 16)):
                i = p.rfind(_K_CT)
                if i >= 0:
                    k = i + 20
                    e = p.find(b",", k)
                    try:
                        ct = int(p[k:e])  # int() accepts surrounding whitespace
                    except ValueError:
                        return self._full(p)
                    n = ct - self.last_ct
                    self.last_ct = ct
                    self.completion_tokens = ct
                    return n
        return self._full(p)

    def _full(self, p: bytes) -> int | None:
        obj = self._object(p)
        if obj is None:
            return None
        mi = obj.get("meta_info") or {}
        pt = mi.get("prompt_tokens")
        if pt is not None:
            self.prompt_tokens = int(pt)
        elif self.prompt_tokens is None:
            self.prompt_tokens = -1  # unknown; enables the fast path anyway
        ct = mi.get("completion_tokens")
        if ct is not None:
            ct = int(ct)
            n = ct - self.last_ct
            self.last_ct = ct
            self.completion_tokens = ct
        else:
            n = len(obj.get("output_ids") or ())
            self.last_ct += n
        fr = mi.get("finish_reason")
        if fr:
            self.finish_reason = fr
            ftype = fr.get("type") if isinstance(fr, dict) else fr
            if ftype == "abort":
                msg = fr.get("message") if isinstance(fr, dict) else None
                self.error = f"aborted by server: {msg or fr}"
        t = mi.get("timing")
        if t:
            self.timing = t
        return n


class OpenAIStreamParser(_StreamParserBase):
    """OpenAI ``/v1/completions`` stream: tokens per event = ``num_tokens`` of
    each choice when present, else 1 per choice with non-empty text."""

    __slots__ = ()

    def _event(self, p: bytes) -> int | None:
        u = p.rfind(_K_USAGE)
        if u >= 0 and (p.startswith(b"null", u + 8) or p.startswith(b" null", u + 8)):
            j = p.rfind(_K_FR)
            if j >= 0 and (p.startswith(b"null", j + 16) or p.startswith(b" null", j + 16)):
                k = p.rfind(_K_NTOK)
                # exactly one choice: a second "index" key means several choices
                if k >= 0 and p.find(b'"index":', p.find(b'"index":') + 8) < 0:
                    k += 13
                    e = p.find(b"}", k)
                    c = p.find(b",", k)
                    if 0 <= c < e:
                        e = c
                    try:
                        n = int(p[k:e])
                    except ValueError:
                        return self._full(p)
                    self.last_ct += n
                    return n
        return self._full(p)

    def _full(self, p: bytes) -> int | None:
        obj = self._object(p)
        if obj is None:
            return None
        n = 0
        for ch in obj.get("choices") or ():
            nt = ch.get("num_tokens")
            if nt is None:
                nt = 1 if ch.get("text") else 0
            n += int(nt)
            fr = ch.get("finish_reason")
            if fr:
                self.finish_reason = fr
                ftype = fr.get("type") if isinstance(fr, dict) else fr
                if ftype == "abort":
                    self.error = f"aborted by server: {fr}"
        usage = obj.get("usage")
        if usage:
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
            if usage.get("completion_tokens") is not None:
                self.completion_tokens = int(usage["completion_tokens"])
        t = obj.get("timing") or (usage or {}).get("timing")
        if t:
            self.timing = t
        self.last_ct += n
        return n


# --------------------------------------------------------------------------
# prompts / request bodies
# --------------------------------------------------------------------------


class _Bodies:
    """Builds request bodies as bytes; shared prefixes are serialised once.

    Without ``prefixes`` every request gets a fresh random prompt drawn from a
    generator seeded with ``seed`` (warmup prompts come from a separate
    stream), so a run's prompts are reproducible given the submission order.
    """

    def __init__(self, cfg: LoadConfig):
        self.cfg = cfg
        self.api = cfg.api
        self.path = "/generate" if cfg.api == "generate" else "/v1/completions"
        if self.api == "generate":
            self._pre = '{"input_ids":'
        else:
            self._pre = f'{{"model":{json.dumps(cfg.model)},"prompt":'
        self._post = self._tail(int(cfg.output_len))
        warm_len = cfg.warmup_output_len
        self._post_warm = self._post if warm_len is None else self._tail(int(warm_len))
        self._rng = np.random.default_rng([int(cfg.seed), 1])
        self._rng_warm = np.random.default_rng([int(cfg.seed), 2])
        self._cache: list[bytes] = []
        if cfg.prefixes:
            rng = np.random.default_rng(int(cfg.seed))
            for _ in range(int(cfg.prefixes)):
                self._cache.append(self._head(rng, self._post))

    def _tail(self, output_len: int) -> str:
        """What follows the prompt ids: the sampling parameters with this output cap."""
        cfg = self.cfg
        if self.api == "generate":
            sp = json.dumps(
                {
                    "max_new_tokens": output_len,
                    "temperature": float(cfg.temperature),
                    "ignore_eos": bool(cfg.ignore_eos),
                },
                separators=(",", ":"),
            )
            return f',"sampling_params":{sp},"stream":true,"rid":"'
        rest = json.dumps(
            {
                "max_tokens": output_len,
                "temperature": float(cfg.temperature),
                "stream": True,
                "ignore_eos": bool(cfg.ignore_eos),
                "stream_options": {"include_usage": True},
            },
            separators=(",", ":"),
        )
        return "," + rest[1:]

    def _head(self, rng: np.random.Generator, post: str) -> bytes:
        ids = rng.integers(0, int(self.cfg.vocab_size), size=int(self.cfg.input_len)).tolist()
        return (self._pre + "[" + ",".join(map(str, ids)) + "]" + post).encode()

    def body(self, index: int, rid: str, warmup: bool = False) -> bytes:
        if self._cache:
            head = self._cache[index % len(self._cache)]
            if warmup and self._post_warm is not self._post:  # the same prompt, a shorter cap
                head = head[: len(head) - len(self._post.encode())] + self._post_warm.encode()
        else:
            head = self._head(
                *((self._rng_warm, self._post_warm) if warmup else (self._rng, self._post))
            )
        if self.api == "generate":
            return head + rid.encode() + b'"}'
        return head


# --------------------------------------------------------------------------
# the runner
# --------------------------------------------------------------------------

_JSON_HEADERS = {"Content-Type": "application/json"}


def _parse_retry_after(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


class _Runner:
    def __init__(self, cfg: LoadConfig, observer: Callable[[dict, dict], None] | None = None):
        self.cfg = cfg
        self.observer = observer
        self.mode = cfg.mode()
        self.phases_spec = parse_schedule(cfg.schedule) if self.mode == "schedule" else []
        cfg.check()
        self.base = cfg.url.rstrip("/")
        self.bodies = _Bodies(cfg)
        self.url = URL(self.base + self.bodies.path)  # parsed once, not per request
        self.parser_cls = GenerateStreamParser if cfg.api == "generate" else OpenAIStreamParser
        self.run_id = uuid.uuid4().hex[:8]
        self.records: list[RequestRecord] = []
        self.samples: list[dict] = []
        self.phase_info: list[dict] = []
        self.writer: JsonlWriter | None = None
        self.metrics_writer: JsonlWriter | None = None
        self.inflight = 0
        self.n_sent = 0
        self.target = 0
        self.cur_phase = 0
        self.stop = False
        self.wake: asyncio.Event | None = None
        self.tasks: set[asyncio.Task] = set()
        self.pbar = None
        self.warmup_errors = 0
        self.scrape_errors = 0
        self.epoch_offset = 0.0
        self.session: aiohttp.ClientSession | None = None
        self._cpu0 = self._cpu1 = self._wall0 = self._wall1 = 0.0
        self.event_loop = "?"

    # ---- one request -------------------------------------------------

    def _tag(self, rec: RequestRecord) -> None:
        rec.phase = self.cur_phase
        rec.concurrency = (self.target or None) if self.mode == "open" else self.target

    async def _request(self, rec: RequestRecord, body: bytes) -> None:
        parser = self.parser_cls()
        rec.send_epoch = time.time()
        rec.send_mono = t_send = _perf()
        # the phase is the one the request is sent in: a task launched just before a phase
        # switch can start after it (a busy event loop), and its record belongs to the new one
        self._tag(rec)
        try:
            # one timer per request; a ClientTimeout would arm a timer around every socket read
            async with (
                asyncio.timeout(self.cfg.timeout),
                self.session.post(self.url, data=body, headers=_JSON_HEADERS) as resp,
            ):
                rec.status = resp.status
                if resp.status != 200:
                    rec.retry_after = _parse_retry_after(resp.headers.get("Retry-After"))
                    raw = await resp.read()
                    msg = raw[:500].decode("utf-8", "replace")
                    try:
                        obj = json.loads(raw)
                        if isinstance(obj, dict) and obj.get("error") is not None:
                            msg = _error_message(obj["error"])
                        elif isinstance(obj, dict) and obj.get("message"):
                            msg = str(obj["message"])
                    except ValueError:
                        pass
                    rec.error = f"HTTP {resp.status}: {msg}"
                else:
                    read = resp.content.readany
                    feed = parser.feed
                    while True:
                        data = await read()
                        if not data:
                            break
                        feed(data, _perf())
                    parser.finish(_perf())
                    rec.error = parser.error
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            rec.error = f"timeout after {_perf() - t_send:.1f}s"
        except Exception as e:  # aiohttp.ClientError, OSError, ...
            rec.error = f"{type(e).__name__}: {e}"
        rec.done_mono = _perf()
        rec.chunks = parser.chunks
        rec.prompt_tokens = parser.prompt_tokens if parser.prompt_tokens != -1 else None
        rec.completion_tokens = parser.completion_tokens
        rec.timing = parser.timing
        rec.finish_reason = parser.finish_reason
        rec.success = rec.error is None

    async def _measured(self, rec: RequestRecord, body: bytes) -> None:
        try:
            await self._request(rec, body)
            self.records.append(rec)
            if self.writer is not None:
                self.writer.write(rec)
            if self.pbar is not None:
                self.pbar.update(1)
        finally:
            self.inflight -= 1
            self.wake.set()

    def _launch(self) -> None:
        i = self.n_sent
        self.n_sent += 1
        rid = f"{self.run_id}-{i}"
        rec = RequestRecord(rid=rid, index=i)
        self._tag(rec)
        body = self.bodies.body(i, rid)
        self.inflight += 1
        t = asyncio.create_task(self._measured(rec, body))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    # ---- warmup ------------------------------------------------------

    def warmup_requests(self) -> int:
        return warmup_request_count(self.cfg.warmup, self.cfg.prefixes)

    async def _warmup(self) -> None:
        n = self.warmup_requests()
        if n <= 0:
            return
        if self.mode == "closed":
            conc = int(self.cfg.concurrency)
        elif self.mode == "schedule":
            conc = max(c for c, _ in self.phases_spec)
        else:
            conc = int(self.cfg.concurrency) if self.cfg.concurrency else n
        conc = max(1, min(conc, n))
        queue = list(range(n))
        queue.reverse()

        async def worker() -> None:
            while queue:
                i = queue.pop()
                rid = f"{self.run_id}-warmup-{i}"
                rec = RequestRecord(rid=rid, index=-1 - i)
                await self._request(rec, self.bodies.body(i, rid, warmup=True))
                if not rec.success:
                    self.warmup_errors += 1

        await asyncio.gather(*(worker() for _ in range(conc)))

    # ---- dispatchers -------------------------------------------------

    async def _closed_loop(self, limit: float) -> None:
        wake = self.wake
        while not self.stop:
            while self.inflight < self.target and self.n_sent < limit and not self.stop:
                self._launch()
                # Yield once per launch: aiohttp (py<3.12) writes the request body
                # from a separate task, so launching a burst back-to-back would
                # delay every request's bytes behind all the others' setup and
                # inflate TTFT by the burst length.
                await asyncio.sleep(0)
            if self.n_sent >= limit and self.inflight == 0:
                break
            await wake.wait()
            wake.clear()

    def _start_phase(self, i: int) -> None:
        c, d = self.phases_spec[i]
        now = _perf()
        if self.phase_info:
            self.phase_info[-1]["end_mono"] = now
        self.cur_phase = i
        self.target = c
        self.phase_info.append(
            {"phase": i, "concurrency": c, "start_mono": now, "end_mono": None, "nominal_s": d}
        )
        self.wake.set()
        self._scrape_soon()

    async def _phase_timer(self, t0: float) -> None:
        """Phase 0 is started by the caller; switch to phase i at t0 + sum(d[:i])."""
        cum = self.phases_spec[0][1]
        for i in range(1, len(self.phases_spec)):
            await asyncio.sleep(max(0.0, t0 + cum - _perf()))
            self._start_phase(i)
            cum += self.phases_spec[i][1]
        await asyncio.sleep(max(0.0, t0 + cum - _perf()))
        self.phase_info[-1]["end_mono"] = _perf()
        self.stop = True
        self.wake.set()
        self._scrape_soon()

    async def _open_loop(self) -> None:
        """Poisson arrivals; with ``concurrency`` set, an arrival that finds the
        cap reached waits for a slot (later arrivals keep their own schedule)."""
        n = int(self.cfg.num_requests)
        rate = float(self.cfg.request_rate)
        cap = int(self.cfg.concurrency) if self.cfg.concurrency else 0
        rng = np.random.default_rng(self.cfg.seed + 7919)
        t = _perf()
        for _ in range(n):
            if math.isfinite(rate):
                t += float(rng.exponential(1.0 / rate))
                delay = t - _perf()
                if delay > 0:
                    await asyncio.sleep(delay)
            while cap and self.inflight >= cap:
                self.wake.clear()
                await self.wake.wait()
            self._launch()
            if not math.isfinite(rate):
                await asyncio.sleep(0)  # see _closed_loop

    # ---- /metrics scraping ------------------------------------------

    def _scrape_soon(self) -> None:
        ev = getattr(self, "_scrape_ev", None)
        if ev is not None:
            ev.set()

    async def _scrape_once(self) -> None:
        sent = _perf()
        try:
            async with self.session.get(
                URL(self.base + "/metrics"), timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                if resp.status != 200:
                    self.scrape_errors += 1
                    await resp.read()
                    return
                text = await resp.text()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.scrape_errors += 1
            return
        # stamped on the records' clock (monotonic + the run's one epoch offset: a wall-clock step
        # mid-run cannot shift a sample against the requests), at the middle of the exchange
        # (a busy event loop reads the answer late, but sent the request on time)
        ts = self.epoch_offset + (sent + _perf()) / 2
        sample = {"ts": ts, "values": parse_prometheus(text)}
        self.samples.append(sample)
        if self.metrics_writer is not None:
            self.metrics_writer.write(sample)
        if self.observer is not None:  # live sinks (W&B): once per scrape, never per request
            self.observer(sample, self.progress())

    def progress(self) -> dict:
        """Where the load stands: requests sent, finished (ok / failed), in flight."""
        failed = sum(1 for r in self.records if not r.success)
        return {
            "sent": self.n_sent,
            "completed": len(self.records) - failed,
            "errors": failed,
            "in_flight": self.inflight,
            "phase": self.cur_phase,
        }

    async def _status_lines(self, interval: float) -> None:
        """A line on stderr every ``interval`` seconds: where the load stands when no progress
        bar can be drawn (cancelled at the end of the run)."""
        total = None if self.mode == "schedule" else int(self.cfg.num_requests)
        t0 = _perf()
        while True:
            await asyncio.sleep(interval)
            p = self.progress()
            done = p["completed"] + p["errors"]
            print(
                f"[loadgen] {done}{'' if total is None else f'/{total}'} requests done "
                f"({p['errors']} failed), {p['in_flight']} in flight, {_perf() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    async def _scrape_loop(self, interval: float) -> None:
        # Stopped by a flag, not by cancel(): on Python 3.12 a cancel() that lands while the
        # event wait completes can be swallowed by wait_for, and the run then never ends
        # (seen on the GPU machine).
        ev = self._scrape_ev
        while not self._scrape_stop:
            await self._scrape_once()
            if self._scrape_stop:
                break
            try:
                await asyncio.wait_for(ev.wait(), timeout=interval)
            except TimeoutError:
                pass
            ev.clear()

    # ---- main --------------------------------------------------------

    def _summary(self, duration_hint: float | None, interrupted: bool) -> dict:
        cfg = self.cfg
        pw = first_wave(self.mode, cfg.concurrency, self.phases_spec)
        phases = [
            dict(p, end_mono=p["end_mono"] if p["end_mono"] is not None else _perf())
            for p in self.phase_info
        ]
        s = summarize(
            self.records,
            num_gpus=int(cfg.num_gpus),
            post_wave_exclude=pw,
            samples=self.samples,
            epoch_offset=self.epoch_offset,
            phases=phases,
            active_metric=cfg.active_metric,
            host_metric=cfg.host_metric,
            total_metric=cfg.total_metric,
        )
        meta = {
            "mode": self.mode,
            "api": cfg.api,
            "url": cfg.url,
            "run_id": self.run_id,
            "sent": self.n_sent,
            "warmup": self.warmup_requests(),
            "warmup_errors": self.warmup_errors,
            "scrape_samples": len(self.samples),
            "scrape_errors": self.scrape_errors,
            "interrupted": interrupted,
            "event_loop": self.event_loop,
            # client-side load: CPU seconds this process used while measuring and
            # that divided by wall time (near 1.0 = the client itself was saturated)
            "client_cpu_s": self._cpu1 - self._cpu0,
            "client_cpu_util": (self._cpu1 - self._cpu0) / max(self._wall1 - self._wall0, 1e-9),
            "config": _jsonable(dataclasses.asdict(cfg)),
        }
        meta.update(s)
        return meta

    async def _drain(self) -> None:
        while True:
            pending = [t for t in self.tasks if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending)
        self.tasks.clear()

    async def run(self) -> LoadResult:
        cfg = self.cfg
        _raise_nofile_limit()
        # the loop actually running (run_load may be called on any loop)
        self.event_loop = loop_name(asyncio.get_running_loop())
        _log.info("loadgen: event loop %s", self.event_loop)
        if cfg.event_loop not in ("auto", self.event_loop):
            _log.warning(
                "loadgen: event_loop=%r requested but running on %s",
                cfg.event_loop,
                self.event_loop,
            )
        self.wake = asyncio.Event()
        self._scrape_ev = asyncio.Event()
        self._scrape_stop = False
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
        # per-request timeouts are enforced in _request (asyncio.timeout)
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)
        interrupted = False
        scrape_task = None
        timer_task = None
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            read_bufsize=int(cfg.read_bufsize),
            auto_decompress=False,
        ) as session:
            self.session = session
            await self._warmup()
            if cfg.out:
                self.writer = JsonlWriter(cfg.out)
            if cfg.metrics_out:
                self.metrics_writer = JsonlWriter(cfg.metrics_out)
            try:
                from tqdm.auto import tqdm

                disable = bool(cfg.disable_progress) or not sys.stderr.isatty()
                total = None if self.mode == "schedule" else int(cfg.num_requests)
                self.pbar = tqdm(total=total, disable=disable, desc="requests", unit="req")
            except Exception:  # pragma: no cover - tqdm missing
                self.pbar = None
            status_task = None
            if not cfg.disable_progress and not sys.stderr.isatty() and cfg.progress_interval > 0:
                status_task = asyncio.create_task(self._status_lines(float(cfg.progress_interval)))
            self.epoch_offset = time.time() - _perf()
            # Move everything allocated so far (imports, warmup) out of the GC's
            # reach so collections during the run stay short.
            gc.collect()
            gc.freeze()
            self._cpu0, self._wall0 = time.process_time(), _perf()
            try:
                if cfg.metrics_interval and cfg.metrics_interval > 0:
                    scrape_task = asyncio.create_task(
                        self._scrape_loop(float(cfg.metrics_interval))
                    )
                if self.mode == "closed":
                    self.target = int(cfg.concurrency)
                    await self._closed_loop(int(cfg.num_requests))
                elif self.mode == "schedule":
                    self._start_phase(0)
                    t0 = self.phase_info[0]["start_mono"]
                    timer_task = asyncio.create_task(self._phase_timer(t0))
                    await self._closed_loop(math.inf)
                    await timer_task
                else:
                    self.target = int(cfg.concurrency) if cfg.concurrency else 0  # optional cap
                    await self._open_loop()
                # drain whatever is still running (schedule end / open loop). Wait on the
                # pending ones only: awaiting a gather of done tasks never yields on Python
                # 3.12, so the done-callbacks that empty self.tasks would never run.
                await self._drain()
                if scrape_task is not None:
                    self._scrape_stop = True
                    self._scrape_ev.set()
                    done, _ = await asyncio.wait([scrape_task], timeout=30)
                    if not done:
                        scrape_task.cancel()
                    scrape_task = None
                    if cfg.metrics_interval and cfg.metrics_interval > 0:
                        await self._scrape_once()  # final sample
            except (asyncio.CancelledError, KeyboardInterrupt):
                interrupted = True
                raise
            finally:
                for t in list(self.tasks):
                    t.cancel()
                await self._drain()
                self._scrape_stop = True
                self._scrape_ev.set()
                for t in (scrape_task, timer_task, status_task):
                    if t is not None and not t.done():
                        t.cancel()
                        await asyncio.wait([t], timeout=30)
                if self.pbar is not None:
                    self.pbar.close()
                if self.writer is not None:
                    self.writer.close()
                if self.metrics_writer is not None:
                    self.metrics_writer.close()
                self._cpu1, self._wall1 = time.process_time(), _perf()
                gc.unfreeze()
                self.records.sort(key=lambda r: r.index)
                summary = self._summary(None, interrupted)
                if cfg.summary_out:
                    atomic_write_json(cfg.summary_out, summary)
        return LoadResult(
            records=self.records,
            summary=summary,
            samples=self.samples,
            phases=self.phase_info,
            config=cfg,
        )


def _jsonable(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    return o


def _raise_nofile_limit() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )
    except Exception:
        pass


DEFAULT_INPUT_LEN = 1024
DEFAULT_VOCAB = 1000  # ids every real vocabulary has, for a server that does not say its own


async def server_limits(url: str) -> dict:
    """The served model's ``max_model_len`` and ``vocab_size`` from ``GET /v1/models`` (the
    bundled server and vLLM report the first; the bundled server the second), or {} when the
    server does not say (SGLang) or cannot be asked."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.get(url.rstrip("/") + "/v1/models") as r:
                if r.status != 200:
                    return {}
                model = ((await r.json()).get("data") or [{}])[0]
    except Exception:
        return {}
    return {k: model[k] for k in ("max_model_len", "vocab_size") if isinstance(model.get(k), int)}


async def fit_to_server(cfg: LoadConfig) -> LoadConfig:
    """Fill the prompt length and id range the caller left open from the server's limits: the
    vocabulary it reports (else ids below 1000), and 1024 tokens or what its context leaves
    after the output cap. A length given explicitly that exceeds the context is an error here,
    not a 400 for every request."""
    if cfg.input_len is not None and cfg.vocab_size is not None:
        return cfg
    lim = await server_limits(cfg.url)
    vocab = cfg.vocab_size if cfg.vocab_size is not None else lim.get("vocab_size", DEFAULT_VOCAB)
    ctx = lim.get("max_model_len")
    input_len = cfg.input_len
    if input_len is None:
        input_len = (
            DEFAULT_INPUT_LEN if ctx is None else min(DEFAULT_INPUT_LEN, ctx - int(cfg.output_len))
        )
        if input_len < 1:
            raise ValueError(
                f"output_len={cfg.output_len} leaves no room for a prompt in the "
                f"server's context of {ctx} tokens"
            )
        if input_len != DEFAULT_INPUT_LEN:
            _log.warning(
                "loadgen: input_len=%d to fit the server's context of %s tokens", input_len, ctx
            )
    elif ctx is not None and input_len + int(cfg.output_len) > ctx:
        raise ValueError(
            f"input_len + output_len = {input_len + int(cfg.output_len)} exceeds the "
            f"server's context of {ctx} tokens (GET /v1/models max_model_len)"
        )
    return dataclasses.replace(cfg, input_len=int(input_len), vocab_size=int(vocab))


async def run_load(
    cfg: LoadConfig | Mapping[str, Any], observer: Callable[[dict, dict], None] | None = None
) -> LoadResult:
    """Run one load test; returns records, summary and scraped samples.

    Writes ``cfg.out`` (records JSONL, one line per finished request, flushed
    per line), ``cfg.metrics_out`` and ``cfg.summary_out`` (atomic) when set.
    ``observer(sample, progress)`` is called on the event loop after each /metrics scrape
    (once per ``metrics_interval``) with the sample and ``_Runner.progress()``; it must be quick
    and must not raise.
    """
    if not isinstance(cfg, LoadConfig):
        cfg = LoadConfig.from_mapping(cfg)
    return await _Runner(await fit_to_server(cfg), observer).run()


def run_load_sync(
    cfg: LoadConfig | Mapping[str, Any], observer: Callable[[dict, dict], None] | None = None
) -> LoadResult:
    """Blocking wrapper around :func:`run_load` on a new event loop: uvloop when
    importable (``cfg.event_loop="auto"``), else asyncio's default (as ``asyncio.run``)."""
    if not isinstance(cfg, LoadConfig):
        cfg = LoadConfig.from_mapping(cfg)
    # a loop factory, not a global policy: loops of other threads (e.g. an
    # in-process server) are left alone
    with asyncio.Runner(loop_factory=loop_factory(cfg.event_loop)) as runner:
        return runner.run(_ctrl_c_cancels(run_load(cfg, observer)))


async def _ctrl_c_cancels(coro):
    """Await ``coro`` as the main task with Ctrl-C (SIGINT) handled by the event loop: the first
    cancels the task (the load's cleanup runs, its records stay) and ends in KeyboardInterrupt;
    a second falls to Python's default handler. asyncio.Runner's own handler is a Python signal
    handler, and Python signal handlers under uvloop have known failures to interrupt (uvloop
    issue 295); once a Ctrl-C went unanswered for the rest of a 100,000-request load, cause
    not pinned down. A handler added to the loop runs as a loop callback of its own. Where the
    loop cannot take one (not the main thread), Runner's handling stays."""
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    hits = 0

    def on_sigint() -> None:
        nonlocal hits
        hits += 1
        if hits == 1:
            task.cancel()
        else:  # the cleanup is stuck: the default handler's KeyboardInterrupt from here on
            loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if hits:
            raise KeyboardInterrupt from None
        raise
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (RuntimeError, ValueError):  # the loop is closing
            pass


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.loadgen",
        description="Closed/open-loop streaming load generator (SGLang /generate or OpenAI /v1/completions).",
    )
    p.add_argument("--url", default="http://127.0.0.1:30000", help="server base URL")
    p.add_argument("--api", choices=["generate", "openai"], default="generate")
    g = p.add_argument_group("load shape (pick one)")
    g.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: exactly C requests in flight (with --request-rate: at most C in flight)",
    )
    g.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="open loop Poisson rate (req/s); inf = all at once",
    )
    g.add_argument(
        "--schedule",
        default=None,
        help='phases "C:SECONDS,C:SECONDS,..." (closed loop, switches on time)',
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="total measured requests (ignored with --schedule)",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=None,
        help="prompt tokens (default 1024, or what the server's context leaves after --output-len)",
    )
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--prefixes",
        type=int,
        default=None,
        help="N shared random prompts; request i uses prompt i %% N",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="prompt ids are drawn below this (default: the server's vocabulary, else 1000)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="requests sent and awaited before measuring (not recorded)",
    )
    p.add_argument(
        "--warmup-output-len",
        type=int,
        default=None,
        help="the warm-up requests' output cap (default: --output-len)",
    )
    p.add_argument("--out", default=None, help="per-request records JSONL")
    p.add_argument("--summary-out", default=None, help="summary JSON (written atomically)")
    p.add_argument("--metrics-out", default=None, help="scraped /metrics JSONL")
    p.add_argument(
        "--metrics-interval",
        type=float,
        default=1.0,
        help="seconds between /metrics scrapes (0: off)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout in seconds")
    p.add_argument("--disable-progress", action="store_true", help="no progress bar or lines")
    p.add_argument(
        "--progress-interval",
        type=float,
        default=30.0,
        help="seconds between status lines where stderr is not a terminal (0: none)",
    )
    p.add_argument("--num-gpus", type=int, default=1, help="decode GPUs, for per-GPU throughput")
    p.add_argument("--model", default="default", help='"model" field for --api openai')
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--quiet", action="store_true", help="do not print the summary")
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="auto: uvloop if installed (extra 'fast'), else asyncio",
    )
    return p


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    d = vars(args).copy()
    return LoadConfig.from_mapping(d)


_PRINT_KEYS = (
    "event_loop",
    "completed",
    "errors",
    "duration_s",
    "output_tok_s",
    "output_tok_s_per_gpu",
    "request_throughput",
    "ttft_ms_mean",
    "ttft_ms_median",
    "ttft_ms_p99",
    "tpot_ms_mean",
    "tpot_ms_median",
    "tpot_ms_p99",
    "itl_ms_mean",
    "itl_per_token_ms_mean",
    "e2e_ms_mean",
    "post_wave_ttft_ms_mean",
    "post_wave_tpot_ms_mean",
    "alloc_wait_s_mean",
    "handoff_s_mean",
    "ttft_other_s_mean",
    "active_mean",
)


def format_summary(s: Mapping[str, Any]) -> str:
    lines = ["=" * 20 + " load summary " + "=" * 20]
    for k in _PRINT_KEYS:
        v = s.get(k)
        lines.append(f"{k:<28}{v:.3f}" if isinstance(v, float) else f"{k:<28}{v}")
    for ph in s.get("phases") or []:
        lines.append(
            "phase {phase} C={concurrency}: n={requests} tpot_ms={tpot_ms_mean} ttft_ms={ttft_ms_mean} "
            "tok/s={output_tok_s} host_share={host_fetched_share}".format(**ph)
        )
    return "\n".join(lines)


def unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why nothing answers HTTP at ``url`` (connection refused, unknown host, timeout), or None
    when something does, whatever its status: a load against no server says so in one line
    rather than as a table of failed requests."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # a server answered
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    cfg = config_from_args(args)
    try:
        cfg.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    why = unreachable(cfg.url)
    if why is not None:
        print(f"error: cannot connect to {cfg.url}: {why}", file=sys.stderr)
        return 1
    try:
        res = run_load_sync(cfg)
    except ValueError as e:  # a load that cannot fit the server: say so before sending anything
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; partial records/summary written", file=sys.stderr)
        return 130
    if not cfg.quiet:
        print(format_summary(res.summary))
    s = res.summary
    return 1 if s["completed"] == 0 and s["errors"] > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
