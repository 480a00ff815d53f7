"""Admission by memory with a bounded FCFS waiting queue, and the running batch.

Admission reserves a slot and the backend's memory for prompt + output cap before a request
runs, so a running request never has to be preempted. A request that does not fit waits at the
head of the queue (FCFS: later requests do not overtake it) with the backend's reason recorded,
which /metrics exposes.

Handoffs are asynchronous (``async_handoffs``, on a GPU): admission reserves the request's
memory and queues its history's copies on the backend's handoff stream, and the request waits in
``arriving`` (status HANDOFF) while the decode steps of the others go on; ``arrivals()`` moves
those whose copies have completed into the running batch, in the order they were admitted.

A request whose admission raises (prefill, ``can_admit``, the handoff copy in ``admit``) is taken
out of the queue, whatever the backend allocated for it is released (the slot it took, found by
comparing ``active_slots``), and ``on_error(req, exc)`` fails it; the requests behind it are
admitted as usual. If the rollback itself fails, the error propagates (the engine stops).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from systems.engine.prefill import PrefixStore
from systems.engine.request import ReqStatus, Request
from systems.kv.base import KVBackend


def clock() -> tuple[float, float]:
    """(wall, this thread's CPU) seconds: their difference over a phase is time the thread spent
    blocked (on the GIL, a lock, a sleeping wait), not working or spinning in a CUDA sync."""
    return time.perf_counter(), time.thread_time()


class PhaseTimes:
    """Wall and thread-CPU seconds by phase, accumulated."""

    def __init__(self, phases: tuple[str, ...]):
        self.wall = dict.fromkeys(phases, 0.0)
        self.cpu = dict.fromkeys(phases, 0.0)

    def add(
        self, phase: str, start: tuple[float, float], end: tuple[float, float] | None = None
    ) -> tuple[float, float]:
        """Count the time from ``start`` to ``end`` (``clock()``s; end: now) to ``phase``;
        returns ``end``."""
        end = end or clock()
        self.wall[phase] += end[0] - start[0]
        self.cpu[phase] += end[1] - start[1]
        return end


class QueueFull(Exception):
    """The waiting queue is at its bound; the server answers 503 with Retry-After."""


class Scheduler:
    def __init__(
        self,
        backend: KVBackend,
        prefixes: PrefixStore,
        max_waiting: int,
        max_handoffs_per_step: int = 0,
        async_handoffs: bool = False,
        max_handoffs_in_flight: int = 0,
    ):
        if max_handoffs_per_step < 0:
            raise ValueError(
                f"engine.max_handoffs_per_step must be >= 0 (0: no bound), got "
                f"{max_handoffs_per_step}"
            )
        self.backend = backend
        self.prefixes = prefixes
        self.max_waiting = max_waiting
        self.max_handoffs = max_handoffs_per_step
        if max_handoffs_in_flight < 0:
            raise ValueError(
                f"engine.max_handoffs_in_flight must be >= 0 (0: no bound), got "
                f"{max_handoffs_in_flight}"
            )
        self.max_in_flight = max_handoffs_in_flight
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # slot -> request
        self.async_handoffs = async_handoffs
        # slot -> (request, prefill entry): handoffs started, history still on its way
        self.arriving: dict[int, tuple[Request, object]] = {}
        self.wait_reason = ""
        self.wait_reason_counts: dict[str, int] = {}
        # host seconds of admission by phase (/metrics: dhs_admit_phase_seconds_total, and the
        # engine thread's CPU seconds of each: dhs_admit_phase_cpu_seconds_total): which part of
        # a handoff holds up the engine thread. prefix: the prefill store's lookup (and the
        # prefill itself when the prompt is new); can_admit; handoff: reserve + queueing the
        # history's copies; arrivals: checking (or waiting for) copies that completed
        self.admit_phases = PhaseTimes(("prefix", "can_admit", "handoff", "arrivals"))

    def admit(
        self, on_error: Callable[[Request, Exception], None] | None = None
    ) -> list[tuple[Request, object]]:
        """Admit waiting requests while they fit, at most ``max_handoffs_per_step`` of them
        (0: no bound; the rest stay queued for the next round) and while fewer than
        ``max_handoffs_in_flight`` handoffs are still copying (0: no bound: a transport that
        carries that many at once, so a cheaper handoff lets the queue drain sooner), and start
        their handoffs.
        Returns the requests whose handoff completed (``arrivals``): (request, prefill entry)
        pairs, now running.

        With ``on_error``, a request whose admission raises is rolled back and handed to it
        (the others go on); without, the exception propagates."""
        started = 0
        self.wait_reason = ""
        while self.waiting and not (self.max_handoffs and started >= self.max_handoffs):
            if self.max_in_flight and len(self.arriving) >= self.max_in_flight:
                break  # not a memory wait: the transport is full
            req = self.waiting[0]
            if req.aborted:
                # aborted after this round's intake: its abort is taken in next round (before
                # any admission); starting its handoff now would copy a history for nothing
                break
            held = None
            try:
                t = clock()
                entry, computed = self.prefixes.get(req.prompt_ids, req.prompt_key)
                if req.prefill_done_ts is None:
                    req.prefill_s = entry.prefill_s if computed else 0.0
                    req.prefill_done_ts = time.time()
                t = self.admit_phases.add("prefix", t)
                ok, reason = self.backend.can_admit(
                    req.num_prompt_tokens, req.params.max_new_tokens
                )
                t = self.admit_phases.add("can_admit", t)
                if not ok:
                    self.wait_reason = reason
                    if req.wait_reason != reason:
                        self.wait_reason_counts[reason] = self.wait_reason_counts.get(reason, 0) + 1
                    req.wait_reason = reason
                    break
                self.waiting.popleft()
                req.alloc_ts = time.time()
                held = set(self.backend.active_slots)
                req.slot = self.backend.admit(
                    entry.prefix, req.params.max_new_tokens, asynchronous=self.async_handoffs
                )
                self.admit_phases.add("handoff", t)
            except Exception as e:
                if on_error is None:
                    raise
                self._roll_back(req, held)
                on_error(req, e)
                continue
            req.status = ReqStatus.HANDOFF
            self.arriving[req.slot] = (req, entry)
            started += 1
        return self.arrivals()

    def arrivals(self, wait: bool = False) -> list[tuple[Request, object]]:
        """Move the requests whose history has arrived into the running batch, in admission
        order (a later handoff never overtakes an earlier one: they share one stream).
        ``wait``: block for the oldest one if none has arrived (nothing else to do)."""
        t = clock()
        try:
            return self._arrivals(wait)
        finally:
            self.admit_phases.add("arrivals", t)

    def _arrivals(self, wait: bool) -> list[tuple[Request, object]]:
        out = []
        for slot, (req, entry) in list(self.arriving.items()):
            if not self.backend.import_done(slot, wait=wait and not out):
                break
            del self.arriving[slot]
            req.handoff_done_ts = time.time()
            req.status = ReqStatus.RUNNING
            self.running[slot] = req
            out.append((req, entry))
        if self.backend.device.type == "cuda" and out and not self.async_handoffs:
            import torch

            # synchronous handoffs: the copies are done before the next step is queued, so
            # TTFT's handoff part is the copies' time (the pre-async engine's behaviour)
            torch.cuda.synchronize(self.backend.device)
            now = time.time()
            for req, _ in out:
                req.handoff_done_ts = now
        return out

    def _roll_back(self, req: Request, held: set[int] | None) -> None:
        """Undo a failed admission: dequeue the request, release any slot it took."""
        if self.waiting and self.waiting[0] is req:
            self.waiting.popleft()
        if held is not None:
            for slot in sorted(self.backend.active_slots - held):
                self.backend.release(slot)  # raises if the backend cannot undo it
        req.slot = -1
        req.status = ReqStatus.FINISHED

    def finish(self, req: Request) -> None:
        self.running.pop(req.slot, None)
        self.arriving.pop(req.slot, None)
        self.backend.release(req.slot)  # waits for a handoff still copying into the slot
        req.status = ReqStatus.FINISHED

    def remove_waiting(self, req: Request) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
