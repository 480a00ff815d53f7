"""The engine: schedule, run, postprocess. Never branches on which KV backend is in use.

The loop runs on its own thread (``start``) so the HTTP event loop never stalls it; tests may
call ``step`` directly. ``submit`` and ``abort`` are thread-safe.

Failures are isolated per request (docs/reliability.md): an exception while admitting a request
(prefill, handoff copy, drafter set-up, first token) rolls back what it allocated and fails that
request alone; an exception inside a decode step fails the requests of that step and releases
their slots. Failed requests finish with ``{"type": "error", "message": ...}``. The engine thread
keeps running; only a failed rollback (state it cannot vouch for) stops it, and then every
outstanding request is failed instead of left hanging. The normal path pays one ``try`` per phase.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from profiling.ranges import STEP, nvtx_range
from systems.cuda_streams import is_shared, shared_stream
from systems.engine.prefill import PrefixStore, PromptKey
from systems.engine.request import ReqStatus, Request
from systems.engine.sampler import sample_on_host
from systems.engine.scheduler import PhaseTimes, QueueFull, Scheduler, clock
from systems.host_sync import UniformValues, to_device
from systems.kv.base import KVConfig
from systems.kv.registry import create_backend
from systems.models.config import ModelConfig
from systems.models.sparse_model import SparseModel
from systems.spec.config import SpeculationConfig
from systems.spec.decoder import PlainDecoder, SpeculativeDecoder

log = logging.getLogger("dhs.engine")


class DecodeGpuTime:
    """The GPU's time inside decode steps, and the GPU timeline they run on, from a pair of CUDA
    events around each step, read without a sync: a pair is taken once its end event has
    completed (polled at later steps).

    ``seconds``: the steps' spans. ``span_seconds``: the GPU timeline from the start of a busy
    period's first step to the end of its last; a busy period ends when the engine has nothing
    to decode (``pause``), so time without requests is not counted. ``seconds / span_seconds``
    (``dhs_decode_gpu_share``) is the share of the GPU's serving time spent inside steps; the
    rest is the GPU waiting for the host between steps (scheduling, handoffs, output). It is a
    share of the GPU's timeline, not of the host's time in steps: under overlap scheduling the
    GPU runs a step while the host admits or reads back, so GPU time over host step time can
    exceed 1. A step's span includes any gaps between its kernels, so the share is an upper
    bound of the kernel-busy share (benchmarks/bench_decode_step.py measures that one from a
    profiler trace). Why events and not a profiler: two records per step, so every served run
    reports it."""

    def __init__(self, device: torch.device, event=None):
        self.on = device.type == "cuda"
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.pending: collections.deque = collections.deque()  # (start, end, continues)
        self.seconds = 0.0
        self.span_seconds = 0.0
        self._last_end = None
        self._continues = False

    def start(self):
        if not self.on:
            return None
        ev = self._event()
        ev.record()
        return ev

    def stop(self, start) -> None:
        if start is None:
            return
        end = self._event()
        end.record()
        self.pending.append((start, end, self._continues))
        self._continues = True
        while self.pending and self.pending[0][1].query():
            a, b, continues = self.pending.popleft()
            busy = a.elapsed_time(b) / 1e3
            self.seconds += busy
            if continues and self._last_end is not None:
                self.span_seconds += self._last_end.elapsed_time(b) / 1e3  # the gap, then the step
            else:
                self.span_seconds += busy
            self._last_end = b

    def pause(self) -> None:
        """Nothing to decode: the next step starts a new busy period."""
        self._continues = False


class EngineStopped(RuntimeError):
    """The engine thread has stopped; new requests are refused (the server answers 503)."""


class DuplicateRequest(ValueError):
    """A request id that is still live was submitted again (the server answers 400)."""


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    device: str = "cpu"
    max_waiting: int = 4096  # bounded queue: past it, 503 + Retry-After
    max_new_tokens_cap: int = 8192
    prefix_cache_entries: int = 16
    # handoffs (admissions) per scheduling round, 0 = all that fit: a wave of arrivals then joins
    # over several decode steps instead of stalling the running batch for all of its handoffs
    # (SGLang's decode side likewise merges transferred requests between decode iterations)
    max_handoffs_per_step: int = 0
    # handoffs copying at once, 0 = no bound: the KV transport of a disaggregated decode node
    # carries a bounded number of transfers, so a queue of arrivals drains at the rate the
    # handoffs complete (a cheaper handoff drains it sooner), not at a fixed count per step
    max_handoffs_in_flight: int = 0
    # overlap scheduling (SGLang's overlap scheduler, vLLM's async scheduling): a plain decode
    # step is launched with the previous step's tokens still on the device, and those tokens are
    # read back while the new step runs, so the host's part of a step hides behind the GPU's.
    # Finishes are seen one step late (that step's token for a finished request is dropped).
    overlap_schedule: bool = True
    # asynchronous handoffs: an admitted request's history is copied on a side stream while the
    # running batch keeps decoding; it joins the batch when the copies are done (false: every
    # handoff completes before the next step, the decode stream waits for it)
    async_handoffs: bool = True
    # the CUDA stream priority of the engine's own work (steps, admission): 0 runs it on the
    # thread's current stream, as torch gives it; negative on a stream of that priority (torch
    # maps it into the device's range), above the handoff stream's 0, so that the GPU's block
    # scheduler dispatches a step's blocks ahead of the handoff copies' waiting ones
    decode_stream_priority: int = 0
    seed: int = 0
    speculation: SpeculationConfig | None = None  # system.speculation
    profile: dict | None = None  # conf/profile/<name>.yaml; None or name=none: off
    profile_dir: str | None = None  # where collectors write (the runner sets it)
    # CUDA graphs for the target forward (systems/engine/cuda_graph.py), SGLang's names
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 256  # larger batches run eagerly
    # sizes a batch without a graph pads up to (None: 1, 2, 4, 8, then every 8 up to max_bs)
    cuda_graph_bs: tuple[int, ...] | None = None
    cuda_graph_scan_step: int = 2048  # index scan length bucket (positions) of a graph
    cuda_graph_max_graphs: int = 64  # per cache, captured while serving (warm-up's on top)
    cuda_graph_capture_after: int = 3  # a key's use that captures it (earlier uses run eagerly)
    cuda_graph_emulate: bool = False  # CPU tests: the graph protocol without CUDA
    # capture the batch-size ladder's graphs at start-up for the workload's context range
    cuda_graph_warmup: bool = True
    # (lowest, highest) max_len of a step (largest query position + 1) the warm-up covers;
    # resolve_engine_config sets it from workload.input_len / output_len
    cuda_graph_warmup_lens: tuple[int, int] | None = None


def use_decode_stream(device: torch.device, priority: int):
    """Make the calling thread's current stream the one ``engine.decode_stream_priority`` asks
    for, and return it (None: the thread's own current stream, nothing to set elsewhere). A
    thread that an earlier engine moved to a decode stream goes back to the default stream
    when this one asks for none. The device is synchronized before a switch: work queued on
    the old stream (weights, pools) is done before the new one reads it. Only the thread that
    built the engine and its loop thread run on the stream: call ``step`` from one of them
    (``metrics`` orders a reader's thread after the stream)."""
    if priority > 0:
        raise ValueError(
            f"engine.decode_stream_priority: 0 or negative (higher priority), got {priority}"
        )
    if device.type != "cuda":
        return None
    cur = torch.cuda.current_stream(device)
    if priority == 0:
        if not is_shared(cur, "decode"):
            return None  # a thread no engine moved: left alone
        target, stream = torch.cuda.default_stream(device), None
    else:
        # engines built one after another (a benchmark's rows) share it (systems/cuda_streams.py)
        target = stream = shared_stream(device, "decode", priority)
    if cur != target:
        torch.cuda.synchronize(device)
        torch.cuda.set_stream(target)
        torch.cuda.empty_cache()  # blocks cached for the other stream, free for this one
    return stream


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        # before anything is allocated or queued: the engine's memory and work on its stream
        self.decode_stream = use_decode_stream(self.device, int(cfg.decode_stream_priority))
        # the batch's temperatures on the device: one temperature for all is a cached tensor
        self._temps_on_device = UniformValues(self.device, torch.float32)
        # wall seconds of each start-up phase (the server logs them: a server start is paid
        # once per system and sweep setting of every experiment)
        self.startup_s: dict[str, float] = {}
        t0 = time.perf_counter()
        self.model = SparseModel(cfg.model, self.device)
        self.startup_s["model"] = time.perf_counter() - t0
        kv = cfg.kv
        if cfg.speculation:
            # the drafter's fixed allocations (weights + ring) come out of the KV pools, and the
            # backend must take blocks of k_max queries (sec. 3.4, "capacity accounting")
            self.decoder = SpeculativeDecoder(self, cfg.speculation, kv.max_running_requests)
            kv = dataclasses.replace(
                kv,
                max_queries_per_step=self.decoder.k_max,
                kv_pool_gib=kv.kv_pool_gib - self.decoder.drafter.fixed_bytes / (1 << 30),
            )
            if kv.kv_pool_gib <= 0:
                raise ValueError(
                    f"hardware.kv_pool_gib={cfg.kv.kv_pool_gib} cannot hold the drafter's fixed "
                    f"allocations ({self.decoder.drafter.fixed_bytes / 2**20:.1f} MiB: weights "
                    f"and a ring of W={self.decoder.window} positions for "
                    f"{cfg.kv.max_running_requests} slots); raise hardware.kv_pool_gib or lower "
                    "system.speculation.window / hardware.max_running_requests"
                )
        else:
            self.decoder = PlainDecoder(self)
        self.startup_s["decoder"] = time.perf_counter() - t0 - self.startup_s["model"]
        t1 = time.perf_counter()
        self.backend = create_backend(cfg.model, kv, self.device)  # pools, pinned host store
        self.startup_s["kv_backend"] = time.perf_counter() - t1
        keep = self.decoder.window if cfg.speculation else 1
        self.prefixes = PrefixStore(self.model, cfg.prefix_cache_entries, keep_hidden=keep)
        self.scheduler = Scheduler(
            self.backend,
            self.prefixes,
            cfg.max_waiting,
            cfg.max_handoffs_per_step,
            async_handoffs=cfg.async_handoffs,
            max_handoffs_in_flight=cfg.max_handoffs_in_flight,
        )
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.host_gen = torch.Generator().manual_seed(cfg.seed)  # first tokens (admission)
        self.graph_runner = None
        if not cfg.disable_cuda_graph and (self.device.type == "cuda" or cfg.cuda_graph_emulate):
            from systems.engine.cuda_graph import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(
                self.model,
                self.backend,
                self.device,
                max_bs=cfg.cuda_graph_max_bs,
                batch_sizes=cfg.cuda_graph_bs,
                l_step=cfg.cuda_graph_scan_step,
                max_graphs=cfg.cuda_graph_max_graphs,
                emulate=self.device.type != "cuda",
                capture_after=cfg.cuda_graph_capture_after,
            )
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending = 0  # submitted but not yet seen by the scheduler
        self._aborted_queued = 0  # aborted while waiting, abort not yet taken in (_intake)
        self.requests: dict[str, Request] = {}
        self._live: set[str] = set()  # rids submitted and not finished (duplicates refused)
        self.stats = {
            "num_steps": 0,
            "generated_tokens_total": 0,
            "finished_total": 0,
            "aborted_total": 0,
            "rejected_total": 0,
            "last_step_ms": 0.0,
            "prompt_tokens_total": 0,
            "failed_total": 0,
            "failed_steps_total": 0,
            # where the engine thread's time goes (cumulative wall seconds): admission
            # rounds (handoffs, drafter set-up, first tokens) and decode steps, the
            # latter split by whether the step captured a CUDA graph
            "admit_seconds_total": 0.0,
            "handoffs_total": 0,
            "first_tokens_total": 0,  # emitted at admission from the prefill's logits
            "decode_seconds_total": 0.0,
            "decode_gpu_seconds_total": 0.0,  # CUDA-event time inside steps (DecodeGpuTime)
            "decode_gpu_span_seconds_total": 0.0,  # the GPU timeline the steps ran on
            "overlapped_steps_total": 0,  # launched before the previous step was read back
            "capture_step_seconds_total": 0.0,
            "capture_steps_total": 0,
        }
        # admission's phases on the engine's side (the scheduler keeps its own): the decoder's
        # set-up of arrivals and their first tokens (/metrics: dhs_admit_phase_seconds_total)
        self._admit_phases = PhaseTimes(("decoder", "first_token"))
        self._snapshot_at = 0.0  # perf_counter of the last counter snapshot (/metrics)
        self._steps_unsnapped = False  # steps ran since it
        self.error: BaseException | None = None
        # called on the engine thread where buffered outputs must leave: after admission (the
        # first tokens, before the decode step is launched: they would otherwise wait a step),
        # after the round, and after the loop failed every request. systems/engine/
        # engine_process.py sends what its outputs callback buffered to the server's process
        self.flush_outputs: Callable[[], None] = lambda: None
        self._gpu_time = DecodeGpuTime(self.device)
        # the decoder says whether it can launch a step before the previous one is read back
        self._overlap = cfg.overlap_schedule and getattr(self.decoder, "supports_overlap", False)
        if self._overlap:
            self.backend.set_blocks_in_flight(1 + self.decoder.commit_lag)
        self._inflight = None  # the launched, not yet read step (overlap scheduling)
        self._deferred: list[Request] | None = None  # finished while their slot is in flight
        self._warm_up_cuda_graphs()

    def _warm_up_cuda_graphs(self) -> None:
        """``engine.cuda_graph_warmup``: the graphs of every ladder size a batch of this
        engine's slots can run as, target and drafter, captured before any request arrives
        (CudaGraphRunner.warm_up)."""
        r, lens = self.graph_runner, self.cfg.cuda_graph_warmup_lens
        if r is None or not self.cfg.cuda_graph_warmup or lens is None:
            return
        t0 = time.perf_counter()
        sizes = r.ladder_up_to(self.backend.num_slots)
        n = r.warm_up(sizes, self.decoder.verify_queries, lens, self.decoder.verify_widths)
        n += self.decoder.warm_up_graphs(sizes)
        self.startup_s["cuda_graphs"] = time.perf_counter() - t0
        log.info(
            "captured %d CUDA graphs at start-up (batch sizes %s, steps of max_len %d..%d) in "
            "%.1f s",
            n,
            sizes,
            *lens,
            self.startup_s["cuda_graphs"],
        )

    # ------------------------------------------------------------------ thread-safe API
    def new_rid(self) -> str:
        return f"req-{next(self._ids)}"

    def submit(self, req: Request) -> None:
        if req.params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        total = self.backend.max_total_tokens
        if len(req.prompt_ids) + req.params.max_new_tokens > total:
            # the HTTP server answers 400 for this; direct callers get the same reason here
            # instead of a failed admission later
            raise ValueError(
                f"prompt of {len(req.prompt_ids)} tokens + max_new_tokens="
                f"{req.params.max_new_tokens} exceeds the context of {total} tokens"
            )
        if req.prompt_key is None:  # here, on the caller's thread, not at admission
            req.prompt_key = PromptKey(req.prompt_ids)
        with self._lock:
            if self.error is not None:
                raise EngineStopped(f"engine stopped: {self.error!r}")
            if req.rid in self._live:
                raise DuplicateRequest(f"request id {req.rid!r} is already in flight")
            queued = len(self.scheduler.waiting) + self._pending - self._aborted_queued
            if queued >= self.cfg.max_waiting:
                self.stats["rejected_total"] += 1
                raise QueueFull(f"waiting queue is full ({self.cfg.max_waiting} requests)")
            self._pending += 1
            self._live.add(req.rid)
            self._inbox.put(req)  # under the lock: a crash drains the inbox after setting error
        self._wake.set()

    def abort(self, req: Request) -> None:
        """Abort this request object (not an id: a stale abort must not reach a later request
        that reuses the id). A queued request stops counting against ``max_waiting`` at once,
        before the engine thread gets to it."""
        with self._lock:
            if req.aborted or req.status != ReqStatus.WAITING or req.finish_reason is not None:
                queued = False
            else:
                queued = True
                self._aborted_queued += 1
            req.aborted = True
        self._aborts.put((req, queued))
        self._wake.set()

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def stopped(self) -> str | None:
        """Why the engine thread no longer serves (its error, or its exit), None while it does:
        what /health reports, whichever process the engine runs in."""
        t = self._thread
        if self.error is not None or (t is not None and not t.is_alive()):
            return f"engine stopped: {self.error!r}"
        return None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        from profiling.collectors import maybe_profile

        if self.decode_stream is not None:  # a thread's current stream is its own
            torch.cuda.set_stream(self.decode_stream)
        try:
            # collectors are entered on this thread: torch.profiler records the entering thread
            with maybe_profile(self.cfg.profile, out_dir=self.cfg.profile_dir, source=self) as prof:
                while not self._stop.is_set():
                    busy = self.step()
                    self.flush_outputs()
                    self._snapshot_counters(idle=not busy)
                    if busy:
                        if prof is not None:
                            prof.step(sessions=len(self.scheduler.running))
                    else:
                        self._wake.wait(timeout=0.05)
                        self._wake.clear()
        except BaseException as e:  # surface engine crashes to /health instead of hanging
            with self._lock:
                self.error = e
            self._fail_outstanding(e)
            self.flush_outputs()
            raise

    def step(self) -> bool:
        """One scheduling round: intake, admission (handoffs), one decode step. Returns whether
        any work was done."""
        self._intake()
        if not self.scheduler.running and self._inflight is None:
            self._gpu_time.pause()  # an idle GPU now is no host overhead of serving
        t_admit = time.perf_counter()
        admitted = self.scheduler.admit(on_error=self._fail_admission)
        if not admitted and not self.scheduler.running and self._inflight is None:
            admitted = self.scheduler.arrivals(wait=True)  # nothing to decode meanwhile
        t_decoder = clock()
        failed = self._decoder_admit(admitted)
        t_first = clock()
        for req, entry in admitted:
            try:
                if id(req) in failed:
                    raise failed[id(req)]
                self._emit_first_token(req, entry)
            except Exception as e:  # this request's handoff failed: release it, fail it alone
                if req.status == ReqStatus.RUNNING:
                    self.scheduler.finish(req)
                self._fail(req, e)
                self._check_after_failure()
        self.flush_outputs()  # first tokens and aborts now, not after the decode step
        t_end = clock()
        t0 = t_end[0]
        if admitted:
            self.stats["admit_seconds_total"] += t0 - t_admit
            self.stats["handoffs_total"] += len(admitted)
            self._admit_phases.add("decoder", t_decoder, t_first)  # a drafter's set-up
            self._admit_phases.add("first_token", t_first, t_end)
        # requests that finished while their slot was in flight wait for their release here
        batch = [r for r in self.scheduler.running.values() if r.finish_reason is None]
        prev = self._inflight
        if prev is not None:  # a request whose in-flight token reaches its cap is done
            most = self.decoder.max_emit  # tokens a step or round can emit per request
            batch = [
                r
                for r in batch
                if id(r) not in prev.index or len(r.output_ids) + most < r.params.max_new_tokens
            ]
        if not batch and prev is None:
            return bool(admitted)
        captures = self._graph_captures()
        ev = self._gpu_time.start()
        if self._overlap:
            self._overlapped_step(batch, prev)
        else:
            self._decode(batch)
        self._gpu_time.stop(ev)
        self.stats["decode_gpu_seconds_total"] = self._gpu_time.seconds
        self.stats["decode_gpu_span_seconds_total"] = self._gpu_time.span_seconds
        dt = time.perf_counter() - t0
        self.stats["last_step_ms"] = dt * 1e3
        self.stats["num_steps"] += bool(batch)  # a round that only read back the last step is none
        self.stats["decode_seconds_total"] += dt
        if self._graph_captures() != captures:  # this step recorded a graph (target or drafter)
            self.stats["capture_steps_total"] += 1
            self.stats["capture_step_seconds_total"] += dt
        return True

    def _graph_captures(self) -> int:
        gr = self.graph_runner
        return 0 if gr is None else gr.stats["captures"] + gr.drafter.stats["captures"]

    @property
    def is_idle(self) -> bool:
        """Nothing submitted, waiting, running, or waiting to be aborted."""
        return (
            not self._holds_requests
            and self._pending == 0
            and self._inbox.empty()
            and self._aborts.empty()
            and not self.requests
        )

    @property
    def _holds_requests(self) -> bool:
        """Requests the scheduler holds (waiting, arriving, running) or a step in flight."""
        sc = self.scheduler
        return bool(sc.running or sc.arriving or sc.waiting) or self._inflight is not None

    def _idle_waiter(self, timeout: float):
        """Yields sleep intervals until the engine is idle and one more quiet interval passed
        (so the engine thread is not between two halves of a step while a caller inspects
        the backend); raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_idle:
                steps = self.stats["num_steps"]
                yield 0.05
                if self.is_idle and self.stats["num_steps"] == steps:
                    return
            yield 0.02
        raise TimeoutError(
            f"engine not idle after {timeout}s: running="
            f"{len(self.scheduler.running)} waiting={len(self.scheduler.waiting)} "
            f"requests={len(self.requests)}"
        )

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until the engine thread has drained (see ``_idle_waiter``)."""
        for dt in self._idle_waiter(timeout):
            time.sleep(dt)

    async def wait_idle_async(self, timeout: float = 60.0) -> None:
        for dt in self._idle_waiter(timeout):
            await asyncio.sleep(dt)

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Drive the engine from the calling thread until nothing is left (tests, offline)."""
        for _ in range(max_steps):
            self.step()
            if not self._holds_requests and self._inbox.empty():
                return
        raise RuntimeError("engine did not go idle")

    # ------------------------------------------------------------------ phases
    def _intake(self) -> None:
        # aborts first taken, then submissions: an abort follows its request's submit, so every
        # request aborted here is in the inbox drained below or already in the engine's books
        aborts = []
        while True:
            try:
                aborts.append(self._aborts.get_nowait())
            except queue.Empty:
                break
        if aborts and self._inflight is not None:
            self._drain()  # an abort releases a slot: never one the in-flight step still uses
        while True:
            try:
                req = self._inbox.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self._pending -= 1
            self.requests[req.rid] = req
            self.scheduler.waiting.append(req)
        for req, queued in aborts:
            if queued:
                with self._lock:
                    self._aborted_queued -= 1
            if req.status == ReqStatus.FINISHED or self.requests.get(req.rid) is not req:
                continue  # finished meanwhile: the abort is stale
            if req.status == ReqStatus.WAITING:
                self.scheduler.remove_waiting(req)
                req.status = ReqStatus.FINISHED
            else:
                self.scheduler.finish(req)
            req.finish_reason = {"type": "abort"}
            req.finish_ts = time.time()
            self.stats["aborted_total"] += 1
            self.requests.pop(req.rid, None)
            self._live.discard(req.rid)
            self._notify(req, [], True)  # whoever still waits on it learns it ended

    def run_target(
        self,
        slots: list[int] | torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        max_len: int,
        widths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target model's forward over this step's queries, through the KV backend:
        a CUDA graph replay when one applies, else eager. tokens / positions (B, Q) on the
        device; max_len = the largest query position + 1 (known on the host). Returns
        (logits, hidden); with graphs they stay valid until the next call only. ``slots``: a
        list, or already on the device (one copy with the step's other metadata). ``widths``
        (B,) on the device: the queries each request verifies, where they differ from Q
        (``KVBackend.begin_step``)."""
        be = self.backend
        dev_slots = slots if torch.is_tensor(slots) else to_device(slots, self.device, torch.int64)
        r = self.graph_runner
        if r is not None and r.can_run(len(slots)):
            be.host_prepare()
            try:
                return r.forward(tokens, positions, dev_slots, max_len, widths)
            finally:
                be.end_step()
        if r is not None:
            max_len = r.scan_len(max_len)  # the graphs' bucket: the same selections either way
            r.stats["eager_steps"] += 1
        be.begin_step(dev_slots, positions, max_len, widths)
        out = self.model(tokens, positions, be)
        be.end_step()
        return out

    def _decoder_admit(self, admitted) -> dict[int, Exception]:
        """The decoder's set-up of the arrivals (a drafter fills its ring) in one call. When it
        fails, one call per request, so that only a request that fails on its own is failed:
        returns id(request) -> its error."""
        if not admitted:
            return {}
        try:
            self.decoder.on_admit(admitted)
            return {}
        except Exception as e:
            if len(admitted) == 1:
                return {id(admitted[0][0]): e}
            log.warning("decoder set-up of %d arrivals failed (%r): one by one", len(admitted), e)
        failed = {}
        for item in admitted:
            try:
                self.decoder.on_admit([item])
            except Exception as e:
                failed[id(item[0])] = e
        return failed

    def _temperatures(self, reqs: list[Request]) -> torch.Tensor:
        return self._temps_on_device(r.params.temperature for r in reqs)

    def _emit_first_token(self, req: Request, entry) -> None:
        # on the host, from the prefill's copy: a device sample read back here would wait for
        # the step in flight (overlap scheduling)
        t = torch.tensor([req.params.temperature], dtype=torch.float32)
        tok = sample_on_host(entry.last_logits_host.unsqueeze(0), t, self.host_gen)
        self.stats["prompt_tokens_total"] += req.num_prompt_tokens
        self.stats["first_tokens_total"] += 1
        self._append_tokens(req, [int(tok)])

    def _overlapped_step(self, batch: list[Request], prev) -> None:
        """Launch this step, then read the previous one's tokens while it runs."""
        cur = None
        if batch:
            try:
                with nvtx_range(STEP):
                    cur = self.decoder.launch(batch, prev)
            except Exception as e:  # the previous step's tokens are good: deliver them first
                self._inflight = None
                if prev is not None:
                    self._complete(prev, None)
                self._fail_step([r for r in batch if r.status == ReqStatus.RUNNING], e)
                return
        self._inflight = cur
        if prev is not None:
            self.stats["overlapped_steps_total"] += cur is not None
            self._complete(prev, cur)

    def _complete(self, done, running) -> None:
        """Deliver the tokens of the completed step ``done``; release the slots that waited for
        it, and defer those of requests that finished now to the step ``running`` they are in."""
        try:
            toks = done.read()
        except Exception as e:  # its read-back or commit failed (a speculative round)
            self._fail_read(done, running, e)
            return
        self._deferred = []
        try:
            self.decoder.on_delivered(
                sum(
                    self._append_tokens(r, t)
                    for r, t in zip(done.batch, toks)
                    if r.finish_reason is None and r.status == ReqStatus.RUNNING
                )
            )
        finally:
            deferred, self._deferred = self._deferred, None
        self._release(done.release_after, None)
        self._release(deferred, running)

    def _release(self, reqs: list[Request], running) -> None:
        """Release finished requests' slots now, or, for those in the step ``running`` (still
        queued on the device), once that step has been read back."""
        for r in reqs:
            if running is not None and id(r) in running.index:
                running.release_after.append(r)
            else:
                self.scheduler.finish(r)

    def _fail_read(self, done, running, exc: Exception) -> None:
        """Reading back the step ``done`` raised: its tokens are lost, so its requests fail
        as those of a failed step. A failed request that is also in the step ``running``
        (queued behind it) keeps its slot until that step has been read back."""
        self.stats["failed_steps_total"] += 1
        failed = [
            r for r in done.batch if r.status == ReqStatus.RUNNING and r.finish_reason is None
        ]
        self._release(failed, running)
        for r in failed:
            self._fail(r, exc)
        self._release(done.release_after, None)
        self._check_after_failure()

    def _drain(self) -> None:
        """Read back the in-flight step and release what waited for it (a sync)."""
        prev, self._inflight = self._inflight, None
        if prev is not None:
            self._complete(prev, None)

    def _decode(self, batch: list[Request]) -> None:
        try:
            with nvtx_range(STEP):  # the step window of the kernel timeline
                outs = self.decoder.decode(batch)
        except Exception as e:  # fail this step's requests, keep the engine serving
            self._fail_step(batch, e)
            return
        self.decoder.on_delivered(sum(self._append_tokens(r, t) for r, t in zip(batch, outs)))

    # ------------------------------------------------------------------ failure isolation
    def _notify(self, req: Request, emitted: list[int], done: bool) -> None:
        if req.on_output is None:
            return
        try:
            req.on_output(req, emitted, done)
        except Exception:
            self._output_failed(req, done)

    def _output_failed(self, req: Request, done: bool) -> None:
        """A broken consumer (closed event loop, ...) must not stop the engine: abort its
        request, which frees its memory at the next intake."""
        log.exception("output callback of %s failed", req.rid)
        if not done:
            self.abort(req)

    def _fail(self, req: Request, exc: BaseException) -> None:
        """Finish one request with an error. Its memory must already be released (or be
        released once the step still using its slot has been read back)."""
        if req.status == ReqStatus.FINISHED and req.finish_reason is not None:
            log.error("%s failed after it finished: %r", req.rid, exc)
            return
        msg = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.error("request %s failed: %s", req.rid, msg, exc_info=exc)
        req.status = ReqStatus.FINISHED
        req.finish_reason = {"type": "error", "message": msg}
        req.finish_ts = time.time()
        self.stats["failed_total"] += 1
        self.requests.pop(req.rid, None)
        self._live.discard(req.rid)
        self._notify(req, [], True)

    def _fail_admission(self, req: Request, exc: Exception) -> None:
        self._fail(req, exc)  # the scheduler has rolled its allocation back
        self._check_after_failure()

    def _fail_step(self, batch: list[Request], exc: Exception) -> None:
        """A decode step raised: close the backend's step, release and fail its requests."""
        self.stats["failed_steps_total"] += 1
        be = self.backend
        if be._step is not None:
            try:
                be.end_step()
            except Exception:
                log.exception("end_step after a failed step")
            be._step = None
        for r in batch:
            if r.status == ReqStatus.RUNNING:
                self.scheduler.finish(r)
            self._fail(r, exc)
        self._check_after_failure()

    def _check_after_failure(self) -> None:
        """After a failure the backend's invariants must still hold; if they do not, raising
        here stops the engine (and fails every request) rather than serve from bad state."""
        self.backend.check_integrity()

    def _fail_outstanding(self, exc: BaseException) -> None:
        """The loop is dying: fail every request not yet finished so no client waits forever."""
        reqs = list(self.requests.values())
        while True:
            try:
                reqs.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for r in reqs:
            if r.finish_reason is not None:
                continue
            r.status = ReqStatus.FINISHED
            r.finish_reason = {"type": "error", "message": f"engine stopped: {exc!r}"}
            r.finish_ts = time.time()
            self.stats["failed_total"] += 1
            self._notify(r, [], True)
        self.requests.clear()
        self._live.clear()

    def _append_tokens(self, req: Request, toks: list[int]) -> int:
        """Append a step's tokens to ``req`` up to its length cap, EOS or stop match; returns
        how many it took."""
        now = time.time()
        emitted = []
        for t in toks:
            req.output_ids.append(t)
            req.token_ts.append(now)
            emitted.append(t)
            if len(req.output_ids) >= req.params.max_new_tokens:
                req.finish_reason = {"type": "length", "length": len(req.output_ids)}
                break
            if not req.params.ignore_eos and (
                t == self.cfg.model.eos_token_id or t in req.params.stop_token_ids
            ):
                req.finish_reason = {"type": "stop", "matched": t}
                break
            if req.params.stop is not None:
                try:
                    matched = req.params.stop(req.output_ids)
                except Exception as e:  # a broken matcher fails its request, not the engine
                    log.exception("stop matcher of %s failed", req.rid)
                    req.finish_reason = {"type": "error", "message": f"stop matcher: {e!r}"}
                    break
                if matched is not None:
                    req.finish_reason = {"type": "stop", "matched": matched}
                    break
        if req.first_token_ts is None:
            req.first_token_ts = now
        self.stats["generated_tokens_total"] += len(emitted)
        done = req.finish_reason is not None
        if done:
            req.finish_ts = now
            if self._deferred is not None:  # its slot may be in the in-flight step
                self._deferred.append(req)
            else:
                self.scheduler.finish(req)
            failed = req.finish_reason["type"] == "error"
            self.stats["failed_total" if failed else "finished_total"] += 1
            self.requests.pop(req.rid, None)
            self._live.discard(req.rid)
        if req.on_output is not None:
            try:  # zero-cost unless it raises
                req.on_output(req, emitted, done)
            except Exception:
                self._output_failed(req, done)
        return len(emitted)

    # ------------------------------------------------------------------ observability
    # the device counters /metrics reports trail the device by at most this, while serving
    SNAPSHOT_INTERVAL_S = 0.1

    def _snapshot_counters(self, idle: bool) -> None:
        """A host copy of the backend's device counters for /metrics (``metrics(sync=False)``,
        on the event loop, which must not wait for the device): every SNAPSHOT_INTERVAL_S while
        steps run, and once more when the engine goes idle, so the last steps' counts reach it."""
        self._steps_unsnapped |= not idle
        now = time.perf_counter()
        if not self._steps_unsnapped or (
            not idle and now - self._snapshot_at < self.SNAPSHOT_INTERVAL_S
        ):
            return
        if self.backend.snapshot_counters():
            self._snapshot_at, self._steps_unsnapped = now, False

    def metrics(self, sync: bool = True) -> dict[str, float]:
        """Counters and gauges of the engine and its backend. ``sync=False``: read no device
        value (the HTTP server's event loop; ``KVBackend.metrics``). Called from other threads
        while the engine thread runs: dicts that thread may grow are read through a copy (one C
        call under the GIL), since iterating one while it resizes raises."""
        m = {
            "dhs_num_running_reqs": len(self.scheduler.running),
            "dhs_num_handoff_reqs": len(self.scheduler.arriving),  # history on its way
            "dhs_num_waiting_reqs": len(self.scheduler.waiting) + self._pending,
            "dhs_num_prefills_total": self.prefixes.num_prefills,
            "dhs_num_prefix_loads_total": self.prefixes.num_loads,  # from DHS_PREFIX_CACHE
        }
        for k, v in dict(self.stats).items():
            m[f"dhs_{k}"] = v
        gr = self.graph_runner
        if gr is not None:
            for name, cache in (("graph", gr.cache), ("drafter_graph", gr.drafter)):
                for k, v in dict(cache.stats).items():
                    m[f"dhs_{name}_{k}_total"] = v
        if sync and self.decode_stream is not None:
            # a caller's thread queues its reads on its own stream: after the steps queued so far
            torch.cuda.current_stream(self.device).wait_stream(self.decode_stream)
        m.update(self.backend.metrics(sync))
        for k, v in dict(getattr(self.decoder, "stats", {})).items():
            m[f"dhs_{k}"] = v
        for reason, n in dict(self.scheduler.wait_reason_counts).items():
            m[f'dhs_admission_wait_events_total{{reason="{reason}"}}'] = n
        for times in (self.scheduler.admit_phases, self._admit_phases):
            for phase, wall in dict(times.wall).items():
                m[f'dhs_admit_phase_seconds_total{{phase="{phase}"}}'] = wall
                m[f'dhs_admit_phase_cpu_seconds_total{{phase="{phase}"}}'] = times.cpu.get(
                    phase, 0.0
                )
        m["dhs_admission_blocked"] = 1.0 if self.scheduler.wait_reason else 0.0
        if self.device.type == "cuda":
            m.update(cuda_allocator_counters(self.device))
        if self._gpu_time.on and self.stats["decode_gpu_span_seconds_total"] > 0:
            # share of the GPU's serving timeline spent inside steps (1 - host gaps)
            m["dhs_decode_gpu_share"] = (
                self.stats["decode_gpu_seconds_total"] / self.stats["decode_gpu_span_seconds_total"]
            )
        return m


def cuda_allocator_counters(device) -> dict[str, float]:
    """The CUDA caching allocators' event counts (/metrics). A device allocation the cache
    cannot serve calls cudaMalloc, and a retry after freeing cached blocks calls cudaFree, which
    waits for the whole device: a step in flight. Pinned host blocks are reused only once the
    copies that used them have run, so a new one each time costs a cudaHostAlloc. Each such count
    growing with handoffs says which allocation holds the engine thread."""
    s = torch.cuda.memory_stats(device)
    out = {
        "dhs_cuda_malloc_total": float(s.get("num_device_alloc", 0)),
        "dhs_cuda_free_total": float(s.get("num_device_free", 0)),
        "dhs_cuda_alloc_retries_total": float(s.get("num_alloc_retries", 0)),
    }
    host = getattr(torch.cuda, "host_memory_stats", None)
    if host is not None:
        h = host()
        out["dhs_cuda_host_alloc_total"] = float(h.get("num_host_alloc", 0))
        out["dhs_cuda_host_free_total"] = float(h.get("num_host_free", 0))
        # microseconds spent in those cudaHostAlloc calls
        out["dhs_cuda_host_alloc_seconds_total"] = float(h.get("host_alloc_time.total", 0)) / 1e6
    return out
