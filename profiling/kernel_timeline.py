"""Kernel families of a decode step, from torch.profiler traces (paper Fig. 10 and 11).

Three layers, each usable alone:

1. ``classify(name, ranges)`` -- kernel name (and the profiler ranges its launch was issued in)
   -> family. Cache families: resolver, follower_copy, host_backup, page_bookkeeping (+ handoff);
   model families: expert_mlp_matmul, dense_projection, indexing_attention, other_model. A
   kernel launched inside a ``dhs::*`` range (``profiling.ranges``) inherits the range's family;
   otherwise name patterns decide (``NAME_PATTERNS``).
2. ``partition(intervals, window)`` -- a pure function over ``(start, end, family)`` intervals and
   a step window: the exclusive partition of the window (each family alone, "several families at
   once", "no kernel running"), per-family busy time, summed work, and overlap.
3. ``analyze_trace(trace)`` -- a Chrome trace exported by torch.profiler -> kernel events with
   family and step -> one partition per step and a summary (cache work per step, Fig. 10a;
   shares of the step by family, Fig. 10b / 11a; resolver work as a share of the step, Fig. 11b).

``maybe_profile_kernels(cfg)`` wraps a torch.profiler schedule around a loop (torchtitan style)::

    with maybe_profile_kernels(cfg.profile, out_dir=run_dir) as prof:
        while ...:
            engine.step()
            if prof:
                prof.step()

and writes, per active cycle, the trace, the per-step partition and a summary under
``<out_dir>/kernels/``. On a machine without CUDA the profiler records CPU ops only; the
outermost CPU ops of each thread then stand in for kernels, so the same code path (and the
tests) run on CPU.

Time unit everywhere: microseconds (the Chrome trace's unit); reports add milliseconds.
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import gzip
import json
import math
import os
import re
import threading
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiling import ranges as R

# ---------------------------------------------------------------------------------------------
# 1. classification
# ---------------------------------------------------------------------------------------------

# Ordered: the first pattern that matches (case-insensitive search) decides.
NAME_PATTERNS: list[tuple[str, str]] = [
    # the engine's own Triton kernels first, each where its range puts it in an eager step
    # (in a replayed CUDA graph no range reaches them, and their names match none of the
    # generic patterns below: sparse attention and the index scan had counted as other kernels)
    (r"_resolver_kernel|_copy_grid_kernel|resolver", R.RESOLVER_FAMILY),
    (r"_step_tables_kernel", R.PAGE_BOOKKEEPING),
    (
        r"_sparse_attention|_combine_kernel|_index_scores_kernel|_blend_index_query_kernel|"
        r"_topk_kernel|_ring_attention_kernel",
        R.INDEXING_ATTENTION,
    ),
    (r"_mm_kernel|_merge_kernel", R.DENSE_PROJ),  # the batch-invariant GEMM and its split merge
    (r"_copy_rows_kernel", R.HOST_BACKUP),  # backups, population and imports of whole rows
    # PyTorch's fused attention (the drafter's SDPA): before the GEMM pattern, which its
    # cutlass name would match
    (r"fmha|flash_fwd|flash_attn|attention", R.INDEXING_ATTENTION),
    (r"follower", R.FOLLOWER_COPY),
    # host <-> device transfers: backups (DtoH) and population / handoff reads (HtoD)
    (r"memcpy\s*(dtoh|htod)|device\s*->\s*pinned|pinned\s*->\s*device|pageable", R.HOST_BACKUP),
    # small page-table / slot-state kernels issued by the KV backends
    (r"masked_fill", R.INDEXING_ATTENTION),
    (
        r"index_put|indexput|fillfunctor|fill_kernel|aten::fill_|aten::zero_|memset",
        R.PAGE_BOOKKEEPING,
    ),
    # matrix products (the MLP is told apart from projections only by the dhs::mlp range)
    (
        r"gemm|cutlass|cublas|xmma|nvjet|wgmma|matmul|aten::mm\b|aten::addmm|aten::bmm|"
        r"aten::linear|sm\d+_|ampere_|hopper_",
        R.DENSE_PROJ,
    ),
    # indexer and sparse attention: scores, top-k, softmax, gathers of selected rows
    (
        r"topk|sort|radix|softmax|einsum|gather|index_select|index_elementwise|indexing|"
        r"aten::index\b|aten::where|bitonic|scatter",
        R.INDEXING_ATTENTION,
    ),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), fam) for p, fam in NAME_PATTERNS]


def classify_name(name: str) -> str:
    """Family of a kernel from its name alone (the fallback when no range encloses it)."""
    for pat, fam in _COMPILED:
        if pat.search(name):
            return fam
    return R.OTHER_MODEL


def family_from_ranges(ranges: Sequence[str]) -> str | None:
    """Family given by the enclosing ranges (outermost first), or None when none is a family
    range. The innermost family range decides unless an outer one has a higher priority."""
    best, best_key = None, None
    for depth, name in enumerate(ranges):
        fam = R.RANGE_FAMILY.get(name)
        if fam is None:
            continue
        key = (R.RANGE_PRIORITY.get(name, 0), depth)
        if best_key is None or key > best_key:
            best, best_key = fam, key
    return best


def classify(name: str, ranges: Sequence[str] = ()) -> str:
    return family_from_ranges(ranges) or classify_name(name)


def is_cache_family(fam: str) -> bool:
    return fam in R.CACHE_FAMILIES


# ---------------------------------------------------------------------------------------------
# 2. the exclusive partition of a window (pure)
# ---------------------------------------------------------------------------------------------

SEVERAL = "several_families"
IDLE = "no_kernel"


@dataclass
class Partition:
    """Exclusive partition of ``window``: sum(alone) + several + idle == window length.

    alone[f]       time in which family f is the only family with a kernel running
    several        time in which kernels of two or more families run
    idle           time in which no kernel runs
    busy[f]        time in which f runs at all (union of its intervals)
    work[f]        summed kernel durations of f inside the window (overlapping kernels of one
                   family count twice: that is "kernel work", Fig. 10a)
    overlapped[f]  time in which f runs together with another family
    cache_under_model  time in which some cache family and some model family both run
    count[f]       number of intervals of f that intersect the window
    """

    window: tuple[float, float]
    alone: dict[str, float] = field(default_factory=dict)
    several: float = 0.0
    idle: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)
    overlapped: dict[str, float] = field(default_factory=dict)
    cache_under_model: float = 0.0
    count: dict[str, int] = field(default_factory=dict)

    @property
    def length(self) -> float:
        return self.window[1] - self.window[0]

    def shares(self) -> dict[str, float]:
        """Fractions of the window: every family alone, several, idle (they sum to 1)."""
        L = self.length
        if L <= 0:
            return {}
        out = {f: v / L for f, v in self.alone.items()}
        out[SEVERAL] = self.several / L
        out[IDLE] = self.idle / L
        return out

    def cache_work(self) -> float:
        return sum(v for f, v in self.work.items() if is_cache_family(f))


def partition(
    intervals: Iterable[tuple[float, float, str]], window: tuple[float, float]
) -> Partition:
    """Exclusive partition of ``window`` = (t0, t1) by the families of ``intervals``.

    Intervals are clipped to the window; an interval that does not intersect it (or has zero
    length after clipping) is ignored. ``end < start`` is an error."""
    t0, t1 = float(window[0]), float(window[1])
    if t1 < t0:
        raise ValueError(f"window ends before it starts: {window}")
    part = Partition(window=(t0, t1))
    bounds: list[tuple[float, int, str]] = []
    for s, e, fam in intervals:
        s, e = float(s), float(e)
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e}, {fam!r})")
        cs, ce = max(s, t0), min(e, t1)
        if ce <= cs:
            continue
        part.work[fam] = part.work.get(fam, 0.0) + (ce - cs)
        part.count[fam] = part.count.get(fam, 0) + 1
        bounds.append((cs, 1, fam))
        bounds.append((ce, -1, fam))
    for fam in part.work:
        part.alone.setdefault(fam, 0.0)
        part.busy.setdefault(fam, 0.0)
        part.overlapped.setdefault(fam, 0.0)
    bounds.sort(key=lambda b: b[0])
    active: dict[str, int] = defaultdict(int)
    prev = t0
    i, n = 0, len(bounds)
    while True:
        nxt = bounds[i][0] if i < n else t1
        seg = nxt - prev
        if seg > 0:
            fams = [f for f, c in active.items() if c > 0]
            if not fams:
                part.idle += seg
            elif len(fams) == 1:
                part.alone[fams[0]] += seg
                part.busy[fams[0]] += seg
            else:
                part.several += seg
                for f in fams:
                    part.busy[f] += seg
                    part.overlapped[f] += seg
                if any(is_cache_family(f) for f in fams) and any(
                    not is_cache_family(f) for f in fams
                ):
                    part.cache_under_model += seg
        if i >= n:
            break
        prev = nxt
        while i < n and bounds[i][0] == nxt:  # apply every boundary at this instant
            _, d, fam = bounds[i]
            active[fam] += d
            i += 1
    return part


# ---------------------------------------------------------------------------------------------
# 3. traces -> kernel events -> steps
# ---------------------------------------------------------------------------------------------

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
RANGE_CATS = {"user_annotation"}


@dataclass
class KernelEvent:
    name: str
    start: float  # us
    end: float  # us
    family: str
    step: int | None  # index of the step range its launch was issued in
    ranges: tuple[str, ...] = ()
    kind: str = "kernel"  # kernel | gpu_memcpy | gpu_memset | cpu_op
    lane: Any = None  # stream (device) or thread (cpu)

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class _Range:
    name: str
    start: float
    end: float
    idx: int  # step number when the range is a step range, else -1


def load_trace(trace: str | os.PathLike | Mapping) -> dict:
    """A Chrome trace as a dict (from a dict, a .json file or a .json.gz file)."""
    if isinstance(trace, Mapping):
        return dict(trace)
    p = str(trace)
    opener = gzip.open if p.endswith(".gz") else open
    with opener(p, "rt") as f:
        return json.load(f)


def _events(trace: Mapping) -> list[dict]:
    evs = trace.get("traceEvents", trace) if isinstance(trace, Mapping) else trace
    return [e for e in evs if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def _cat(e: dict) -> str:
    return str(e.get("cat", "")).lower()


def _is_range(e: dict) -> bool:
    """A CPU-side range (record_function). Its GPU-side shadow (gpu_user_annotation) is not."""
    cat = _cat(e)
    if cat in DEVICE_CATS or cat.startswith("gpu_"):
        return False
    name = str(e.get("name", ""))
    return cat in RANGE_CATS or name.startswith(R.PREFIX) or name.startswith("ProfilerStep#")


class _Enclosing:
    """Which ranges of one thread enclose a time: ranges on a thread nest (record_function is
    LIFO per thread), so a sweep with a stack answers sorted queries in O(n log n)."""

    def __init__(self, rngs: list[_Range]):
        self.rngs = sorted(rngs, key=lambda r: (r.start, -(r.end - r.start)))

    def query_sorted(self, times: list[float]) -> list[list[_Range]]:
        out, stack, ri = [], [], 0
        rngs = self.rngs
        for t in times:
            while ri < len(rngs) and rngs[ri].start <= t:
                r = rngs[ri]
                ri += 1
                while stack and stack[-1].end <= r.start:
                    stack.pop()
                stack.append(r)
            while stack and stack[-1].end <= t:
                stack.pop()
            out.append([r for r in stack if r.start <= t < r.end])
        return out


def _step_matcher(step_range: str | None, names: set[str]):
    """The predicate that picks step ranges: ``step_range`` when the trace has it, else the
    profiler's own ``ProfilerStep#N`` ranges."""
    if step_range and any(n == step_range for n in names):
        return lambda n: n == step_range
    return lambda n: n.startswith("ProfilerStep#")


def kernel_events(
    trace: str | os.PathLike | Mapping, step_range: str | None = R.STEP, mode: str = "auto"
) -> list[KernelEvent]:
    """Kernel events of a torch.profiler Chrome trace, each with its family and step.

    mode ``device``: GPU kernels, memcpys and memsets; the ranges enclosing each one are those
    open on the CPU thread at its launch (matched through the CUPTI correlation id).
    mode ``cpu``: no device events (a CPU-only run); the outermost CPU ops of each thread stand
    in for kernels. ``auto`` picks ``device`` when the trace has device events.
    """
    evs = _events(load_trace(trace))
    device = [e for e in evs if _cat(e) in DEVICE_CATS]
    if mode == "auto":
        mode = "device" if device else "cpu"
    ranges_by_thread: dict[Any, list[_Range]] = defaultdict(list)
    rng_events = sorted((e for e in evs if _is_range(e)), key=lambda e: float(e["ts"]))
    is_step = _step_matcher(step_range, {str(e["name"]) for e in rng_events})
    n_steps = 0
    for e in rng_events:
        name = str(e["name"])
        s = float(e["ts"])
        idx = -1
        if is_step(name):  # steps are numbered in start order, over every thread
            idx, n_steps = n_steps, n_steps + 1
        ranges_by_thread[(e.get("pid"), e.get("tid"))].append(
            _Range(name, s, s + float(e["dur"]), idx)
        )

    # (thread, time) at which each kernel was issued
    issued: list[tuple[Any, float, dict]] = []
    if mode == "device":
        launch = {}
        for e in evs:
            if _cat(e) in LAUNCH_CATS:
                c = (e.get("args") or {}).get("correlation")
                if c is not None:
                    launch[c] = ((e.get("pid"), e.get("tid")), float(e["ts"]))
        for e in device:
            c = (e.get("args") or {}).get("correlation")
            thr, t = launch.get(c, (None, float(e["ts"])))
            issued.append((thr, t, e))
    else:
        ops_by_thread: dict[Any, list[dict]] = defaultdict(list)
        for e in evs:
            if _cat(e) == "cpu_op" and not _is_range(e):
                ops_by_thread[(e.get("pid"), e.get("tid"))].append(e)
        for thr, ops in ops_by_thread.items():
            ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
            end = -math.inf
            for e in ops:  # keep the outermost ops: children run inside their parent
                s = float(e["ts"])
                if s >= end:
                    issued.append((thr, s, e))
                    end = s + float(e["dur"])
                else:  # nested in the kept op (or overlapping it by rounding)
                    end = max(end, s + float(e["dur"]))

    by_thread: dict[Any, list[int]] = defaultdict(list)
    for i, (thr, _t, _) in enumerate(issued):
        by_thread[thr].append(i)
    encl: list[list[_Range]] = [[] for _ in issued]
    for thr, idxs in by_thread.items():
        if thr is None or thr not in ranges_by_thread:
            continue
        idxs.sort(key=lambda i: issued[i][1])
        res = _Enclosing(ranges_by_thread[thr]).query_sorted([issued[i][1] for i in idxs])
        for i, r in zip(idxs, res):
            encl[i] = r

    out = []
    for (thr, _, e), rs in zip(issued, encl):
        names = tuple(r.name for r in rs)
        fam_ranges = tuple(n for n in names if n.startswith(R.PREFIX))
        step = None
        for r in rs:  # outermost first: the innermost step range wins
            if r.idx >= 0:
                step = r.idx
        s = float(e["ts"])
        lane = (e.get("args") or {}).get("stream", e.get("tid")) if mode == "device" else thr
        out.append(
            KernelEvent(
                name=str(e["name"]),
                start=s,
                end=s + float(e["dur"]),
                family=classify(str(e["name"]), fam_ranges),
                step=step,
                ranges=fam_ranges,
                kind=_cat(e) if mode == "device" else "cpu_op",
                lane=lane,
            )
        )
    out.sort(key=lambda k: k.start)
    return out


def step_windows(
    events: Sequence[KernelEvent], mode: str = "kernels"
) -> dict[int, tuple[float, float]]:
    """Window of each step. ``kernels``: from the first kernel of the step to the end of its
    last one. ``period``: from the first kernel of the step to the first kernel of the next
    step (the gap between steps counts as "no kernel running"); the last step, whose gap to a
    next step is unknown, is left out (a lone step keeps its kernels' span): ending it at its
    last kernel would take its gap out of the mean."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for k in events:
        if k.step is None:
            continue
        first[k.step] = min(first.get(k.step, math.inf), k.start)
        last[k.step] = max(last.get(k.step, -math.inf), k.end)
    steps = sorted(first)
    if mode == "kernels":
        return {s: (first[s], last[s]) for s in steps}
    if mode == "period":
        if len(steps) == 1:
            return {steps[0]: (first[steps[0]], last[steps[0]])}
        return {a: (first[a], first[b]) for a, b in zip(steps, steps[1:])}
    raise ValueError(f"window mode must be 'kernels' or 'period', got {mode!r}")


@dataclass
class TimelineReport:
    steps: list[dict]  # one row per step (partition in us)
    summary: dict  # means over steps
    events: list[KernelEvent] = field(default_factory=list, repr=False)


def _step_row(step: int, part: Partition, events: list[KernelEvent]) -> dict:
    L = part.length
    row: dict[str, Any] = {
        "step": step,
        "t0_us": part.window[0],
        "t1_us": part.window[1],
        "dur_us": L,
        "idle_us": part.idle,
        "several_us": part.several,
        "cache_under_model_us": part.cache_under_model,
        "cache_work_us": part.cache_work(),
    }
    for f in R.FAMILIES:
        row[f"alone_{f}_us"] = part.alone.get(f, 0.0)
        row[f"work_{f}_us"] = part.work.get(f, 0.0)
        row[f"busy_{f}_us"] = part.busy.get(f, 0.0)
        row[f"count_{f}"] = part.count.get(f, 0)
    # kernel work attributed to the step by launch (may extend past the window in period mode)
    own = [k for k in events if k.step == step]
    row["launched_kernels"] = len(own)
    row["resolver_calls"] = sum(1 for k in own if k.family == R.RESOLVER_FAMILY)
    row["resolver_share"] = part.work.get(R.RESOLVER_FAMILY, 0.0) / L if L > 0 else 0.0
    return row


def summarize(rows: Sequence[dict]) -> dict:
    """Means over steps: times in ms, shares of the mean step in %, Fig. 10 / 11 quantities."""
    if not rows:
        return {"num_steps": 0}
    n = len(rows)

    def mean(key):
        return sum(r[key] for r in rows) / n

    dur = mean("dur_us")
    s: dict[str, Any] = {
        "num_steps": n,
        "step_ms": dur / 1e3,
        "idle_ms": mean("idle_us") / 1e3,
        "several_ms": mean("several_us") / 1e3,
        "cache_work_ms": mean("cache_work_us") / 1e3,
        "cache_under_model_ms": mean("cache_under_model_us") / 1e3,
        "resolver_share_pct_mean": 100 * mean("resolver_share"),
    }
    shares = {}
    for f in R.FAMILIES:
        s[f"alone_{f}_ms"] = mean(f"alone_{f}_us") / 1e3
        s[f"work_{f}_ms"] = mean(f"work_{f}_us") / 1e3
        s[f"count_{f}"] = mean(f"count_{f}")
        shares[f] = 100 * mean(f"alone_{f}_us") / dur if dur > 0 else 0.0
    shares[SEVERAL] = 100 * mean("several_us") / dur if dur > 0 else 0.0
    shares[IDLE] = 100 * mean("idle_us") / dur if dur > 0 else 0.0
    s["share_of_step_pct"] = shares  # Fig. 10b / 11a: each family alone, several, none
    cache_alone = sum(mean(f"alone_{f}_us") for f in R.CACHE_FAMILIES)
    s["cache_alone_pct"] = 100 * cache_alone / dur if dur > 0 else 0.0
    return s


def analyze_trace(
    trace: str | os.PathLike | Mapping,
    step_range: str | None = R.STEP,
    window: str = "kernels",
    mode: str = "auto",
) -> TimelineReport:
    events = kernel_events(trace, step_range=step_range, mode=mode)
    wins = step_windows(events, window)
    rows = []
    starts = [k.start for k in events]
    max_dur = max((k.dur for k in events), default=0.0)
    for st, (t0, t1) in wins.items():
        # candidates: kernels that start before t1 and end after t0
        lo = bisect.bisect_left(starts, t0 - max_dur)
        hi = bisect.bisect_right(starts, t1)
        cand = [(k.start, k.end, k.family) for k in events[lo:hi] if k.end > t0]
        rows.append(_step_row(st, partition(cand, (t0, t1)), events))
    return TimelineReport(steps=rows, summary=summarize(rows), events=events)


# ---------------------------------------------------------------------------------------------
# 4. the profiler around a loop
# ---------------------------------------------------------------------------------------------


def _opt(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        v = cfg.get(key, default)
    elif hasattr(cfg, "get"):
        try:
            v = cfg.get(key, default)
        except Exception:
            v = getattr(cfg, key, default)
    else:
        v = getattr(cfg, key, default)
    return default if v is None else v


def write_rows_csv(rows: Sequence[Mapping], path: Path, append: bool = False) -> None:
    if not rows:
        return
    keys = list(rows[0].keys())
    new = not (append and path.exists())
    with open(path, "a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


def _recording(prof) -> bool:
    from torch.profiler import ProfilerAction

    return getattr(prof, "current_action", None) in (
        ProfilerAction.RECORD,
        ProfilerAction.RECORD_AND_SAVE,
    )


class KernelTimeline:
    """What ``maybe_profile_kernels`` yields: call ``step()`` once per engine step that
    decoded. ``reports`` collects one TimelineReport per active profiler cycle."""

    name = "kernels"

    def __init__(
        self,
        out_dir: Path,
        step_range: str,
        window: str,
        keep_trace: bool,
        gzip_trace: bool,
        write_events: bool,
    ):
        self.out_dir = out_dir
        self.step_range = step_range
        self.window = window
        self.keep_trace = keep_trace
        self.gzip_trace = gzip_trace
        self.write_events = write_events
        self.reports: list[TimelineReport] = []
        self.prof = None
        self.outputs: list[Path] = []
        self._sessions: list[int] = []
        self._thread: int | None = threading.get_ident()

    def step(self, sessions: int | None = None) -> None:
        """After each engine step that decoded; ``sessions``: requests in that step's batch
        (reported as ``sessions_per_step``, Fig. 10a's per-session cost)."""
        if self.prof is None:
            return
        if self._thread is not None and threading.get_ident() != self._thread:
            self._thread = None  # warn once
            warnings.warn(
                "profiling.kernel_timeline: step() called from another thread than "
                "the one that entered maybe_profile; torch.profiler records ranges and "
                "CPU ops of the entering thread only, so enter it in the engine thread",
                RuntimeWarning,
                stacklevel=2,
            )
        if sessions is not None and _recording(self.prof):
            self._sessions.append(int(sessions))
        self.prof.step()

    def sample(self) -> None:  # uniform collector interface
        pass

    def on_trace_ready(self, prof) -> None:
        n = len(self.reports)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        suffix = ".json.gz" if self.gzip_trace else ".json"
        path = self.out_dir / f"trace_{n}{suffix}"
        prof.export_chrome_trace(str(path))
        rep = analyze_trace(path, step_range=self.step_range, window=self.window)
        if self._sessions:
            rep.summary["sessions_per_step"] = sum(self._sessions) / len(self._sessions)
        self._sessions = []
        self.reports.append(rep)
        for r in rep.steps:
            r["cycle"] = n
        write_rows_csv(rep.steps, self.out_dir / "kernel_steps.csv", append=n > 0)
        if self.write_events:
            write_rows_csv(
                [
                    {
                        "cycle": n,
                        "name": k.name,
                        "family": k.family,
                        "step": k.step,
                        "start_us": k.start,
                        "dur_us": k.dur,
                        "kind": k.kind,
                        "lane": k.lane,
                        "ranges": "|".join(k.ranges),
                    }
                    for k in rep.events
                ],
                self.out_dir / "kernel_events.csv",
                append=n > 0,
            )
        with open(self.out_dir / "kernel_summary.json", "w") as f:
            json.dump(
                {
                    "cycles": [r.summary for r in self.reports],
                    "window": self.window,
                    "step_range": self.step_range,
                },
                f,
                indent=1,
            )
        if not self.keep_trace:
            path.unlink(missing_ok=True)
        else:
            self.outputs.append(path)

    @property
    def summary(self) -> dict:
        """Summary over every profiled step of every cycle."""
        rows = [r for rep in self.reports for r in rep.steps]
        out = summarize(rows)
        ses = [
            rep.summary["sessions_per_step"]
            for rep in self.reports
            if "sessions_per_step" in rep.summary
        ]
        if ses:
            out["sessions_per_step"] = sum(ses) / len(ses)
        return out


@contextlib.contextmanager
def maybe_profile_kernels(
    cfg: Any,
    out_dir: str | os.PathLike | None = None,
) -> Iterator[KernelTimeline | None]:
    """torch.profiler over a loop when ``cfg.name == "kernels"`` (or ``cfg.enabled``); yields
    None otherwise. Options (conf/profile/kernels.yaml): wait, warmup, active, repeat,
    output_dir, step_range, window, keep_trace, gzip_trace, write_events, record_shapes."""
    name = _opt(cfg, "name", "none")
    if cfg is None or (name != "kernels" and not _opt(cfg, "enabled", False)):
        yield None
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(out_dir or _opt(cfg, "output_dir", "outputs/profile")) / "kernels"
    tl = KernelTimeline(
        out,
        step_range=str(_opt(cfg, "step_range", R.STEP)),
        window=str(_opt(cfg, "window", "kernels")),
        keep_trace=bool(_opt(cfg, "keep_trace", True)),
        gzip_trace=bool(_opt(cfg, "gzip_trace", True)),
        write_events=bool(_opt(cfg, "write_events", False)),
    )
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    sched = schedule(
        wait=int(_opt(cfg, "wait", 1)),
        warmup=int(_opt(cfg, "warmup", 1)),
        active=int(_opt(cfg, "active", 3)),
        repeat=int(_opt(cfg, "repeat", 1)),
    )
    prev = R.enable_ranges(True)
    try:
        with profile(
            activities=acts,
            schedule=sched,
            on_trace_ready=tl.on_trace_ready,
            record_shapes=bool(_opt(cfg, "record_shapes", False)),
            with_stack=False,
        ) as prof:
            tl.prof = prof
            yield tl
    finally:
        tl.prof = None
        R.enable_ranges(prev)
