"""What the server's threads do on the host while it serves (``profile=host``).

The decode benchmark's ``--host-profile`` profiles steps the benchmark drives itself, with a
few requests and no server beside them; a served run's engine thread also admits handoffs
among hundreds of running requests, and shares the GIL with the server's event loop where it is a
thread of the server (``server.engine_process=false``; otherwise the engine's process is the one
profiled, its main thread receiving the server's messages). So the served engine is profiled
where it runs, over ``active`` decoded steps after ``wait``:

- a sampler thread reads every thread's Python stack each ``interval_ms``
  (``sys._current_frames``) and counts, per thread, the function each sample is in (*own*)
  and every function on its stack (*cumulative*), as wall time per decoded step. A sample
  stands for the wall time since the previous one: a thread waiting for the GIL or for the
  device is counted where it waits (Event.synchronize, a tensor's read). The sampler needs the
  GIL too, so a thread running Python is sampled late, at most once per switch interval
  (Python's 5 ms): even with that weighting, busy code reads low (a thread spinning half its
  time: ~36 %); ``switch_interval_ms`` (e.g. 0.2) sets the process's interval for the window
  (~49 % then), at the price of a GIL regime other than the served one. A deterministic
  profiler cannot do this here: Python 3.12's cProfile records every thread on one call stack
  (sys.monitoring), which mixes the event loop's calls into the engine's;
- the engine thread's CPU time over the window beside its wall time (``cpu_share_of_wall``
  below 1: the thread was off the CPU, waiting for the GIL or sleeping);
- with ``syncs: true`` on a GPU, every CUDA call in the window that synchronizes with the device
  (``torch.cuda.set_sync_debug_mode``), counted per Python call site and thread: such a call on
  the engine thread waits for the step in flight, which overlap scheduling exists to avoid.

Outputs under ``<out>/host/``: ``host_profile.json`` and, per thread, ``<thread>.folded``
(collapsed stacks, one ``frame;frame;... microseconds`` line each: flamegraph.pl, speedscope).
Sampling costs the process one short GIL hold per interval (~2 % at 1 ms).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

# the prefix of the warning torch.cuda.set_sync_debug_mode("warn") issues (c10/cuda)
SYNC_WARNING = "called a synchronizing CUDA operation"
_STACK_FRAMES = 8  # call-site frames kept per sync, innermost last
_MAX_DEPTH = 96  # frames kept per sample, outermost dropped first


def _frame_name(code, lineno: int | None = None) -> str:
    where = f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"
    return where if lineno is None else f"{where}@{lineno}"


class _Sampler(threading.Thread):
    """Samples every other thread's Python stack each ``interval_s`` until stopped.

    Each sample is weighted by the time since the previous one: the sampler needs the GIL to
    take a sample, so a thread running Python holds it off for up to the switch interval while
    a thread in a wait that released the GIL (a synchronize, a select) is sampled on time, and
    samples counted alike would over-weight waits."""

    def __init__(self, interval_s: float):
        super().__init__(name="dhs-host-sampler", daemon=True)
        self.interval_s = interval_s
        # thread id -> Counter of stacks (outermost first) -> seconds they stand for
        self.stacks: dict[int, Counter] = {}
        self.samples = 0
        self.seconds = 0.0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self._stop_evt.wait(self.interval_s):
            now = time.perf_counter()
            dt, last = now - last, now
            self.samples += 1
            self.seconds += dt
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = []
                f = frame
                while f is not None and len(stack) < _MAX_DEPTH:
                    stack.append((f.f_code, f.f_lineno))
                    f = f.f_back
                self.stacks.setdefault(tid, Counter())[tuple(reversed(stack))] += dt
            frame = f = None  # no thread's frame (and its locals) kept alive between samples

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()


class HostProfile:
    """A window of ``active`` decoded steps after ``wait``; ``step()`` is called by the engine
    thread after each decoded step (profiling.collectors), which also makes it the thread whose
    CPU time is reported."""

    def __init__(
        self,
        out: Path,
        *,
        wait: int,
        active: int,
        top: int,
        syncs: bool,
        interval_ms: float = 1.0,
        switch_interval_ms: float | None = None,
    ):
        if wait < 0 or active < 1 or top < 1 or interval_ms <= 0:
            raise ValueError(
                "profile=host needs wait >= 0, active >= 1, top >= 1, interval_ms > 0: "
                f"{wait}, {active}, {top}, {interval_ms}"
            )
        self.out, self.wait, self.active, self.top = out, wait, active, top
        self.want_syncs, self.interval_s = syncs, interval_ms / 1e3
        self.switch_interval_s = None if switch_interval_ms is None else switch_interval_ms / 1e3
        self._switch_before: float | None = None
        self.steps = 0  # decoded steps seen
        self.profiled = 0  # of them inside the window
        self.sessions = 0  # running requests summed over the window's steps
        self.result: dict[str, Any] | None = None
        self._sampler: _Sampler | None = None
        self._t0 = (0.0, 0.0)
        self._engine_tid = threading.get_ident()
        self._sync_sites: Counter = Counter()
        self._restore: tuple | None = None
        if wait == 0:
            self._open()

    # ------------------------------------------------------------------ window
    def step(self, sessions: int | None = None) -> None:
        self.steps += 1
        if self._sampler is not None:
            self.profiled += 1
            self.sessions += int(sessions or 0)
            if self.profiled >= self.active:
                self._close()
        elif self.result is None and self.steps == self.wait:
            self._open()

    def sample(self) -> dict[str, int]:
        return {"steps": self.steps, "profiled": self.profiled}

    def _open(self) -> None:
        self._engine_tid = threading.get_ident()
        self._t0 = (time.perf_counter(), time.thread_time())
        if self.want_syncs:
            self._watch_syncs()
        if self.switch_interval_s is not None:
            self._switch_before = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval_s)
        self._sampler = _Sampler(self.interval_s)
        self._sampler.start()

    def _stop_sampler(self) -> _Sampler | None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()
        if self._switch_before is not None:
            sys.setswitchinterval(self._switch_before)
            self._switch_before = None
        return sampler

    def _close(self) -> None:
        sampler = self._stop_sampler()
        if sampler is None:
            return
        wall = time.perf_counter() - self._t0[0]
        cpu = time.thread_time() - self._t0[1]
        self._unwatch_syncs()
        self.out.mkdir(parents=True, exist_ok=True)
        self.result = self._report(sampler, wall, cpu)
        with open(self.out / "host_profile.json", "w") as f:
            json.dump(self.result, f, indent=1)

    def finish(self) -> None:
        """Close a window the run ended inside (its steps so far are reported)."""
        if self._sampler is not None and self.profiled:
            self._close()
        elif self._sampler is not None:  # opened, nothing decoded since: nothing to report
            self._stop_sampler()
            self._unwatch_syncs()

    # ------------------------------------------------------------------ syncs
    def _watch_syncs(self) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        sites = self._sync_sites
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING not in str(message):
                return shown(message, category, filename, lineno, file, line)
            frames = [
                fr
                for fr in traceback.extract_stack()[:-1]
                if not fr.filename.endswith("warnings.py")
            ][-_STACK_FRAMES:]
            site = tuple(f"{Path(fr.filename).name}:{fr.lineno}:{fr.name}" for fr in frames)
            sites[(threading.current_thread().name, site)] += 1

        prev_mode = torch.cuda.get_sync_debug_mode()
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
        self._restore = (prev_mode, shown, warnings.filters[0])  # before anything can fail
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")

    def _unwatch_syncs(self) -> None:
        if self._restore is None:
            return
        import torch

        prev_mode, shown, added = self._restore
        self._restore = None
        torch.cuda.set_sync_debug_mode(prev_mode)
        warnings.showwarning = shown
        # the "always" filter goes too (that one, not another's): outside the window a sync
        # warns as torch decides
        if added in warnings.filters:
            warnings.filters.remove(added)
            warnings._filters_mutated()

    # ------------------------------------------------------------------ report
    def _thread_report(self, name: str, stacks: Counter) -> dict[str, Any]:
        n = max(1, self.profiled)
        own: Counter = Counter()  # innermost function and line
        cum: Counter = Counter()  # every function on the stack, once per sample
        for stack, count in stacks.items():
            if not stack:
                continue
            code, line = stack[-1]
            own[_frame_name(code, line)] += count
            for fn in {_frame_name(c) for c, _ in stack}:
                cum[fn] += count

        def rows(counter: Counter) -> list[dict[str, Any]]:
            return [
                {"function": fn, "ms_per_step": sec * 1e3 / n, "share": sec / total}
                for fn, sec in counter.most_common(self.top)
            ]

        total = sum(stacks.values()) or 1.0
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        with open(self.out / f"{safe}.folded", "w") as f:  # weights in microseconds
            for stack, sec in stacks.most_common():
                f.write(";".join(_frame_name(c) for c, _ in stack) + f" {round(sec * 1e6)}\n")
        return {
            "thread": name,
            "sampled_ms_per_step": total * 1e3 / n,
            "by_own_time": rows(own),
            "by_cumulative_time": rows(cum),
            "folded": f"{safe}.folded",
        }

    def _report(self, sampler: _Sampler, wall: float, cpu: float) -> dict[str, Any]:
        n = max(1, self.profiled)
        names = {t.ident: t.name for t in threading.enumerate()}
        threads = []
        for tid, stacks in sampler.stacks.items():
            name = "engine" if tid == self._engine_tid else names.get(tid, f"thread-{tid}")
            threads.append(self._thread_report(name, stacks))
        threads.sort(key=lambda t: (t["thread"] != "engine", -t["sampled_ms_per_step"]))
        syncs = [
            {"thread": thread, "count": count, "per_step": count / n, "stack": list(site)}
            for (thread, site), count in self._sync_sites.most_common()
        ]
        return {
            "steps": self.profiled,
            "after_steps": self.wait,
            "mean_running": self.sessions / n,
            "wall_ms_per_step": wall / n * 1e3,
            "engine_cpu_ms_per_step": cpu / n * 1e3,
            "cpu_share_of_wall": cpu / wall if wall > 0 else None,
            "samples": sampler.samples,
            "sample_interval_ms": sampler.seconds * 1e3 / max(1, sampler.samples),
            "switch_interval_ms": (
                None if self.switch_interval_s is None else self.switch_interval_s * 1e3
            ),
            "threads": threads,
            # the server's event loop (uvloop polls and writes in C), and whether it ran in this
            # process, where MainThread's samples are of it, or the engine ran in its own
            # (server.engine_process), where MainThread only receives the server's messages
            **_serving_loop(),
            "syncs_watched": self.want_syncs,
            "syncs_per_step": sum(s["count"] for s in syncs) / n,
            "syncs": syncs,
        }


def _serving_loop() -> dict[str, Any]:
    ep = sys.modules.get("systems.engine.engine_process")
    if ep is not None and ep.SERVER_LOOP is not None:
        return {"event_loop": ep.SERVER_LOOP, "engine_process": True}
    server = sys.modules.get("systems.engine.server")
    return {"event_loop": getattr(server, "SERVING_LOOP", None), "engine_process": False}
