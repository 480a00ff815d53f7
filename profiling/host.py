"""What the engine thread does on the host while it serves (``profile=host``).

The decode benchmark's ``--host-profile`` profiles steps the benchmark drives itself, with a
few requests and no server beside them; a served run's engine thread also admits handoffs
among hundreds of running requests and shares the GIL with the server's event loop. On the
DeepSeek-like preset at its top load the two disagree by about 5x in the engine thread's CPU
time per admitted request, so the served thread is profiled where it runs:

- cProfile on the engine thread over ``active`` decoded steps after ``wait`` of them (the
  collector is entered on that thread and cProfile profiles the enabling thread only), with the
  window's wall time and the thread's CPU time: CPU below wall is time off the CPU (the GIL, a
  sleeping wait), CPU near wall with the GPU idle is the host bounding the step;
- with ``syncs: true`` on a GPU, every CUDA call in the window that synchronizes with the device
  (``torch.cuda.set_sync_debug_mode``), counted per Python call site and thread: such a call on
  the engine thread waits for the step in flight, which overlap scheduling exists to avoid.
  Process-wide while the window is open (a sync on another thread is counted under its name).

Outputs under ``<out>/host/``: ``host_profile.json`` (per-step own and cumulative times of the
``top`` functions, the window's wall and CPU time, the sync sites) and ``host_profile.prof``
(pstats: ``python -m pstats``, snakeviz). cProfile roughly doubles the cost of Python-heavy
code; read the shares, not the absolute times, against an unprofiled run.
"""

from __future__ import annotations

import cProfile
import json
import pstats
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


def _fn_name(key: tuple[str, int, str]) -> str:
    f, line, name = key
    return f"{Path(f).name}:{line}:{name}"


class HostProfile:
    """A window of ``active`` decoded steps after ``wait``; ``step()`` is called by the engine
    thread after each decoded step (profiling.collectors)."""

    def __init__(self, out: Path, *, wait: int, active: int, top: int, syncs: bool):
        if wait < 0 or active < 1 or top < 1:
            raise ValueError(
                f"profile=host needs wait >= 0, active >= 1, top >= 1: {wait}, {active}, {top}"
            )
        self.out, self.wait, self.active, self.top, self.want_syncs = out, wait, active, top, syncs
        self.steps = 0  # decoded steps seen
        self.profiled = 0  # of them inside the window
        self.sessions = 0  # running requests summed over the window's steps
        self.result: dict[str, Any] | None = None
        self._pr: cProfile.Profile | None = None
        self._t0 = (0.0, 0.0)
        self._sync_sites: Counter = Counter()
        self._restore: tuple | None = None
        if wait == 0:
            self._open()

    # ------------------------------------------------------------------ window
    def step(self, sessions: int | None = None) -> None:
        self.steps += 1
        if self._pr is not None:
            self.profiled += 1
            self.sessions += int(sessions or 0)
            if self.profiled >= self.active:
                self._close()
        elif self.result is None and self.steps == self.wait:
            self._open()

    def sample(self) -> dict[str, int]:
        return {"steps": self.steps, "profiled": self.profiled}

    def _open(self) -> None:
        self._t0 = (time.perf_counter(), time.thread_time())
        if self.want_syncs:
            self._watch_syncs()
        self._pr = cProfile.Profile()
        self._pr.enable()

    def _close(self) -> None:
        pr, self._pr = self._pr, None
        if pr is None:
            return
        pr.disable()
        wall = time.perf_counter() - self._t0[0]
        cpu = time.thread_time() - self._t0[1]
        self._unwatch_syncs()
        self.result = self._report(pr, wall, cpu)
        self.out.mkdir(parents=True, exist_ok=True)
        pr.dump_stats(str(self.out / "host_profile.prof"))
        with open(self.out / "host_profile.json", "w") as f:
            json.dump(self.result, f, indent=1)

    def finish(self) -> None:
        """Close a window the run ended inside (its steps so far are reported)."""
        if self._pr is not None and self.profiled:
            self._close()
        elif self._pr is not None:  # opened, nothing decoded since: nothing to report
            self._pr.disable()
            self._pr = None
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
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        self._restore = (prev_mode, shown)

    def _unwatch_syncs(self) -> None:
        if self._restore is None:
            return
        import torch

        prev_mode, shown = self._restore
        self._restore = None
        torch.cuda.set_sync_debug_mode(prev_mode)
        warnings.showwarning = shown
        # the "always" filter goes too: outside the window a sync warns as torch decides
        warnings.filters[:] = [
            f for f in warnings.filters if not (f[1] is not None and SYNC_WARNING in f[1].pattern)
        ]

    # ------------------------------------------------------------------ report
    def _report(self, pr: cProfile.Profile, wall: float, cpu: float) -> dict[str, Any]:
        n = max(1, self.profiled)
        stats = pstats.Stats(pr).stats  # (file, line, name) -> (cc, calls, own, cum, callers)

        def rows(col: int) -> list[dict[str, Any]]:
            ranked = sorted(stats.items(), key=lambda kv: -kv[1][col])[: self.top]
            return [
                {
                    "function": _fn_name(key),
                    "calls_per_step": calls / n,
                    "own_ms_per_step": own / n * 1e3,
                    "cum_ms_per_step": cum / n * 1e3,
                }
                for key, (_, calls, own, cum, _) in ranked
            ]

        syncs = [
            {"thread": thread, "count": count, "per_step": count / n, "stack": list(site)}
            for (thread, site), count in self._sync_sites.most_common()
        ]
        return {
            "steps": self.profiled,
            "after_steps": self.wait,
            "mean_running": self.sessions / n,
            "wall_ms_per_step": wall / n * 1e3,
            "thread_cpu_ms_per_step": cpu / n * 1e3,
            "cpu_share_of_wall": cpu / wall if wall > 0 else None,
            "by_own_time": rows(2),
            "by_cumulative_time": rows(3),
            "syncs_watched": self.want_syncs,
            "syncs_per_step": sum(s["count"] for s in syncs) / n,
            "syncs": syncs,
        }
