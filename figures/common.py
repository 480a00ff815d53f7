"""Shared pieces of the figure scripts: loading results/, provenance, the paper-vs-ours report,
and plotting helpers.

Every figure script has the same shape::

    def main(argv=None) -> Report:
        args = parse_args("fig4", __doc__, argv)          # --results DIR --out DIR --dpi N
        runs = load_runs(args.results, "fig4")            # tolerant: [] when nothing is there
        rep = Report("fig4", "Fig. 4 - ...")
        ... draw panels (not_measured_panel() where there is no data) ...
        rep.compare(key, quantity, paper_value, our_value, unit=..., prov=provenance(runs))
        return rep.finish(fig, args)                      # writes <out>/fig4.png and .md, prints

Scripts read only files under the results directory; nothing here touches a GPU.

Conventions of the results files (see docs/figures.md): shares are fractions in [0, 1]
(``host_fetched_share``, ``dhs_ready_optional_coverage``), times follow their key suffix
(``_ms``, ``_s``, ``_us``), per-GPU output is ``output_tok_s_per_gpu``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from figures.paper_values import PV, SYSTEM_LABELS  # noqa: E402
from harness.records import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "results"
DEFAULT_OUT = REPO / "figures" / "out"

SYSTEM_ORDER = ("resident", "hisparse", "adaptive_hisparse", "resident_dflash2", "resident_dspark",
                "adaptive_dhisparse")
SPECULATIVE = {"resident_dflash2", "resident_dspark", "adaptive_dhisparse"}
_PALETTE = sns.color_palette("colorblind", 8)
SYSTEM_COLORS = {
    "resident": _PALETTE[7],
    "hisparse": _PALETTE[0],
    "adaptive_hisparse": _PALETTE[2],
    "resident_dflash2": _PALETTE[7],
    "resident_dspark": _PALETTE[7],
    "adaptive_dhisparse": _PALETTE[2],
}
NOT_MEASURED = "not yet measured"


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


def system_label(name: str) -> str:
    return SYSTEM_LABELS.get(canonical_system(name), name)


def system_color(name: str):
    return SYSTEM_COLORS.get(canonical_system(name), _PALETTE[4])


def system_sort_key(name: str) -> int:
    c = canonical_system(name)
    return SYSTEM_ORDER.index(c) if c in SYSTEM_ORDER else len(SYSTEM_ORDER)


# =============================================================================================
# loading
# =============================================================================================
def load_json(path: str | Path) -> dict | None:
    """A JSON document, or None when the file is missing or unreadable (warned on stderr)."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        print(f"[figures] warning: cannot read {p}: {e}", file=sys.stderr)
        return None


def _load_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        import yaml

        return yaml.safe_load(path.read_text()) or {}
    except Exception as e:  # noqa: BLE001 - tolerate anything a half-written file does
        print(f"[figures] warning: cannot read {path}: {e}", file=sys.stderr)
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
        print(f"[figures] warning: cannot read {path}: {e}", file=sys.stderr)
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
            vals = [v for v in (as_float(r.summary.get(key)) for r in self.repeats) if v is not None]
            return float(np.median(vals)) if vals else None
        return as_float(self.summary.get(key))

    @cached_property
    def config(self) -> dict:
        return _load_yaml(self.path / "config.yaml")

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
    def device_call(self) -> str:
        """The runs this one was measured with: env.json's run_group (set by benchmarks/gpu_batch.sh;
        device_call in records written before the rename), else its commit (each GPU-machine call
        of this project's sessions so far ran one commit), else ''."""
        return str(self.env.get("run_group") or self.env.get("device_call") or self.commit)

    @property
    def calibrated_acceptance(self) -> bool:
        """Whether the run's speculation drew its accepted lengths from the calibration."""
        # the system's own speculation block: reproduce.speculation is in every run of a family
        acc = self.summary.get("acceptance_mode") or find_key(self.config.get("system") or {},
                                                              "acceptance_mode", "acceptance")
        return isinstance(acc, str) and acc.lower().startswith("calib")

    @cached_property
    def records(self) -> list[dict]:
        """One dict per request, from records.jsonl or its compacted records.jsonl.xz or .gz (a torn
        last line of an interrupted run is skipped)."""
        try:
            return list(read_jsonl(self.path / "records.jsonl"))
        except FileNotFoundError:
            note = self.path / "RECORDS_PRUNED.txt"  # harness.compact --prune-unused took them
            if note.is_file():
                print(f"[figures] {self.path.name}: request records were pruned; "
                      f"{note.read_text().strip()}", file=sys.stderr)
            return []

    @cached_property
    def metrics(self) -> pd.DataFrame | None:
        p = self.path / "server_metrics.parquet"
        if not p.is_file():
            return None
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
    w = _live_window(run, {"ts", "dhs_decode_seconds_total", "dhs_admit_seconds_total",
                           "dhs_capture_step_seconds_total"}, min_rows=3)
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


def step_cost(run: Run, exclude_capture: bool = False) -> tuple[float, float] | None:
    """(ms per decode step, mean running requests) while requests were running, from the
    server samples: the step's cost against the batch it carried. ``exclude_capture`` leaves out
    the steps that recorded a CUDA graph (and their time), where the server counts them."""
    w = _live_window(run, {"dhs_decode_seconds_total", "dhs_num_steps"})
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


def _live_window(run: Run, need: set, min_rows: int = 0):
    """The server samples taken while requests were running, with the first and last of them
    (cumulative counters differ between those two), or None without such samples."""
    df = run.metrics
    if df is None or not (need | {"dhs_num_running_reqs"}) <= set(df.columns) or len(df) < min_rows:
        return None
    live = df[df["dhs_num_running_reqs"] > 0]
    if len(live) < 2:
        return None
    return live, live.iloc[0], live.iloc[-1]


def batch_scaling_note(runs: Iterable[Run], concurrency: int) -> str | None:
    """At one load: each system's decode step time against the requests it held. Where the
    per-request cost is about equal while one system holds many more requests, holding more
    adds no output: the step grows in proportion to its batch."""
    from figures.paper_values import label
    costs = {}
    for r in runs:
        c = step_cost(r) if r.concurrency == concurrency else None
        if c is not None and c[1] > 0:
            costs[r.system] = c
    if len(costs) < 2:
        return None
    text = ", ".join(f"{label(s)} {ms:.1f} ms at {n:.0f} running ({ms / n:.3f} ms each)"
                     for s, (ms, n) in sorted(costs.items(), key=lambda kv: system_sort_key(kv[0])))
    out = f"decode step at C{concurrency}: {text}"
    # compare like with like: a speculative round verifies several queries per request
    spec = {r.system: bool((r.config.get("system") or {}).get("speculation")) for r in runs}
    for kind, name in ((False, "non-speculative"), (True, "speculative")):
        group = [c for s, c in costs.items() if spec.get(s) is kind]
        if len(group) < 2:
            continue
        per = [ms / n for ms, n in group]
        held = [n for _, n in group]
        if max(per) <= 1.3 * min(per) and max(held) >= 1.5 * min(held):
            out += (f"; among the {name} systems the step's time grows in proportion to its "
                    "batch, so holding more requests adds little output (the scaled model has "
                    "little fixed per-step cost, such as weight reads, for a larger batch to "
                    "share)")
    return out


def admission_note(runs: Iterable[Run], concurrency: int) -> str | None:
    """At one load: the systems that held well under their slots while requests waited and the
    pool never refused one, i.e. whose admission rate (engine.max_handoffs_per_step handoffs per
    step, done between steps) set how many requests ran, with their steps per second."""
    from figures.paper_values import label
    parts = []
    for r in runs:
        if r.concurrency != concurrency:
            continue
        w = _live_window(r, {"dhs_num_waiting_reqs", "dhs_num_slots", "dhs_num_steps", "ts"})
        if w is None:
            continue
        live, a, b = w
        running, waiting = float(live["dhs_num_running_reqs"].mean()), float(live["dhs_num_waiting_reqs"].mean())
        slots = float(live["dhs_num_slots"].max())
        refused = sum(float(b[c] - a[c]) for c in live.columns if c.startswith("dhs_admission_wait_events_total"))
        wall = float(b["ts"] - a["ts"])
        if wall <= 0 or refused > 0 or waiting < 0.2 * concurrency or running > 0.9 * slots:
            continue
        steps = float(b["dhs_num_steps"] - a["dhs_num_steps"]) / wall
        per = find_key(r.config, "max_handoffs_per_step")
        parts.append(f"{label(r.system)} held {running:.0f} running of {slots:.0f} slots with {waiting:.0f} "
                     f"waiting and no admission refused by memory: at {steps:.1f} steps/s and "
                     f"{per} handoffs per step, admission set the batch")
    if not parts:
        return None
    return (f"admission-limited at C{concurrency}: " + "; ".join(parts)
            + " (handoffs run between steps in this engine, so a long speculative round admits fewer "
              "requests per second)")


def admission_experiment_note(results: str | Path, runs: Iterable[Run], concurrency: int | None = None) -> str | None:
    """results/admission/ holds runs of a figure's config with a faster admission rate
    (engine.max_handoffs_per_step overridden). Each is set beside the figure's own run of that
    system and load: output, and the requests it held running and waiting."""
    from figures.paper_values import label
    runs = list(runs)
    parts = []
    for a in load_runs(results, "admission"):
        if concurrency is not None and a.concurrency != concurrency:
            continue
        base = pick(runs, a.system, a.concurrency)
        if base is None or a.model != base.model:
            continue

        def held(r: Run) -> str:
            w = _live_window(r, {"dhs_num_waiting_reqs"})
            if w is None:
                return ""
            return (f", {float(w[0]['dhs_num_running_reqs'].mean()):.0f} running and "
                    f"{float(w[0]['dhs_num_waiting_reqs'].mean()):.0f} waiting")

        per_a, per_b = find_key(a.config, "max_handoffs_per_step"), find_key(base.config, "max_handoffs_per_step")
        out_a, out_b = a.num("output_tok_s"), base.num("output_tok_s")
        if not out_a or not out_b or per_a is None:
            continue
        mix = change_mix([a, base])
        caveat = f"; {mix}" if mix else ""
        if a.device_call != base.device_call:
            caveat += (f"; the two runs are from different device calls ({a.device_call or '?'}, "
                       f"{base.device_call or '?'}), and one config's output moves by up to 40% between GPU machines")
        parts.append(f"{label(a.system)} at C{a.concurrency} with {per_a} handoffs per step made "
                     f"{out_a:,.0f} tok/s{held(a)}, against {out_b:,.0f} tok/s{held(base)} with "
                     f"{per_b if per_b is not None else 'the default'} ({out_a / out_b:.2f}x; "
                     f"{a.path.parent.name}/{a.path.name}{caveat})")
    if not parts:
        return None
    return ("admission experiment: " + "; ".join(parts)
            + ". The figure keeps the experiment's own setting; this run only measures how much of "
              "the gap the admission rate explains")


def values_by_device_call(points: dict, key: str) -> dict[str, dict]:
    """{device call: {point: the summary's ``key``}} over each point's run and its repeats (a
    point is any label: a system, a budget): which values one GPU machine measured together."""
    by_call: dict[str, dict] = {}
    for label_, r in points.items():
        for x in (r.repeats or [r]):
            v = as_float(x.summary.get(key))
            if x.device_call and v:
                by_call.setdefault(x.device_call, {})[label_] = v
    return by_call


def paired_ratio_note(runs: Iterable[Run], pairs: Sequence[tuple[str, str]], concurrency: int,
                      key: str = "output_tok_s") -> str | None:
    """Where the points of a ratio are medians of repeats, the ratio of runs made in one device
    call (one commit, one GPU machine) for each call that ran both systems. One config's output
    moves by up to 40% between machines, so a ratio of medians over different machines can be
    further from either machine's own ratio than the effect is large."""
    from figures.paper_values import label
    runs = list(runs)
    parts = []
    for a_sys, b_sys in pairs:
        a, b = pick(runs, a_sys, concurrency), pick(runs, b_sys, concurrency)
        if a is None or b is None or (len(a.repeats) < 2 and len(b.repeats) < 2):
            continue
        by_call = values_by_device_call({"a": a, "b": b}, key)
        ratios = [(c, d["a"] / d["b"]) for c, d in by_call.items() if {"a", "b"} <= set(d)]
        if not ratios:
            continue
        vals = sorted(r for _, r in ratios)
        parts.append(f"{label(a_sys)} / {label(b_sys)} " + ", ".join(f"{r:.2f} ({c})" for c, r in ratios)
                     + (f", median {float(np.median(vals)):.2f}" if len(vals) > 1 else ""))
    if not parts:
        return None
    return (f"ratios at C{concurrency} within one device call (its id, or its commit): " + "; ".join(parts)
            + ". The figure's ratio is of the repeats' medians, which come from different GPU machines")


def counter_ratio(run: Run, num: str, den: str) -> float | None:
    """Growth of one cumulative /metrics counter over another's across the run's samples (None
    without samples, without both counters, or when the denominator did not grow)."""
    df = run.metrics
    if df is None or not {num, den} <= set(df.columns) or len(df) < 2:
        return None
    d = float(df[den].iloc[-1] - df[den].iloc[0])
    return float(df[num].iloc[-1] - df[num].iloc[0]) / d if d > 0 else None


def graph_replay_share(run: Run) -> float | None:
    """Share of the run's decode steps that replayed a captured CUDA graph (server samples)."""
    return counter_ratio(run, "dhs_graph_replays_total", "dhs_num_steps")


def eager_note(runs: Iterable[Run]) -> str | None:
    """A note naming the systems whose runs replayed no CUDA graph at all (a failed capture
    runs the rest of a server's life eagerly)."""
    from figures.paper_values import label
    eager = sorted({r.system for r in runs if graph_replay_share(r) == 0.0})
    if not eager:
        return None
    return ("These runs replayed no CUDA graph, so every step ran eagerly (for hisparse at 2K "
            "context an eager step took 36.6 ms against 4.9 ms replayed, "
            "results/cuda_graph/check-mma-h200.json): " + ", ".join(label(s) for s in eager)
            + ". Their server.log names the failed capture.")


def accepted_per_round(run: Run) -> float | None:
    """Accepted drafts per speculative round over the run (server samples), None without rounds."""
    return counter_ratio(run, "dhs_spec_accepted_total", "dhs_spec_rounds_total")


def queries_per_round(run: Run) -> float | None:
    """Verification queries per speculative round (anchor included), None without rounds."""
    return counter_ratio(run, "dhs_spec_queries_total", "dhs_spec_rounds_total")


def no_draft_note(runs: Iterable[Run]) -> str | None:
    """Names the speculative runs whose rounds verified no draft (one query per round: DSpark's
    scheduler found no prefix worth verifying), so they paid for drafting and gained nothing."""
    from figures.paper_values import label
    idle = sorted({r.system for r in runs if (q := queries_per_round(r)) is not None and q <= 1.05})
    if not idle:
        return None
    return ("these speculative runs verified no draft (one query per round): " + ", ".join(label(s) for s in idle)
            + "; DSpark's scheduler read the random-weight drafter's confidences, also under calibrated "
            "acceptance, until it took the calibrated acceptance as its confidence")


def acceptance_note(runs: Iterable[Run]) -> str | None:
    """Names the speculative runs that verified exactly with the mini models' random-weight
    drafters: they accept (almost) nothing, so their speculation only adds verification cost
    and says nothing about the paper's trained drafters."""
    from figures.paper_values import label
    worst: dict[str, float] = {}
    for r in runs:
        a = accepted_per_round(r)
        if a is None or r.calibrated_acceptance:
            continue
        worst[r.system] = max(a, worst.get(r.system, 0.0))
    if not worst:
        return None
    parts = ", ".join(f"{label(s)} {a:.2f}" for s, a in sorted(worst.items()))
    return ("speculative runs with exact acceptance: the mini models' random-weight drafters accepted "
            f"at most {parts} drafts per round, so speculation only added verification cost "
            "(the Fig. 4 and Fig. 5 families use calibrated acceptance since; these runs predate it)")


def diagnosis(runs: Iterable[Run], concurrency: int) -> str | None:
    """Everything that explains a throughput claim at one load: exact acceptance with
    random-weight drafters, rounds that verified no draft, the engine's time split
    (stall_diagnosis), the step's cost against its batch (batch_scaling_note), and admission
    that set the batch (admission_note)."""
    runs = list(runs)
    parts = [x for x in (acceptance_note(runs), no_draft_note(runs), stall_diagnosis(runs, concurrency),
                         batch_scaling_note(runs, concurrency), admission_note(runs, concurrency)) if x]
    return "; ".join(parts) or None


def stall_diagnosis(runs: Iterable[Run], concurrency: int) -> str | None:
    """Why a throughput claim at one load does not hold, from the engine's own time split
    (newer runs) or else the share of seconds without a completed decode step."""
    from figures.paper_values import label
    splits = {r.system: engine_time_split(r) for r in runs if r.concurrency == concurrency}
    splits = {k: v for k, v in splits.items() if v}
    if splits and min(v["decode"] for v in splits.values()) < 0.8:
        parts = "; ".join(
            f"{label(s)} " + ", ".join(f"{k} {100 * x:.0f}%" for k, x in v.items())
            for s, v in sorted(splits.items()))
        return (f"engine time at C{concurrency} (decode steps / steps that captured a CUDA graph / "
                f"handoffs / other): {parts}")
    shares = {}
    for r in runs:
        if r.concurrency == concurrency:
            v = decode_stall_share(r)
            if v is not None:
                shares[r.system] = v
    if not shares or max(shares.values()) < 0.1:
        return None
    parts = ", ".join(f"{label(s)} {100 * v:.0f}%" for s, v in sorted(shares.items()))
    return (f"handoff-bound: at C{concurrency} no decode step completed in {parts} of the seconds "
            "with requests running (arrivals' handoffs ran instead)")


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
    runs = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        s = load_json(sub / "summary.json")
        if isinstance(s, dict):
            runs.append(Run(sub, s))
    runs.sort(key=lambda r: (str(r.env.get("time_utc", "")), r.path.name))
    return runs


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
        older = {setting(r) for r in runs if output_cap(r) in caps[i + 1:]}
        if {k for k in older if (k[1], k[2]) in loads} <= have:
            current = cap
            break
    kept = [r for r in runs if output_cap(r) == current]
    if len(kept) < len(runs):
        newer = sum(1 for r in runs if output_cap(r) in caps[:caps.index(current)])
        SUPERSEDED[experiment] = (len(runs) - len(kept) - newer, current, newer)
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
    return (r.system, r.concurrency, r.point.get("tag"),
            *(str(find_key(r.config, k)) for k in ("hot_cache_rows", "optional_residency",
                                                   "block_size", "input_len")))


# config keys that do not change what a run measures (run_id drops the same, and ``rerun`` is
# the key that forces a repeat)
_VOLATILE = ("server", "logger", "results_dir", "hydra", "rerun")


def _repeat_key(r: Run) -> str:
    if not r.config:  # no config.yaml: nothing says it repeats another run
        return str(r.path)
    material = {k: v for k, v in r.config.items() if k not in _VOLATILE}
    srv = r.config.get("server")
    # the engine served is not volatile: an SGLang run never repeats a bundled one
    material["server.mode"] = srv.get("mode") if isinstance(srv, dict) else None
    rep = material.get("reproduce")
    if isinstance(rep, dict):  # hashed through system.speculation (see harness.run.run_id)
        rest = {k: v for k, v in rep.items() if k != "speculation"}
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


def by_system(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.system, []).append(r)
    for v in out.values():
        v.sort(key=lambda r: (r.concurrency or 0))
    return dict(sorted(out.items(), key=lambda kv: system_sort_key(kv[0])))


def pick(runs: Iterable[Run], system: str | None = None, concurrency: int | None = None,
         **point) -> Run | None:
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


def summary_value(runs: Sequence[Run], system: str, concurrency: int, key: str,
                  scale: float = 1.0) -> float | None:
    r = pick(runs, system, concurrency)
    v = None if r is None else r.num(key)
    return None if v is None else v * scale


class Tracker:
    """Looks values up in runs and remembers which runs were used, so that each compared number
    carries the provenance of exactly the runs it came from (``take()`` after each value)."""

    def __init__(self, runs: Sequence[Run]):
        self.runs = list(runs)
        self._used: list[Run] = []

    def run(self, system: str, concurrency: int | None) -> Run | None:
        r = pick(self.runs, system, concurrency)
        if r is not None:
            self._used.append(r)
        return r

    def val(self, system: str, concurrency: int | None, key: str, scale: float = 1.0) -> float | None:
        r = self.run(system, concurrency)
        v = None if r is None else r.num(key)
        return None if v is None else v * scale

    def use(self, runs: Iterable[Run]) -> None:
        self._used.extend(runs)

    def take(self) -> str:
        used, self._used = self._used, []
        return provenance(used) if used else ""


def curve(runs: Sequence[Run], system: str, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in by_system(runs).get(canonical_system(system), []):
        v = r.num(key)
        if r.concurrency is not None and v is not None:
            xs.append(r.concurrency)
            ys.append(v)
    return xs, ys


# ---------------------------------------------------------------------------------------------
# server metrics helpers
# ---------------------------------------------------------------------------------------------
def metric_col(df: pd.DataFrame | None, *names: str) -> str | None:
    if df is None:
        return None
    for n in names:
        if n in df.columns:
            return n
    return None


def counter_share(df: pd.DataFrame | None, num: str = "dhs_selected_rows_from_host_total",
                  den: str = "dhs_selected_rows_total", t0: float | None = None,
                  t1: float | None = None) -> float | None:
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


def binned_share(df: pd.DataFrame, num: str, den: str, bin_s: float = 5.0,
                 t0: float | None = None) -> pd.DataFrame:
    """Share of counter increments per bin: columns t_s, value (fraction)."""
    t0 = float(df["ts"].iloc[0]) if t0 is None else t0
    d = df[["ts", num, den]].dropna().copy()
    d["b"] = ((d["ts"] - t0) // bin_s) * bin_s
    g = d.groupby("b").agg(n=(num, "last"), d=(den, "last")).diff().dropna()
    g = g[g["d"] > 0]
    return pd.DataFrame({"t_s": g.index.values, "value": (g["n"] / g["d"]).values})


# ---------------------------------------------------------------------------------------------
# records helpers (post-wave splits)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# kernel profiles (Fig. 9 resolver work, Fig. 10, Fig. 11)
# ---------------------------------------------------------------------------------------------
# profiling/kernel_timeline.py family names -> the paper's categories
KERNEL_FAMILY_TO_FIG10 = {
    "expert_mlp_matmul": "expert matrix products", "dense_projection": "dense projections",
    "indexing_attention": "indexing and attention", "other_model": "other model kernels",
    "several_families": "several families at once", "no_kernel": "no kernel running",
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
    part = {KERNEL_FAMILY_TO_FIG10[k]: float(v) for k, v in share.items() if k in KERNEL_FAMILY_TO_FIG10}
    part["cache kernels alone"] = sum(float(share.get(f, 0.0)) for f in CACHE_KERNEL_FAMILIES)
    step = as_float(s.get("step_ms"))
    ms = (lambda pct: None if step is None else step * pct / 100.0)  # noqa: E731
    rnd = None
    if step is not None:
        rnd = {"cache kernels alone": ms(part["cache kernels alone"]),
               "expert matrix products": ms(part.get("expert matrix products", 0.0)),
               "other model kernels": ms(sum(part.get(k, 0.0) for k in (
                   "dense projections", "indexing and attention", "other model kernels"))),
               "several families at once": ms(part.get("several families at once", 0.0)),
               "no kernel coverage": ms(part.get("no kernel running", 0.0)),
               "total": step}
    return {"step_ms": step, "sessions_per_step": as_float(s.get("sessions_per_step")),
            "cache_kernel_ms": {"resolver": as_float(s.get("work_resolver_ms")),
                                "follower_copy": as_float(s.get("work_follower_copy_ms")) or 0.0},
            "partition_pct": part, "round_ms": rnd,
            "resolver_share_pct": as_float(s.get("resolver_share_pct_mean")),
            "source": "kernels/kernel_summary.json"}


def graphs_replayed(run: Run) -> bool:
    """Whether the profiled steps replayed CUDA graphs: their kernels then carry only the ranges
    around the graph launch, so expert and dense-projection matmuls (both "dense projections") and
    a follower layer's copy (counted as resolver) cannot be told apart (docs/profiling.md)."""
    cfg = run.config or {}
    eng = cfg.get("engine") or {}
    # a config that does not say (hand-written profile.json runs) is taken as eager
    return "disable_cuda_graph" in eng and not eng["disable_cuda_graph"] and str(cfg.get("device")) == "cuda"


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
    return (f"the kernel profile of {run.path.parent.name}/{run.path.name} covers steps carrying {ses:.3g} "
            f"request(s), not the run's load (~{held:.0f} running), so it is not used (profile.wait fell inside "
            "the load generator's warm-up request; the profiled experiments now run without one)")


# =============================================================================================
# provenance
# =============================================================================================
# Commits after which the same config measures differently (a default that changes step time).
# A claim built from runs on both sides of one says so in its provenance.
MEASUREMENT_CHANGES = (
    ("a5e1803", "kernel defaults: index-scan multiply-add form, resolver tiles and bitmap by batch"),
)


@cache
def _after_change(commit: str, change: str) -> bool | None:
    """Whether ``commit`` contains ``change`` (git ancestry); None where git cannot tell (no
    repository, a shallow clone, a commit made on another checkout and never pushed)."""
    import subprocess

    try:
        res = subprocess.run(["git", "merge-base", "--is-ancestor", change, commit], cwd=REPO,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(res.returncode)


def change_mix(runs: Iterable[Run]) -> str:
    """A provenance note when ``runs`` straddle a MEASUREMENT_CHANGES commit, else ''."""
    commits = set()
    for r in runs:
        for x in (r.repeats or [r]):
            if x.commit:
                commits.add(x.commit)
    notes = []
    for change, what in MEASUREMENT_CHANGES:
        side = {c: _after_change(c, change) for c in commits}
        before = sorted(c for c, v in side.items() if v is False)
        after = sorted(c for c, v in side.items() if v is True)
        if before and after:
            notes.append(f"mixes runs from before {change} ({', '.join(before)}) and after it "
                         f"({', '.join(after)}): {what}")
    return "; ".join(notes)


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


def provenance(runs: Iterable[Run] | Run | None, extra: str | None = None) -> str:
    """Where a measured number came from: scaled preset / calibrated input(s), device."""
    if runs is None:
        return extra or ""
    from figures.paper_values import label
    runs = [runs] if isinstance(runs, Run) else list(runs)
    tags: list[str] = []

    def add(t: str) -> None:
        if t and t not in tags:
            tags.append(t)

    for r in runs:
        model = r.model
        add(f"scaled preset ({model})" if model else "scaled preset")
        loc = as_float(find_key(r.config, "selection_locality"))
        if loc is None:
            loc = as_float(r.summary.get("selection_locality"))
        if loc:
            add(f"calibrated input: selection locality {loc:g}")
        if r.calibrated_acceptance:
            add("calibrated input: acceptance")
        if len(r.repeats) > 1:
            commits = sorted({x.commit for x in r.repeats if x.commit})
            # the spread is part of the number: one config's output differs by up to 40% between
            # GPU machines (the engine thread runs on the host CPU)
            outs = [as_float(x.summary.get("output_tok_s")) for x in r.repeats]
            details = []
            if all(o is not None for o in outs):
                details.append(f"{label(r.system)} output " + " / ".join(f"{o:,.0f}" for o in outs) + " tok/s")
            if len(commits) > 1:
                details.append("commits " + ", ".join(commits))
            add(f"median of {len(r.repeats)} repeat runs" + (f" ({'; '.join(details)})" if details else ""))
        dev = r.summary.get("gpu") or r.summary.get("device")
        if dev and str(dev) not in ("cpu",):
            add(str(dev))
        elif dev == "cpu":
            add("CPU run")
    add(change_mix(runs))
    n_first, n_all = first_run_count(runs)
    if n_first:
        add(f"{n_first} of {n_all} runs the first of their system in a fresh machine's device call "
            f"(such a run measured up to 2x slower; results/cold_cache/)")
    if extra:
        add(extra)
    return "; ".join(tags)


def summary_provenance(d: Mapping | None, kind: str) -> str:
    """Provenance of a special summary file (e.g. results/fig8/summary.json)."""
    if not d:
        return ""
    parts = [kind]
    if d.get("model"):
        parts.append(f"scaled preset ({d['model']})")
    loc = as_float(d.get("selection_locality"))
    if loc:
        parts.append(f"calibrated input: selection locality {loc:g}")
    if isinstance(d.get("acceptance_mode"), str) and d["acceptance_mode"].startswith("calib"):
        parts.append("calibrated input: acceptance")
    if d.get("gpu") or d.get("device"):
        parts.append(str(d.get("gpu") or d.get("device")))
    return "; ".join(parts)


# =============================================================================================
# the report
# =============================================================================================
def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, Mapping) and "lo" in v and "hi" in v:
        return f"{fmt(v['lo'])}–{fmt(v['hi'])}"
    if isinstance(v, str):
        return v
    f = float(v)
    if math.isnan(f):
        return "—"
    a = abs(f)
    if f == int(f) and a < 1e15:
        return f"{int(f):,}"
    if a >= 1000:
        s = f"{f:,.0f}"
    elif a >= 100:
        s = f"{f:.1f}"
    elif a >= 10:
        s = f"{f:.2f}".rstrip("0").rstrip(".")
    elif a >= 1:
        s = f"{f:.3f}".rstrip("0").rstrip(".")
    else:
        s = f"{f:.4g}"
    return s


def paper_number(p: Any) -> float | None:
    """A comparable number for a paper value (the midpoint of a range)."""
    if p is None:
        return None
    if isinstance(p, Mapping) and "lo" in p and "hi" in p:
        return (float(p["lo"]) + float(p["hi"])) / 2.0
    return as_float(p)


def paper_source(p: Any) -> str:
    if isinstance(p, PV):
        return p.source + (f" ({p.note})" if p.note else "")
    if isinstance(p, Mapping) and isinstance(p.get("lo"), PV):
        lo = p["lo"]
        return lo.source + (f" ({lo.note})" if lo.note else "")
    return ""


@dataclass
class Row:
    key: str
    quantity: str
    paper: Any
    ours: float | None
    unit: str = ""
    prov: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        p = paper_number(self.paper)
        if self.ours is None or p is None or p == 0:
            return None
        return float(self.ours) / p

    @property
    def measured(self) -> bool:
        return self.ours is not None


@dataclass
class Report:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    panels: dict[str, str] = field(default_factory=dict)
    tables: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # row key -> measured reason it differs
    measured_with: str = ""
    png: Path | None = None
    md: Path | None = None

    # ------------------------------------------------------------------ collecting
    def compare(self, key: str, quantity: str, paper: Any, ours: Any, unit: str = "",
                prov: str = "", note: str = "") -> Row:
        o = as_float(ours)
        row = Row(key, quantity, paper, o, unit, prov if o is not None else NOT_MEASURED, note)
        self.rows.append(row)
        return row

    def panel(self, letter: str, status: str) -> None:
        self.panels[letter] = status

    def table(self, title: str, df: pd.DataFrame | str) -> None:
        md = df if isinstance(df, str) else df_to_markdown(df)
        self.tables.append((title, md))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def diagnose(self, keys: Iterable[str], text: str, append: bool = False) -> None:
        """A measured reason for rows whose claim may not hold (shown beside the claim);
        ``append`` adds it after a reason already given."""
        for k in keys:
            self.why[k] = f"{self.why[k]}; {text}" if append and self.why.get(k) else text

    def note_reasons(self, reasons: Iterable[str]) -> None:
        """One note per distinct reason (e.g. each left-out run), as a sentence."""
        for why in dict.fromkeys(reasons):
            self.note(why[0].upper() + why[1:].rstrip(".") + ".")

    def value(self, key: str) -> float | None:
        for r in self.rows:
            if r.key == key:
                return r.ours
        return None

    def row(self, key: str) -> Row | None:
        for r in self.rows:
            if r.key == key:
                return r
        return None

    @property
    def n_measured(self) -> int:
        return sum(1 for r in self.rows if r.measured)

    # ------------------------------------------------------------------ output
    def markdown(self, heading_level: int = 1, image: str | None = None) -> str:
        h = "#" * heading_level
        out = [f"{h} {self.title}", ""]
        if image:
            out += [f"![{self.name}]({image})", ""]
        if self.measured_with:
            out += [f"Measured with: {self.measured_with}", ""]
        if self.panels:
            out.append("Panels: " + "; ".join(f"**{k}** {v}" for k, v in self.panels.items()))
            out.append("")
        if self.rows:
            out += [f"{h}# Paper vs ours", "",
                    "| quantity | paper | ours | ours/paper | paper source | ours from |",
                    "|---|---|---|---|---|---|"]
            for r in self.rows:
                u = f" {r.unit}" if r.unit else ""
                ours = fmt(r.ours) + u if r.ours is not None else f"*{NOT_MEASURED}*"
                ratio = fmt(r.ratio) if r.ratio is not None else "—"
                q = r.quantity + (f" ({r.note})" if r.note else "")
                out.append(f"| {q} | {fmt(r.paper)}{u if r.paper is not None else ''} | {ours} | "
                           f"{ratio} | {paper_source(r.paper)} | {r.prov} |")
            out.append("")
        for title, md in self.tables:
            out += [f"{h}# {title}", "", md, ""]
        missing = [r for r in self.rows if not r.measured]
        if missing or any(NOT_MEASURED in v for v in self.panels.values()):
            out += [f"{h}# Not yet measured", ""]
            for k, v in self.panels.items():
                if NOT_MEASURED in v:
                    out.append(f"- panel {k}: {v}")
            for r in missing:
                out.append(f"- {r.quantity} (paper: {fmt(r.paper)}{(' ' + r.unit) if r.unit else ''})")
            out.append("")
        notes = list(self.notes)
        if self.name in SUPERSEDED:
            n, cap, newer = SUPERSEDED[self.name]
            if n:
                notes.append(f"{n} older run(s) with another output cap are left out: this figure "
                             f"uses the runs at the {cap}-token cap.")
            if newer:
                notes.append(f"{newer} newer run(s) at another output cap are left out until they cover "
                             f"every system and setting this figure's {cap}-token runs measured at "
                             "their loads (a partial rerun).")
        if notes:
            out += [f"{h}# Notes", ""] + [f"- {n}" for n in notes] + [""]
        return "\n".join(out)

    def print(self) -> None:
        print(f"== {self.title}")
        w = max([len(r.quantity) for r in self.rows] + [10])
        for r in self.rows:
            u = f" {r.unit}" if r.unit else ""
            ours = fmt(r.ours) + u if r.measured else NOT_MEASURED
            ratio = f"  ours/paper {fmt(r.ratio)}" if r.ratio is not None else ""
            print(f"  {r.quantity:<{w}}  paper {fmt(r.paper)}{u:<8}  ours {ours}{ratio}")
        if self.png:
            print(f"  -> {self.png}  {self.md}")

    def finish(self, fig, args) -> Report:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        self.png = out / f"{self.name}.png"
        self.md = out / f"{self.name}.md"
        if fig is not None:
            fig.savefig(self.png, dpi=args.dpi, bbox_inches="tight")
            plt.close(fig)
        self.md.write_text(self.markdown(image=self.png.name))
        if not getattr(args, "quiet", False):
            self.print()
        return self


def df_to_markdown(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in row) + " |")
    return "\n".join(lines)


# =============================================================================================
# CLI and plotting helpers
# =============================================================================================
def parse_args(name: str, doc: str | None, argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m figures.{name}",
                                 description=(doc or "").strip().splitlines()[0] if doc else None)
    ap.add_argument("--results", type=Path, default=Path(os.environ.get("DHS_RESULTS", DEFAULT_RESULTS)),
                    help="results directory to read (default: results/)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="where to write <name>.png and <name>.md (default: figures/out/)")
    ap.add_argument("--dpi", type=int, default=150)
    ap.add_argument("--quiet", action="store_true", help="do not print the comparison")
    return ap.parse_args(list(argv) if argv is not None else None)


def setup_style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=0.9)


def subplots(nrows: int, ncols: int, width: float = 4.0, height: float = 3.0, **kw):
    setup_style()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)
    return fig, axes


def panel_title(ax, letter: str, text: str) -> None:
    ax.set_title(f"{letter}  {text}", loc="left", fontsize=9, fontweight="bold")


def not_measured_panel(ax, what: str = "") -> None:
    """Draw an empty panel saying plainly that nothing was measured."""
    ax.set_facecolor("#f3f3f3")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.text(0.5, 0.55, NOT_MEASURED.upper(), ha="center", va="center", fontsize=11,
            color="#888888", fontweight="bold", transform=ax.transAxes)
    if what:
        ax.text(0.5, 0.38, what, ha="center", va="center", fontsize=7, color="#888888",
                transform=ax.transAxes, wrap=True)


def mark_unmeasured(ax, what: str = "ours") -> None:
    """Overlay on a panel that shows paper values only."""
    ax.text(0.5, 0.95, f"{NOT_MEASURED.upper()} ({what})", transform=ax.transAxes, ha="center",
            va="top", color="#888888", fontweight="bold", fontsize=9)


def plot_system_curve(ax, xs, ys, system: str, *, label: str | None = None, log_y: bool = False,
                      linestyle: str = "-") -> None:
    filled = canonical_system(system) in SPECULATIVE
    ax.plot(xs, ys, linestyle=linestyle, marker="o", color=system_color(system),
            markerfacecolor=system_color(system) if filled else "white",
            label=label or system_label(system), markersize=5, linewidth=1.4)
    if log_y:
        ax.set_yscale("log")


def serving_panels(axes: Sequence, runs: Sequence[Run], rep: Report, *, output_key: str,
                   output_label: str, letters=("a", "b", "c")) -> bool:
    """The three panels of Figs. 1 / 4 / 5: output vs C, TTFT (log) vs output, TPOT vs output."""
    groups = by_system(runs)
    ax_a, ax_b, ax_c = axes
    if not groups:
        for ax, lt, what in zip(axes, letters, ("output vs offered concurrency",
                                                "mean TTFT vs output", "mean TPOT vs output")):
            not_measured_panel(ax, what)
            rep.panel(lt, f"{NOT_MEASURED} ({what})")
        panel_title(ax_a, letters[0], "Output vs offered concurrency")
        panel_title(ax_b, letters[1], "Mean TTFT (log) vs output")
        panel_title(ax_c, letters[2], "Mean TPOT vs output")
        return False
    for sys_, rs in groups.items():
        pts = [(r.concurrency, r.num(output_key), r.num("ttft_ms_mean"), r.num("tpot_ms_mean"))
               for r in rs if r.concurrency is not None]
        pts = [p for p in pts if p[1] is not None]
        if not pts:
            continue
        c, o, t, tp = zip(*pts)
        plot_system_curve(ax_a, c, o, sys_)
        tt = [(oo, x / 1e3) for oo, x in zip(o, t) if x is not None]
        if tt:
            plot_system_curve(ax_b, *zip(*tt), sys_, log_y=True)
        tpp = [(oo, x) for oo, x in zip(o, tp) if x is not None]
        if tpp:
            plot_system_curve(ax_c, *zip(*tpp), sys_)
    cs = sorted({r.concurrency for r in runs if r.concurrency})
    if cs and cs[-1] / max(cs[0], 1) >= 8:
        ax_a.set_xscale("log", base=2)
        ax_a.set_xticks(cs)
        ax_a.set_xticklabels([str(c) for c in cs])
    ax_a.set_xlabel("Offered concurrency (requests)")
    ax_a.set_ylabel(output_label)
    ax_b.set_xlabel(output_label)
    ax_b.set_ylabel("Mean time to first token (s)")
    ax_c.set_xlabel(output_label)
    ax_c.set_ylabel("Mean time per output token (ms)")
    panel_title(ax_a, letters[0], "Output vs offered concurrency")
    panel_title(ax_b, letters[1], "Mean TTFT (log) vs output")
    panel_title(ax_c, letters[2], "Mean TPOT vs output")
    legend(ax_a)
    n = len(runs)
    for lt in letters:
        rep.panel(lt, f"measured ({n} runs)")
    rep.measured_with = provenance(runs)
    return True


def paper_vs_ours_bars(ax, categories: Sequence[str], paper: Sequence[float | None],
                       ours: Sequence[float | None], ylabel: str = "", log: bool = False,
                       colors: Sequence | None = None) -> None:
    """Side-by-side bars: hatched = paper, solid = ours (missing ours drawn as an 'n/m' mark)."""
    x = np.arange(len(categories))
    w = 0.38
    colors = list(colors) if colors is not None else [_PALETTE[0]] * len(categories)
    pv = [np.nan if p is None else float(p) for p in paper]
    ov = [np.nan if o is None else float(o) for o in ours]
    ax.bar(x - w / 2, pv, w, color="white", edgecolor=colors, hatch="///", label="paper")
    ax.bar(x + w / 2, ov, w, color=colors, label="ours")
    for i, o in enumerate(ov):
        if np.isnan(o):
            ax.text(x[i] + w / 2, 0, "n/m", ha="center", va="bottom", fontsize=6, color="#888888",
                    rotation=90)
    ax.set_xticks(x)
    ax.set_xticklabels(categories, rotation=20, ha="right", fontsize=7)
    if all(np.isnan(o) for o in ov):
        mark_unmeasured(ax)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)


def legend(ax, **kw) -> None:
    """ax.legend() only when something carries a label (no warning on empty panels)."""
    h, _ = ax.get_legend_handles_labels()
    if h:
        ax.legend(fontsize=7, frameon=False, **kw)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def pct_change(a: float | None, b: float | None) -> float | None:
    """(a / b - 1) * 100."""
    r = ratio(a, b)
    return None if r is None else (r - 1.0) * 100.0


def parse_budget(text: str) -> float | None:
    """B/k from a tag like 'B2k', 'b4k', 'Bk' or 'B=0.5k'."""
    m = re.search(r"[Bb]=?(\d*\.?\d*)k", text)
    if not m:
        return None
    return float(m.group(1)) if m.group(1) else 1.0
