"""Finished runs as the figures and the harness's summaries read them: ``results/<experiment>/
<run-id>/`` with summary.json, config.yaml, env.json, records.jsonl[.xz] and
server_metrics.parquet; which runs a figure plots (one output cap, repeats of one config folded
into their median); the counters read from the server samples (step cost, engine time split,
shares); kernel profiles in one shape; and the run records (commit, run group, first run of a
fresh machine, measurement-changing commits).

Tolerant throughout: a missing or unreadable file is ``None`` / ``[]`` with a warning on stderr.
Nothing here touches a GPU. The figure scripts import this module; it imports nothing from them.

Conventions of the results files (see docs/figures.md): shares are fractions in [0, 1]
(``host_fetched_share``, ``dhs_ready_optional_coverage``), times follow their key suffix
(``_ms``, ``_s``, ``_us``), per-GPU output is ``output_tok_s_per_gpu``.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.environment import REPO
from harness.records import read_jsonl

DEFAULT_RESULTS = REPO / "results"
# the note a run directory keeps where harness.compact --prune-unused removed a file
PRUNED_NOTE = "RECORDS_PRUNED.txt"


@dataclass
class ReadLog:
    """What the figures read while ``start_read_log()`` is on (``figures.make_all --inputs``):
    the experiment directories they listed, the request-record and server-sample files they
    opened, and the runs at a newer output cap that a figure will plot once their sweep is
    complete. harness.compact --prune-unused keeps exactly these."""

    experiments: set[Path] = field(default_factory=set)
    files: set[Path] = field(default_factory=set)
    waiting: set[Path] = field(default_factory=set)

    def as_json(self, root: Path) -> dict[str, list[str]]:
        """Sorted paths relative to ``root`` (the results directory)."""
        rel = lambda ps: sorted(str(p.relative_to(root.resolve())) for p in ps)  # noqa: E731
        return {k: rel(getattr(self, k)) for k in ("experiments", "files", "waiting")}


_read_log: ReadLog | None = None


def start_read_log() -> ReadLog:
    """Record from now on what the figures read; returns the live log."""
    global _read_log
    _read_log = ReadLog()
    return _read_log


def _log(kind: str, paths: Iterable[Path]) -> None:
    if _read_log is not None:
        getattr(_read_log, kind).update(p.resolve() for p in paths)


def _pruned(run_dir: Path, name: str) -> None:
    """Say on stderr where to restore ``name`` from if harness.compact pruned it."""
    note = run_dir / PRUNED_NOTE
    text = note.read_text() if note.is_file() else ""
    lines = [line for line in text.splitlines() if line.startswith(name)]
    if lines:
        print(f"[results] {run_dir.name}: {name} was pruned; {lines[-1]}", file=sys.stderr)


SYSTEM_ORDER = (
    "resident",
    "hisparse",
    "adaptive_hisparse",
    "resident_dflash2",
    "resident_dspark",
    "adaptive_dhisparse",
)


SPECULATIVE = {"resident_dflash2", "resident_dspark", "adaptive_dhisparse"}


def canonical_system(name: str | None) -> str:
    """Harness system name -> the paper's system key (drafter suffixes folded)."""
    n = (name or "").lower()
    if n.startswith("adaptive_dhisparse"):
        return "adaptive_dhisparse"
    if n.startswith("resident") and "dspark" in n:
        return "resident_dspark"
    if n.startswith("resident") and ("dflash" in n or "drafter" in n):
        return "resident_dflash2"
    return n


def system_sort_key(name: str) -> int:
    c = canonical_system(name)
    return SYSTEM_ORDER.index(c) if c in SYSTEM_ORDER else len(SYSTEM_ORDER)


def load_json(path: str | Path) -> dict | None:
    """A JSON document, or None when the file is missing or unreadable (warned on stderr)."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        print(f"[results] warning: cannot read {p}: {e}", file=sys.stderr)
        return None


def load_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        import yaml

        return yaml.safe_load(path.read_text()) or {}
    except Exception as e:  # noqa: BLE001 - tolerate anything a half-written file does
        print(f"[results] warning: cannot read {path}: {e}", file=sys.stderr)
        return {}


def find_key(d: Any, *names: str) -> Any:
    """First value of any key in ``names`` found anywhere in a nested dict/list (depth-first)."""
    if isinstance(d, Mapping):
        for n in names:
            if n in d and not isinstance(d[n], Mapping):
                return d[n]
        for v in d.values():
            r = find_key(v, *names)
            if r is not None:
                return r
    elif isinstance(d, list):
        for v in d:
            r = find_key(v, *names)
            if r is not None:
                return r
    return None


@lru_cache(maxsize=512)
def _read_metrics(path: str, mtime_ns: int) -> pd.DataFrame | None:
    """server_metrics.parquet sorted by ts; cached per file version (make_all reads the same runs
    from several scripts). Callers must not modify the frame in place."""
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001
        print(f"[results] warning: cannot read {path}: {e}", file=sys.stderr)
        return None
    if "ts" in df.columns:
        df = df.sort_values("ts").reset_index(drop=True)
    return df


@dataclass
class Run:
    """One finished run: ``results/<experiment>/<run-id>/`` with a summary.json."""

    path: Path
    summary: dict
    # runs of the identical config (``+rerun=...`` repeats; the code may differ between them,
    # provenance names the commits then), this one included; ``num`` takes their median
    repeats: list = field(default_factory=list, repr=False, compare=False)

    @property
    def raw_system(self) -> str:
        return str(self.summary.get("system") or self.config.get("system", {}).get("name", "?"))

    @property
    def system(self) -> str:
        return canonical_system(self.raw_system)

    @property
    def model(self) -> str:
        m = self.summary.get("model")
        if not m:
            m = (self.config.get("model") or {}).get("name", "")
        return str(m or "")

    @property
    def point(self) -> dict:
        p = self.summary.get("point")
        return p if isinstance(p, dict) else {}

    @property
    def concurrency(self) -> int | None:
        c = self.point.get("concurrency")
        if c is None:
            c = self.summary.get("concurrency")
        try:
            return None if c is None else int(c)
        except (TypeError, ValueError):
            return None

    @property
    def paper_concurrency(self) -> int | None:
        """The paper's concurrency this run stands for where its experiment was written in the
        paper's C (harness.run records it in the point), else None."""
        c = self.point.get("paper_concurrency")
        return None if c is None else int(c)

    @property
    def tag(self) -> str:
        return str(self.point.get("tag", ""))

    def get(self, key: str, default: Any = None) -> Any:
        v = self.summary.get(key, default)
        return default if v is None else v

    def num(self, key: str) -> float | None:
        """A summary number; over repeats of this config, their median (a single run of a
        saturated closed loop moves by several percent: Fig. 4's HiSparse C128 measured 3,546
        and 3,485 tok/s, and mean TTFT 1.16 and 2.36 s)."""
        if len(self.repeats) > 1:
            vals = [
                v for v in (as_float(r.summary.get(key)) for r in self.repeats) if v is not None
            ]
            return float(np.median(vals)) if vals else None
        return as_float(self.summary.get(key))

    @cached_property
    def config(self) -> dict:
        return load_yaml(self.path / "config.yaml")

    @cached_property
    def env(self) -> dict:
        """env.json (start time, commit, GPU), or {} without one."""
        e = load_json(self.path / "env.json")
        return e if isinstance(e, dict) else {}

    @property
    def commit(self) -> str:
        """The short commit the run was made at ('' when env.json does not say or says 'unknown');
        a run made from a modified tree keeps its '-dirty' mark."""
        c = str(self.env.get("git_commit") or self.env.get("commit") or "")
        if not c or c == "unknown":
            return ""
        return c[:7] + ("-dirty" if c.endswith("-dirty") else "")

    @property
    def run_group(self) -> str:
        """Which runs were measured together, back to back on one GPU machine: env.json's
        ``run_group`` (``device_call`` in runs recorded before the rename; set by the GPU batch
        script), else its commit (each GPU call of this project's sessions so far ran one
        commit), else ''."""
        return str(self.env.get("run_group") or self.env.get("device_call") or self.commit)

    @property
    def calibrated_acceptance(self) -> bool:
        """Whether the run's speculation drew its accepted lengths from the calibration."""
        # the system's own speculation block: reproduce.speculation is in every run of a family
        acc = self.summary.get("acceptance_mode") or find_key(
            self.config.get("system") or {}, "acceptance_mode", "acceptance"
        )
        return isinstance(acc, str) and acc.lower().startswith("calib")

    @cached_property
    def records(self) -> list[dict]:
        """One dict per request, from records.jsonl or its compacted records.jsonl.xz or .gz (a torn
        last line of an interrupted run is skipped)."""
        _log("files", self.path.glob("records.jsonl*"))
        try:
            return list(read_jsonl(self.path / "records.jsonl"))
        except FileNotFoundError:
            _pruned(self.path, "records.jsonl")
            return []

    @cached_property
    def metrics(self) -> pd.DataFrame | None:
        p = self.path / "server_metrics.parquet"
        if not p.is_file():
            _pruned(self.path, p.name)
            return None
        _log("files", [p])
        return _read_metrics(str(p), p.stat().st_mtime_ns)

    @cached_property
    def profile(self) -> dict | None:
        return load_json(self.path / "profile.json")

    def cfg(self, *names: str) -> Any:
        """A value from summary.point, summary or config.yaml (first found)."""
        for src in (self.point, self.summary):
            for n in names:
                if src.get(n) is not None:
                    return src[n]
        return find_key(self.config, *names)


def decode_stall_share(run: Run) -> float | None:
    """Share of the one-second server samples, with requests running, in which no decode step
    completed (the engine was busy with something else: handoffs of arriving requests)."""
    df = run.metrics
    need = {"dhs_num_steps", "dhs_num_running_reqs"}
    if df is None or not need <= set(df.columns) or len(df) < 3:
        return None
    steps = df["dhs_num_steps"].diff()
    live = df["dhs_num_running_reqs"] > 0
    sel = live & steps.notna()
    if not sel.any():
        return None
    return float((steps[sel] == 0).mean())


def engine_time_split(run: Run) -> dict[str, float] | None:
    """Where the engine thread's wall time went while requests were running, as shares:
    ``decode`` (steps that replayed or ran eagerly), ``capture`` (steps that recorded a CUDA
    graph), ``handoff`` (admission rounds) and ``other`` (the rest: idle waits, intake, the
    engine loop). From the cumulative counters of the server samples (runs since they exist)."""
    w = live_window(
        run,
        {
            "ts",
            "dhs_decode_seconds_total",
            "dhs_admit_seconds_total",
            "dhs_capture_step_seconds_total",
        },
        min_rows=3,
    )
    if w is None:
        return None
    _, a, b = w
    wall = float(b["ts"] - a["ts"])
    if wall <= 0:
        return None
    cap = float(b["dhs_capture_step_seconds_total"] - a["dhs_capture_step_seconds_total"])
    dec = float(b["dhs_decode_seconds_total"] - a["dhs_decode_seconds_total"]) - cap
    hand = float(b["dhs_admit_seconds_total"] - a["dhs_admit_seconds_total"])
    out = {"decode": dec / wall, "capture": cap / wall, "handoff": hand / wall}
    total = sum(out.values())
    if total > 1.0:  # a round straddling the window's edge counts whole: rescale, no "other"
        out = {k: v / total for k, v in out.items()}
    out["other"] = max(0.0, 1.0 - sum(out.values()))
    return out


def admission_blocked_share(run: Run) -> float | None:
    """Share of the engine thread's admission time (every phase of
    ``dhs_admit_phase_seconds_total``) in which it was off the CPU: waiting for the GIL while
    another thread of the server process held it, or in a sleeping wait; from
    ``dhs_admit_phase_cpu_seconds_total`` (a spinning CUDA sync counts as CPU), over the samples
    with requests running. None for runs without those counters or without admission."""
    df = run.metrics
    if df is None:
        return None
    wall = [c for c in df.columns if c.startswith("dhs_admit_phase_seconds_total{")]
    cpu = [c.replace("_seconds_total{", "_cpu_seconds_total{", 1) for c in wall]
    w = live_window(run, set(wall) | set(cpu)) if wall else None
    if w is None:
        return None
    _, a, b = w
    t = sum(float(b[c] - a[c]) for c in wall)
    if not t > 0:
        return None
    return min(1.0, max(0.0, 1.0 - sum(float(b[c] - a[c]) for c in cpu) / t))


def server_loop_busy_share(run: Run) -> float | None:
    """Share of the wall time the server's event loop spent on the CPU while requests were
    running (``dhs_server_loop_cpu_seconds_total``: the loop thread's CPU time, read by its
    /metrics handler): parsing, validation, delivering the engine's outputs, writing streams.
    Near 1 the server's side, not the engine, paces the streams. None for runs before the
    counter."""
    cpu = "dhs_server_loop_cpu_seconds_total"
    w = live_window(run, {cpu, "ts"})
    if w is None:
        return None
    _, a, b = w
    wall = float(b["ts"] - a["ts"])
    return min(1.0, max(0.0, float(b[cpu] - a[cpu]) / wall)) if wall > 0 else None


def gpu_idle_share(run: Run) -> float | None:
    """Share of the GPU's serving timeline with no decode step on it while requests were running:
    1 - the growth of ``dhs_decode_gpu_seconds_total`` over ``dhs_decode_gpu_span_seconds_total``
    (CUDA events around each step, systems/engine/engine.py DecodeGpuTime). Not the same
    quantity as the paper's Fig. 10 "no kernel running": a step's events span the gaps between
    its kernels (idle counted as busy), and admission's copies and kernels between steps count as
    no step (busy counted as idle). None for CPU runs and runs before the counters."""
    gpu, span = "dhs_decode_gpu_seconds_total", "dhs_decode_gpu_span_seconds_total"
    w = live_window(run, {gpu, span})
    if w is None:
        return None
    _, a, b = w
    total = float(b[span] - a[span])
    if not total > 0:
        return None
    return max(0.0, 1.0 - float(b[gpu] - a[gpu]) / total)


def step_cost(run: Run, exclude_capture: bool = False) -> tuple[float, float] | None:
    """(ms per decode step, mean running requests) while requests were running, from the
    server samples: the step's cost against the batch it carried. Over the run's repeats, the
    median of each (every repeat that has samples counts, not only the newest).
    ``exclude_capture`` leaves out the steps that recorded a CUDA graph (and their time), where
    the server counts them."""
    costs = [c for c in (_step_cost_of(x, exclude_capture) for x in (run.repeats or [run])) if c]
    if not costs:
        return None
    return float(np.median([c[0] for c in costs])), float(np.median([c[1] for c in costs]))


def _step_cost_of(run: Run, exclude_capture: bool) -> tuple[float, float] | None:
    """step_cost of one run's own samples."""
    w = live_window(run, {"dhs_decode_seconds_total", "dhs_num_steps"})
    if w is None:
        return None
    live, a, b = w
    steps = float(b["dhs_num_steps"] - a["dhs_num_steps"])
    sec = float(b["dhs_decode_seconds_total"] - a["dhs_decode_seconds_total"])
    cap = ("dhs_capture_step_seconds_total", "dhs_capture_steps_total")
    if exclude_capture and set(cap) <= set(live.columns):
        sec -= float(b[cap[0]] - a[cap[0]])
        steps -= float(b[cap[1]] - a[cap[1]])
    if steps <= 0:
        return None
    return 1e3 * sec / steps, float(live["dhs_num_running_reqs"].mean())


def live_window(run: Run, need: set, min_rows: int = 0):
    """The server samples taken while the measured load's requests were running, with the
    first and last of them (cumulative counters differ between those two), or None without
    such samples. The load is the longest stretch of consecutive samples with requests
    running: the harness's preparation of shared prefixes runs a few requests on the same
    server before it, and a window spanning both counted the idle gap between them (2-3 s of
    fig5_h200's ~35 s runs, "other" engine time and GPU time without a step)."""
    df = run.metrics
    if df is None or not (need | {"dhs_num_running_reqs"}) <= set(df.columns) or len(df) < min_rows:
        return None
    running = df["dhs_num_running_reqs"] > 0
    stretch = (running != running.shift()).cumsum()[running]
    if stretch.empty:
        return None
    spans = df[running].groupby(stretch)
    span = spans["ts"].agg(lambda t: t.iloc[-1] - t.iloc[0]) if "ts" in df else spans.size()
    live = df[running][stretch == span.idxmax()]
    if len(live) < 2:
        return None
    return live, live.iloc[0], live.iloc[-1]


def run_value(run: Run, key) -> float | None:
    """A run's number: its summary's ``key``, or ``key(run)`` for a value the summary holds
    deeper (e.g. one phase's share)."""
    return as_float(key(run)) if callable(key) else as_float(run.summary.get(key))


def values_by_run_group(points: dict, key) -> dict[str, dict[Any, list[float]]]:
    """{run group: {point: ``run_value(run, key)`` of each of the point's runs in that group}}
    over each point's run and all its repeats (a point is any label: a system, a budget): which
    values one GPU machine measured together. A group may hold several runs of one point."""
    by_group: dict[str, dict[Any, list[float]]] = {}
    for label_, r in points.items():
        for x in r.repeats or [r]:
            v = run_value(x, key)
            if x.run_group and v is not None:  # a run that measured 0 stays in its group
                by_group.setdefault(x.run_group, {}).setdefault(label_, []).append(v)
    return by_group


def counter_growth(run: Run, name: str) -> float | None:
    """Growth of one cumulative /metrics counter across the run's samples (None without two
    samples or without the counter)."""
    df = run.metrics
    if df is None or name not in df.columns or len(df) < 2:
        return None
    return float(df[name].iloc[-1] - df[name].iloc[0])


def counter_ratio(run: Run, num: str, den: str) -> float | None:
    """Growth of one cumulative /metrics counter over another's across the run's samples (None
    without samples, without both counters, or when the denominator did not grow)."""
    n, d = counter_growth(run, num), counter_growth(run, den)
    return n / d if n is not None and d is not None and d > 0 else None


def graph_replay_share(run: Run) -> float | None:
    """Share of the run's decode steps that replayed a captured CUDA graph (server samples)."""
    return counter_ratio(run, "dhs_graph_replays_total", "dhs_num_steps")


def accepted_per_round(run: Run) -> float | None:
    """Accepted drafts per speculative round over the run (server samples), None without rounds."""
    return counter_ratio(run, "dhs_spec_accepted_total", "dhs_spec_rounds_total")


def queries_per_round(run: Run) -> float | None:
    """Verification queries per speculative round (anchor included), None without rounds."""
    return counter_ratio(run, "dhs_spec_queries_total", "dhs_spec_rounds_total")


def as_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def finished_runs(results: str | Path, experiment: str) -> list[Run]:
    """Every finished run of an experiment (directories with a readable summary.json), oldest
    first: where two runs measure the same point (a rerun after a config change), the figures'
    "last match" is the newest measurement."""
    d = Path(results) / experiment
    if not d.is_dir():
        return []
    _log("experiments", [d])
    runs = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        if ".superseded-" in sub.name or ".failed-" in sub.name:
            continue  # re-measured (--rerun-before, harness.unpack), or an attempt that failed
        s = load_json(sub / "summary.json")
        if isinstance(s, dict):
            runs.append(Run(sub, s))
    runs.sort(key=lambda r: (str(r.env.get("time_utc", "")), r.path.name))
    return runs


# an experiment re-run on the H200 preset derived from the paper (docs/presets.md) is named
# <experiment>_h200 and writes results/<experiment>_h200/
H200_SUFFIX = "_h200"


def load_preferred(results: str | Path, experiment: str) -> tuple[str, list[Run]]:
    """(name, runs) of the experiment a figure plots: ``<experiment>_h200`` where it has
    finished runs, else ``experiment`` (the scaled mini presets)."""
    for name in (experiment + H200_SUFFIX, experiment):
        runs = load_runs(results, name)
        if runs:
            return name, runs
    return experiment, []


def preset_label(experiment: str) -> str:
    """The GLM-like preset an experiment ``load_preferred`` chose runs on, for a report's title."""
    # fig4_h200, fig4_h200_c256, fig4_h200_sweep: the H200 variants of an experiment
    on_h200 = experiment.endswith(H200_SUFFIX) or f"{H200_SUFFIX}_" in experiment
    return "GLM-like H200 preset" if on_h200 else "GLM-like scaled preset"


def load_runs(results: str | Path, experiment: str) -> list[Run]:
    """The finished runs of an experiment that its figures plot (see below)."""
    runs = finished_runs(results, experiment)
    if not runs:
        SUPERSEDED.pop(experiment, None)
        return []
    # one output cap per figure: runs at another cap are an earlier (or a later, unfinished)
    # version of the experiment and would mix two workloads in one curve (input lengths may
    # differ on purpose, e.g. Fig. 5's context crossover). The newest cap is used once, at every
    # load it measured, it covers every system and setting an older cap covered there; until
    # then a partial rerun does not displace a complete older sweep. Loads the newest cap has
    # not measured yet are then missing from the figure (never mixed in from the older cap).
    caps = caps_newest_first(runs)
    current = caps[-1] if caps else None
    for i, cap in enumerate(caps):
        have = {setting(r) for r in runs if output_cap(r) == cap}
        loads = {(k[1], k[2]) for k in have}
        older = {setting(r) for r in runs if output_cap(r) in caps[i + 1 :]}
        if {k for k in older if (k[1], k[2]) in loads} <= have:
            current = cap
            break
    kept = [r for r in runs if output_cap(r) == current]
    if len(kept) < len(runs):
        waiting = [r for r in runs if output_cap(r) in caps[: caps.index(current)]]
        _log("waiting", (r.path for r in waiting))
        SUPERSEDED[experiment] = (len(runs) - len(kept) - len(waiting), current, len(waiting))
    else:
        SUPERSEDED.pop(experiment, None)
    # a rerun after a config change replaces the older run of its setting (notes and
    # diagnoses then read only what the figure plots); runs of one config fold into a median
    kept = fold_repeats(kept)
    newest = {setting(r): r for r in kept}
    return [r for r in kept if newest[setting(r)] is r]


def output_cap(r: Run) -> Any:
    """The run's output-token cap (workload.output_len), or None."""
    w = r.config.get("workload") if isinstance(r.config, dict) else None
    return w.get("output_len") if isinstance(w, dict) else None


def caps_newest_first(runs: Sequence[Run]) -> list:
    """The output caps of ``runs`` (oldest first, as load_runs sorts them), newest cap first."""
    caps: list = []
    for r in reversed(runs):
        if output_cap(r) not in caps:
            caps.append(output_cap(r))
    return caps


def setting(r: Run) -> tuple:
    """What a figure plots a run as: system, load point, and the settings figures sweep (the
    hot-cache budget, optional residency, block size, and the input length of Fig. 5's
    context crossover)."""
    return (
        r.system,
        r.concurrency,
        r.point.get("tag"),
        *(
            str(find_key(r.config, k))
            for k in ("hot_cache_rows", "optional_residency", "block_size", "input_len")
        ),
    )


# config keys that do not change what a run measures (run_id drops the same, and ``rerun`` /
# ``repeat`` are the keys that force a repeat: by hand, or harness.reproduce's interleaved ones)
_VOLATILE = ("server", "logger", "results_dir", "hydra", "rerun", "repeat")
# keys of an experiment's ``reproduce`` block that a run's id does not hash (harness.run), nor
# does a repeat's identity: reproduce.speculation reaches the speculative systems through
# system.speculation (the system configs interpolate it) and is hashed there, likewise
# reproduce.kv through system.kv; reproduce.repeats says how many runs the plan makes, not what
# one of them measures; reproduce.system_overrides reaches a run as its own overrides, hashed
# where they land (so adding one for another system keeps this system's runs its repeats);
# reproduce.warm_up_concurrency sizes the throwaway wave before a group, no measured run
REPRODUCE_UNHASHED = ("speculation", "kv", "repeats", "system_overrides", "warm_up_concurrency")


# Keys added with a default that keeps what earlier runs did, or that changes how a run goes but
# not which tokens it serves: at that default a key stays out of the id (another value is part
# of it), so the runs made before it keep theirs; MEASUREMENT_CHANGES flags runs
# on both sides of a default that moves the numbers.
# system.kv: defaults the backends applied without the configs naming them; lending free slots'
# index history to optional history (how much is fetched from host); the copy grid scaling with
# the batch; the reserve's reclaims off the decode stream; the handoff stream's copy grid;
# population off the decode stream
KV_IMPLICIT_BEFORE = {
    "cap_slots_to_pool": True,
    "tail_rows": 0,
    "lend_index_store": True,
    "copy_grid": 0,
    "pools_sized_for_rows": 0,
    "copy_programs_per_request": 0,
    "async_reclaim": True,
    "handoff_copy_programs": 0,
    "async_populate": True,
}
# engine: overlap scheduling and asynchronous handoffs (when tokens are read and a request joins
# the batch), the CUDA graphs' padding ladder and their capture at start-up, the handoffs in
# flight, the decode stream's priority
ENGINE_IMPLICIT_BEFORE = {
    "overlap_schedule": True,
    "async_handoffs": True,
    "cuda_graph_bs": None,
    "cuda_graph_warmup": True,
    "max_handoffs_in_flight": 0,
    "decode_stream_priority": 0,
}
# model: the GEMM implementation (cuBLAS was all there was)
MODEL_IMPLICIT_BEFORE = {"gemm_impl": "cublas"}


def _drop_defaults(section, defaults: dict) -> None:
    if isinstance(section, dict):
        for key, default in defaults.items():
            if key in section and section[key] == default:
                del section[key]


def drop_implicit_defaults(material: dict) -> None:
    """Remove, in place, the keys above where they hold their default: the layout run ids hash
    (harness.run) and repeats are recognised in (``fold_repeats``), so a run made before a key
    existed and one made after, at its default, are the same configuration."""
    _drop_defaults(((material.get("system") or {}).get("kv")), KV_IMPLICIT_BEFORE)
    _drop_defaults(material.get("engine"), ENGINE_IMPLICIT_BEFORE)
    _drop_defaults(material.get("model"), MODEL_IMPLICIT_BEFORE)


def _repeat_key(r: Run) -> str:
    if not r.config:  # no config.yaml: nothing says it repeats another run
        return str(r.path)
    material = copy.deepcopy({k: v for k, v in r.config.items() if k not in _VOLATILE})
    drop_implicit_defaults(material)
    srv = r.config.get("server")
    # the engine served is not volatile: an SGLang run never repeats a bundled one
    material["server.mode"] = srv.get("mode") if isinstance(srv, dict) else None
    rep = material.get("reproduce")
    if isinstance(rep, dict):
        rest = {k: v for k, v in rep.items() if k not in REPRODUCE_UNHASHED}
        if rest:
            material["reproduce"] = rest
        else:
            material.pop("reproduce")
    return json.dumps([material, r.system, r.tag, r.concurrency], sort_keys=True, default=str)


def fold_repeats(runs: list[Run]) -> list[Run]:
    """Runs of one identical config become their newest run, which carries all of them in
    ``repeats`` (oldest first; ``runs`` is oldest first)."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(_repeat_key(r), []).append(r)
    out = []
    for r in runs:
        g = groups[_repeat_key(r)]
        if r is g[-1]:
            r.repeats = g if len(g) > 1 else []
            out.append(r)
    return out


# experiment -> (older runs left out, the output cap kept, newer runs waiting for the rest of
# their sweep), for the reports' notes
SUPERSEDED: dict[str, tuple[int, Any, int]] = {}


def compared_loads(runs: Iterable[Run]) -> dict[int, int]:
    """{paper C: ours C} over the runs' loads, for a Report's load line: the paper's C that a
    run recorded (harness.load_mapping), else ours (runs made before the mapping ran our C as the
    paper's; load_label then says what they are per decode GPU)."""
    out = {}
    for r in runs:
        if r.concurrency:
            out[r.paper_concurrency or r.concurrency] = r.concurrency
    return dict(sorted(out.items()))


def by_system(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.system, []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r.concurrency or 0)
    return dict(sorted(out.items(), key=lambda kv: system_sort_key(kv[0])))


def pick(
    runs: Iterable[Run], system: str | None = None, concurrency: int | None = None, **point
) -> Run | None:
    """The last run matching system / concurrency / point keys (None if there is none)."""
    found = None
    for r in runs:
        if system is not None and r.system != canonical_system(system):
            continue
        if concurrency is not None and r.concurrency != concurrency:
            continue
        if any(str(r.cfg(k)) != str(v) for k, v in point.items()):
            continue
        found = r
    return found


def summary_value(
    runs: Sequence[Run], system: str, concurrency: int, key: str, scale: float = 1.0
) -> float | None:
    r = pick(runs, system, concurrency)
    v = None if r is None else r.num(key)
    return None if v is None else v * scale


def curve(runs: Sequence[Run], system: str, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in by_system(runs).get(canonical_system(system), []):
        v = r.num(key)
        if r.concurrency is not None and v is not None:
            xs.append(r.concurrency)
            ys.append(v)
    return xs, ys


def metric_col(df: pd.DataFrame | None, *names: str) -> str | None:
    if df is None:
        return None
    for n in names:
        if n in df.columns:
            return n
    return None


def counter_share(
    df: pd.DataFrame | None,
    num: str = "dhs_selected_rows_from_host_total",
    den: str = "dhs_selected_rows_total",
    t0: float | None = None,
    t1: float | None = None,
) -> float | None:
    """Share of a counter over another between two times (whole run by default)."""
    if df is None or num not in df.columns or den not in df.columns or "ts" not in df.columns:
        return None
    sel = df
    if t0 is not None:
        sel = sel[sel["ts"] >= t0]
    if t1 is not None:
        sel = sel[sel["ts"] <= t1]
    sel = sel[[num, den]].dropna()
    if len(sel) < 2:
        return None
    dn = float(sel[den].iloc[-1] - sel[den].iloc[0])
    if dn <= 0:
        return None
    return float(sel[num].iloc[-1] - sel[num].iloc[0]) / dn


def binned(df: pd.DataFrame, col: str, bin_s: float = 5.0, t0: float | None = None) -> pd.DataFrame:
    """Mean of a gauge in bins of ``bin_s`` seconds: columns t_s, value."""
    t0 = float(df["ts"].iloc[0]) if t0 is None else t0
    d = pd.DataFrame({"t_s": ((df["ts"] - t0) // bin_s) * bin_s, "value": df[col]})
    return d.groupby("t_s", as_index=False)["value"].mean()


def binned_share(
    df: pd.DataFrame, num: str, den: str, bin_s: float = 5.0, t0: float | None = None
) -> pd.DataFrame:
    """Share of counter increments per bin: columns t_s, value (fraction)."""
    t0 = float(df["ts"].iloc[0]) if t0 is None else t0
    d = df[["ts", num, den]].dropna().copy()
    d["b"] = ((d["ts"] - t0) // bin_s) * bin_s
    g = d.groupby("b").agg(n=(num, "last"), d=(den, "last")).diff().dropna()
    g = g[g["d"] > 0]
    return pd.DataFrame({"t_s": g.index.values, "value": (g["n"] / g["d"]).values})


def _ttft_s(rec: Mapping) -> float | None:
    for t, n in rec.get("chunks") or []:
        if n and n > 0:
            return float(t) - float(rec.get("send_mono", 0.0))
    return None


def timing_split(run: Run, post_wave: bool) -> dict[str, float | None]:
    """Mean alloc wait / handoff / other / TTFT (s) over a run's successful requests;
    ``post_wave`` excludes the first C submitted (index < C)."""
    c = run.concurrency or 0
    aw, ho, ot, tt = [], [], [], []
    for rec in run.records:
        if not rec.get("success"):
            continue
        if post_wave and int(rec.get("index", 0)) < c:
            continue
        t = _ttft_s(rec)
        tim = rec.get("timing") or {}
        a, h = as_float(tim.get("alloc_wait_s")), as_float(tim.get("handoff_s"))
        if t is not None:
            tt.append(t)
        if a is not None:
            aw.append(a)
        if h is not None:
            ho.append(h)
        if None not in (t, a, h):
            ot.append(t - a - h)
    m = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    return {"alloc_wait_s": m(aw), "handoff_s": m(ho), "other_s": m(ot), "ttft_s": m(tt)}


# profiling/kernel_timeline.py family names -> the paper's categories
KERNEL_FAMILY_TO_FIG10 = {
    "expert_mlp_matmul": "expert matrix products",
    "dense_projection": "dense projections",
    "indexing_attention": "indexing and attention",
    "other_model": "other model kernels",
    "several_families": "several families at once",
    "no_kernel": "no kernel running",
}


CACHE_KERNEL_FAMILIES = ("resolver", "follower_copy", "host_backup", "page_bookkeeping", "handoff")


def _merge_cycles(cycles: list[dict]) -> dict:
    """Step-weighted mean of the per-cycle summaries of kernels/kernel_summary.json."""
    cyc = [c for c in cycles if isinstance(c, Mapping) and (c.get("num_steps") or 0) > 0]
    if not cyc:
        return {}
    w = [float(c["num_steps"]) for c in cyc]
    tot = sum(w)
    out: dict[str, Any] = {"num_steps": tot}
    keys = {k for c in cyc for k, v in c.items() if isinstance(v, (int, float))}
    for k in keys - {"num_steps"}:
        out[k] = sum(wi * float(c.get(k) or 0.0) for wi, c in zip(w, cyc)) / tot
    shares: dict[str, float] = {}
    for wi, c in zip(w, cyc):
        for k, v in (c.get("share_of_step_pct") or {}).items():
            shares[k] = shares.get(k, 0.0) + wi * float(v) / tot
    out["share_of_step_pct"] = shares
    return out


def kernel_profile(run: Run) -> dict | None:
    """A run's kernel profile in one shape, from ``profile.json`` (used as is) or from the
    profiler's ``kernels/kernel_summary.json`` (profiling/kernel_timeline.py), mapped to the
    paper's categories: {step_ms, sessions_per_step, cache_kernel_ms {resolver, follower_copy},
    partition_pct {Fig. 10 family: %}, round_ms {Fig. 11 family: ms}, resolver_share_pct}."""
    if run.profile:
        return run.profile
    ks = load_json(run.path / "kernels" / "kernel_summary.json")
    if not ks:
        return None
    s = _merge_cycles(ks.get("cycles") or [])
    if not s:
        return None
    share = s.get("share_of_step_pct") or {}
    part = {
        KERNEL_FAMILY_TO_FIG10[k]: float(v) for k, v in share.items() if k in KERNEL_FAMILY_TO_FIG10
    }
    part["cache kernels alone"] = sum(float(share.get(f, 0.0)) for f in CACHE_KERNEL_FAMILIES)
    step = as_float(s.get("step_ms"))
    ms = lambda pct: None if step is None else step * pct / 100.0  # noqa: E731
    rnd = None
    if step is not None:
        rnd = {
            "cache kernels alone": ms(part["cache kernels alone"]),
            "expert matrix products": ms(part.get("expert matrix products", 0.0)),
            "other model kernels": ms(
                sum(
                    part.get(k, 0.0)
                    for k in ("dense projections", "indexing and attention", "other model kernels")
                )
            ),
            "several families at once": ms(part.get("several families at once", 0.0)),
            "no kernel coverage": ms(part.get("no kernel running", 0.0)),
            "total": step,
        }
    return {
        "step_ms": step,
        "sessions_per_step": as_float(s.get("sessions_per_step")),
        "cache_kernel_ms": {
            "resolver": as_float(s.get("work_resolver_ms")),
            "follower_copy": as_float(s.get("work_follower_copy_ms")) or 0.0,
        },
        "partition_pct": part,
        "round_ms": rnd,
        "resolver_share_pct": as_float(s.get("resolver_share_pct_mean")),
        "source": "kernels/kernel_summary.json",
    }


def graphs_replayed(run: Run) -> bool:
    """Whether the profiled steps replayed CUDA graphs: their kernels then carry only the ranges
    around the graph launch, so expert and dense-projection matmuls (both "dense projections") and
    a follower layer's copy (counted as resolver) cannot be told apart (docs/profiling.md)."""
    cfg = run.config or {}
    eng = cfg.get("engine") or {}
    # a config that does not say (hand-written profile.json runs) is taken as eager
    return (
        "disable_cuda_graph" in eng
        and not eng["disable_cuda_graph"]
        and str(cfg.get("device")) == "cuda"
    )


def profile_at_load(run: Run, skipped: list[str]) -> dict | None:
    """A run's kernel profile (kernel_profile) where it describes the run's load; None where the run
    has none, or where it does not (the reason appended to ``skipped``, for the figure's notes)."""
    prof = kernel_profile(run)
    why = profile_off_load(run, prof)
    if why:
        skipped.append(why)
        return None
    return prof or None


def profile_off_load(run: Run, prof: dict | None) -> str | None:
    """Why a run's kernel profile does not describe the run's load, or None when it does (or cannot
    tell): the profiled steps carried under half the requests the run held (a schedule that fell
    on the load generator's warm-up request profiles batch 1 at any offered load)."""
    if not prof:
        return None
    ses = as_float(prof.get("sessions_per_step"))
    held = run.num("active_mean") or (float(run.concurrency) if run.concurrency else None)
    if ses is None or not held or ses >= 0.5 * min(held, float(run.concurrency or held)):
        return None
    return (
        f"the kernel profile of {run.path.parent.name}/{run.path.name} covers steps carrying {ses:.3g} "
        f"request(s), not the run's load (~{held:.0f} running), so it is not used (profile.wait fell inside "
        "the load generator's warm-up request; the profiled experiments now run without one)"
    )


# Commits after which the same config measures differently (a default that changes step time).
# A claim built from runs on both sides of one says so in its provenance.
MEASUREMENT_CHANGES = (
    (
        "a5e1803",
        "kernel defaults: index-scan multiply-add form, resolver tiles and bitmap by batch",
    ),
    (
        "3468fa5",
        "adaptive residency also keeps optional history in free slots' index history",
    ),
    (
        "32b3576",
        "the warm-up prepares every shared prefix (before it, all but one of a workload's "
        "prefixes were prefilled inside the measured window)",
    ),
    (
        "33162a2",
        "a batch size without a CUDA graph replays a larger one with padding rows (before it, "
        "the ramp-up and drain sizes ran eagerly until captured)",
    ),
    (
        "b9eff06",
        "sparse attention splits a query's k rows into chunks of 256 whatever the batch (before "
        "it, the chunk count filled the GPU from the batch size: more chunks at small batches)",
    ),
    (
        "f2582f3",
        "the batch-size ladder's CUDA graphs are captured at server start-up (before it, at "
        "their uses inside the measured window)",
    ),
    (
        "5eb5e34",
        "sparse attention's chunks of 128 rows (8 at k = 1,024; before it, 256) and the indexer's "
        "top-k in segments of a row (before it, one program per row)",
    ),
    (
        "4fa6c02",
        "the server extends a /generate stream's cumulative text by each chunk's tokens (before "
        "it, it decoded the whole output at every chunk, on the thread the engine shares the GIL "
        "with: a cost growing with the output length, larger for one token a chunk)",
    ),
    (
        "183a78c",
        "a batch size off the CUDA graph ladder always replays the next captured ladder size "
        "with padding rows (before it, a size met three times was captured inside the run)",
    ),
    (
        "d9d8508",
        "the all-heads sparse attention kernel reads 32-row tiles (before it, 16: 11-20 % "
        "slower at 1 to 512 queries on glm53_h200's geometry)",
    ),
    (
        "cc63719",
        "the drafter's window attention reads its ring in place in a Triton kernel on the GPU "
        "(before it, a gather, a concatenation and PyTorch's memory-efficient attention, one "
        "program per request)",
    ),
    (
        "f3df0a4",
        "adaptive residency keeps its free lent pages as slots and holders change (before it, "
        "every lookup scanned all of them: ~2,700 on dsv41_h200, several scans and milliseconds "
        "of host time a step)",
    ),
    (
        "473698b",
        "HiSparse and adaptive residency write a slot's device table entries with fill kernels "
        "on admission and release (before it, each wrote single elements from Python ints, "
        "which waits for the decode step in flight: every handoff and finish stalled the host "
        "and left the GPU idle after it)",
    ),
    (
        "bdc09f6",
        "the server parses request bodies of 64 KiB or more in parser processes (before it, a "
        "125,000-token body held the GIL ~13 ms on the event loop, time the engine thread, "
        "which shares it, could not queue steps or handoffs)",
    ),
    (
        "cb0d325",
        "the start-up warm-up captures every graph it plans, on top of the bound on graphs "
        "captured while serving (before it, a drafter's warm-up past 64 keys left out the "
        "largest batch sizes, captured while serving: Adaptive DHiSparse + DSpark at ours C256)",
    ),
    (
        "3aa49d6",
        "under calibrated acceptance DSpark's warm-up captures the verification width its "
        "scheduler picks (before it, the whole block: the steady state's narrower passes were "
        "captured while serving, ~9 % of Adaptive DHiSparse + DSpark's engine time at ours C256)",
    ),
    (
        "af29852",
        "a request's first token is sampled on the host by inverse CDF (before it, "
        "torch.multinomial: ~2 ms of the engine thread's CPU per admitted request on dsv41_h200)",
    ),
    (
        "d802e32",
        "the page pool frees a request's pages with set operations (before it, one page at a "
        "time: ~0.8 ms of the engine thread per 125K-token release)",
    ),
    (
        "5f1eff6",
        "adaptive residency picks lendable pages with a C sort (before it, heapq.nlargest: "
        "~0.5 ms of the engine thread per 125K-token admission on dsv41_h200)",
    ),
    (
        "2474bd8",
        "the server hands a step's outputs to the event loop in one wake-up and writes a stream's "
        "queued outputs at once (before it, a self-pipe write and a loop iteration per request "
        "and step: ~390 socket sends a step at 200 running on dsv41_h200)",
    ),
    (
        "beb83e9",
        "a drafter's ring rows of a prompt's tail are computed once per prompt and scattered at "
        "admission (before it, an eager catch-up per admitting step: ~5 ms of the engine thread "
        "per request on dsv41_h200)",
    ),
    (
        "badbc85",
        "/metrics reads the device counters from a periodic host copy (before it, three syncs "
        "per scrape on the event loop, each waiting for the step in flight)",
    ),
    (
        "221df4d",
        "the bundled server runs on uvloop where installed (before it, asyncio: one GIL "
        "hand-over per stream and step in its socket writes)",
    ),
    (
        "83a316a",
        "the bundled server runs its engine in a process of its own (before it, a thread "
        "sharing the server's GIL with its event loop)",
    ),
    (
        "02d92fa",
        "adaptive residency keeps its admission reserve free after every admission and reclaims "
        "lent index regions in the reclaim order (before it, an admission could spend the "
        "reserve, and a region went to the holders with the fewest optional pages)",
    ),
    (
        "317bfd1",
        "adaptive residency backs up the reserve's reclaim victims on the handoff stream, "
        "system.kv.async_reclaim (before it, on the decode stream, a stall of their PCIe time)",
    ),
    (
        "6c3ab09",
        "a HiSparse handoff backs its history up with one 2-D copy per run of host pages for "
        "every source (before it, a copy per source, 26 calls of engine thread per request)",
    ),
    (
        "59afae2",
        "adaptive residency populates pages on a side stream, system.kv.async_populate "
        "(before it, on the decode stream between steps)",
    ),
    (
        "bc5bdce",
        "adaptive residency's population has a stream of its own (before it, the handoff "
        "stream, where a release could wait for the imports queued before its population)",
    ),
)


@cache
def _after_change(commit: str, change: str) -> bool | None:
    """Whether ``commit`` contains ``change`` (git ancestry); None where git cannot tell (no
    repository, a shallow clone, a commit made on another checkout and never pushed)."""
    import subprocess

    try:
        res = subprocess.run(
            ["git", "merge-base", "--is-ancestor", change, commit],
            cwd=REPO,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(res.returncode)


# The changes of MEASUREMENT_CHANGES that move some runs only (the others measure as they did):
# change -> the runs it moves, by KV backend (system.kv_backend) and/or by speculation (a
# drafter in system.speculation). A change not named here moves every run.
CHANGE_SCOPE = {
    "3468fa5": {"kv_backend": ("adaptive_hisparse",)},
    "cc63719": {"speculative": True},
    "f3df0a4": {"kv_backend": ("adaptive_hisparse",)},
    "473698b": {"kv_backend": ("hisparse", "adaptive_hisparse")},
    "cb0d325": {"speculative": True},
    "3aa49d6": {"speculative": True},
    "5f1eff6": {"kv_backend": ("adaptive_hisparse",)},
    "beb83e9": {"speculative": True},
    "02d92fa": {"kv_backend": ("adaptive_hisparse",)},
    "317bfd1": {"kv_backend": ("adaptive_hisparse",)},
    "6c3ab09": {"kv_backend": ("hisparse", "adaptive_hisparse")},
    "59afae2": {"kv_backend": ("adaptive_hisparse",)},
    "bc5bdce": {"kv_backend": ("adaptive_hisparse",)},
}


def moved_by(change: str, run: Run) -> bool:
    """Whether ``change`` moves what ``run`` measures (CHANGE_SCOPE; a run whose config does
    not say is moved)."""
    scope = CHANGE_SCOPE.get(change)
    if not scope:
        return True
    system = (run.config or {}).get("system") or {}
    backend = system.get("kv_backend")
    if "kv_backend" in scope and backend is not None and backend not in scope["kv_backend"]:
        return False
    if scope.get("speculative") and "speculation" in system and not system["speculation"]:
        return False
    return True


def moved_commits(change: str, runs: Iterable[Run]) -> set[str]:
    """The commits of the single runs in ``runs`` that ``change`` moves (moved_by)."""
    return {x.commit for x in runs if x.commit and moved_by(change, x)}


def change_mix(runs: Iterable[Run]) -> str:
    """A provenance note when ``runs`` straddle a MEASUREMENT_CHANGES commit, or (straddling
    none) were all made before some of them, else ''. A change counts for the runs it moves
    (CHANGE_SCOPE)."""
    runs = list(runs)
    singles = [x for r in runs for x in (r.repeats or [r])]
    notes, later = [], []  # later: changes every run predates
    for change, what in MEASUREMENT_CHANGES:
        commits = moved_commits(change, singles)
        side = {c: _after_change(c, change) for c in commits}
        before = sorted(c for c, v in side.items() if v is False)
        after = sorted(c for c, v in side.items() if v is True)
        if before and after:
            notes.append(
                f"mixes runs from before {change} ({', '.join(before)}) and after it "
                f"({', '.join(after)}): {what}"
            )
        elif before and len(before) == len(commits):
            later.append((change, what))
    if later and not notes:
        # every run on the early side of some changes: nothing mixes, but a re-run would differ
        change, what = later[-1]
        notes.append(
            f"made before {len(later)} later change{'s' if len(later) > 1 else ''} that "
            f"move{'' if len(later) > 1 else 's'} the numbers "
            f"(harness.results.MEASUREMENT_CHANGES; the newest, {change}: "
            f"{what.split(' (before it')[0]})"
        )
    grid = copy_grid_mix(runs)
    if grid:
        notes.append(grid)
    return "; ".join(notes)


def kv_config_of(run: Run) -> dict:
    """A run's system.kv section ({} where its config has none)."""
    return ((run.config or {}).get("system") or {}).get("kv") or {}


def hot_cache_rows_of(run: Run) -> int:
    """A run's hot-cache budget B: system.kv since the typed config, model before it; 0: none."""
    b = kv_config_of(run).get("hot_cache_rows") or ((run.config or {}).get("model") or {}).get(
        "hot_cache_rows"
    )
    return int(b or 0)


def copy_grid_of(run: Run) -> int:
    """The programs a run's resolver copied its misses on (system.kv.copy_grid); 0: the grid
    scaling with the batch, which runs from before the key used."""
    return int(kv_config_of(run).get("copy_grid") or 0)


def pools_sized_for_of(run: Run) -> int:
    """The hot-cache budget a run's pools were sized for (system.kv.pools_sized_for_rows); 0: its
    own B, as every run before the key."""
    return int(kv_config_of(run).get("pools_sized_for_rows") or 0)


def copy_grid_mix(runs: Iterable[Run]) -> str:
    """A note when ``runs`` hold HiSparse runs that copied their misses on different grids
    (system.kv.copy_grid: the paper's fixed grid, or the batch-scaled one of runs before the
    key), else ''. A config change, not a commit: the two are different run ids, and a figure
    that reads the newest run per setting may take some of each while a sweep is re-run."""
    counts: dict[int, int] = {}
    for r in runs:
        for x in r.repeats or [r]:
            if x.system == "hisparse":
                g = copy_grid_of(x)
                counts[g] = counts.get(g, 0) + 1
    if len(counts) < 2:
        return ""
    parts = [
        f"{n} on {'a fixed grid of ' + str(g) + ' programs' if g else 'the batch-scaled grid'}"
        for g, n in sorted(counts.items())
    ]
    return "mixes HiSparse runs whose misses were copied on different grids: " + ", ".join(parts)


_FIRST_RUNS: dict = {}


def first_run_count(runs: Iterable[Run]) -> tuple[int, int]:
    """(runs among ``runs`` and their repeats that were the first of their (model, system) in a
    device call, all of them): results/cold_cache/first_runs.json lists those, since a fresh
    machine's first serving run measured up to 2x slower than the same run after it."""
    runs = [x for r in runs for x in (r.repeats or [r])]
    if not runs:
        return 0, 0
    root = runs[0].path.parent.parent
    if root not in _FIRST_RUNS:
        d = load_json(root / "cold_cache" / "first_runs.json") or {}
        _FIRST_RUNS[root] = {str(x.get("run")) for x in d.get("runs") or []}
    listed = _FIRST_RUNS[root]
    n = sum(1 for r in runs if f"{r.path.parent.name}/{r.path.name}" in listed)
    return n, len(runs)
