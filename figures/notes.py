"""The prose of the figures' notes and diagnoses, built from what runs measured: where a number
came from (provenance), and why a claim at one load comes out as it does (engine time split, step
cost against batch, admission, acceptance, per-run-group ratios with their interval)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from figures.paper_values import label
from figures.report import REASON_SEP, ratio
from figures.stats import ratio_stats
from harness.results import (
    H200_SUFFIX,
    Run,
    accepted_per_round,
    admission_blocked_share,
    as_float,
    change_mix,
    decode_stall_share,
    engine_time_split,
    find_key,
    first_run_count,
    gpu_idle_share,
    graph_replay_share,
    live_window,
    load_runs,
    pick,
    queries_per_round,
    server_loop_busy_share,
    step_cost,
    system_sort_key,
    timing_split,
    values_by_run_group,
)


def batch_scaling_note(runs: Iterable[Run], concurrency: int) -> str | None:
    """At one load: each system's decode step time against the requests it held. Where the
    per-request cost is about equal while one system holds many more requests, holding more
    adds no output: the step grows in proportion to its batch."""
    costs = {}
    for r in runs:
        c = step_cost(r) if r.concurrency == concurrency else None
        if c is not None and c[1] > 0:
            costs[r.system] = c
    if len(costs) < 2:
        return None
    text = ", ".join(
        f"{label(s)} {ms:.1f} ms at {n:.0f} running ({ms / n:.3f} ms each)"
        for s, (ms, n) in sorted(costs.items(), key=lambda kv: system_sort_key(kv[0]))
    )
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
            out += (
                f"; among the {name} systems the step's time grows in proportion to its "
                "batch, so holding more requests adds little output (the scaled model has "
                "little fixed per-step cost, such as weight reads, for a larger batch to "
                "share)"
            )
    return out


def admission_note(runs: Iterable[Run], concurrency: int) -> str | None:
    """At one load: the systems that held well under their slots while requests waited and the
    pool never refused one, i.e. whose admission rate (engine.max_handoffs_per_step handoffs per
    step, done between steps) set how many requests ran, with their steps per second."""
    parts = []
    for r in runs:
        if r.concurrency != concurrency:
            continue
        w = live_window(r, {"dhs_num_waiting_reqs", "dhs_num_slots", "dhs_num_steps", "ts"})
        if w is None:
            continue
        live, a, b = w
        running, waiting = (
            float(live["dhs_num_running_reqs"].mean()),
            float(live["dhs_num_waiting_reqs"].mean()),
        )
        slots = float(live["dhs_num_slots"].max())
        refused = sum(
            float(b[c] - a[c])
            for c in live.columns
            if c.startswith("dhs_admission_wait_events_total")
        )
        wall = float(b["ts"] - a["ts"])
        if wall <= 0 or refused > 0 or waiting < 0.2 * concurrency or running > 0.9 * slots:
            continue
        steps = float(b["dhs_num_steps"] - a["dhs_num_steps"]) / wall
        per = find_key(r.config, "max_handoffs_per_step")
        parts.append(
            f"{label(r.system)} held {running:.0f} running of {slots:.0f} slots with {waiting:.0f} "
            f"waiting and no admission refused by memory: at {steps:.1f} steps/s and "
            f"{per} handoffs per step, admission set the batch"
        )
    if not parts:
        return None
    return (
        f"admission-limited at C{concurrency}: "
        + "; ".join(parts)
        + " (handoffs run between steps in this engine, so a long speculative round admits fewer "
        "requests per second)"
    )


def admission_experiment_note(
    results: str | Path, runs: Iterable[Run], concurrency: int | None = None
) -> str | None:
    """results/admission/ holds runs of a figure's config with a faster admission rate
    (engine.max_handoffs_per_step overridden). Each is set beside the figure's own run of that
    system and load: output, and the requests it held running and waiting."""
    runs = list(runs)
    parts = []
    for a in load_runs(results, "admission"):
        if concurrency is not None and a.concurrency != concurrency:
            continue
        base = pick(runs, a.system, a.concurrency)
        if base is None or a.model != base.model:
            continue

        def held(r: Run) -> str:
            w = live_window(r, {"dhs_num_waiting_reqs"})
            if w is None:
                return ""
            return (
                f", {float(w[0]['dhs_num_running_reqs'].mean()):.0f} running and "
                f"{float(w[0]['dhs_num_waiting_reqs'].mean()):.0f} waiting"
            )

        per_a, per_b = (
            find_key(a.config, "max_handoffs_per_step"),
            find_key(base.config, "max_handoffs_per_step"),
        )
        out_a, out_b = a.num("output_tok_s"), base.num("output_tok_s")
        if not out_a or not out_b or per_a is None:
            continue
        mix = change_mix([a, base])
        caveat = f"; {mix}" if mix else ""
        if a.run_group != base.run_group:
            caveat += (
                f"; the two runs are from different run groups ({a.run_group or '?'}, "
                f"{base.run_group or '?'}), and one config's output moves by up to 40% between GPU machines"
            )
        parts.append(
            f"{label(a.system)} at C{a.concurrency} with {per_a} handoffs per step made "
            f"{out_a:,.0f} tok/s{held(a)}, against {out_b:,.0f} tok/s{held(base)} with "
            f"{per_b if per_b is not None else 'the default'} ({out_a / out_b:.2f}x; "
            f"{a.path.parent.name}/{a.path.name}{caveat})"
        )
    if not parts:
        return None
    return (
        "admission experiment: "
        + "; ".join(parts)
        + ". The figure keeps the experiment's own setting; this run only measures how much of "
        "the gap the admission rate explains"
    )


def paired_ratio_note(
    runs: Iterable[Run],
    pairs: Sequence[tuple[str, str]],
    concurrency: int,
    key: str = "output_tok_s",
) -> str | None:
    """Where the points of a ratio are medians of repeats: the ratio within each run group (runs
    measured together on one GPU machine) that ran both systems, of the medians of every run
    each system has in that group; then the ratio of the medians over all repeats with its
    bootstrap 90% interval. One config's output moves by up to 40% between machines, so a ratio
    of medians over different machines can be further from either machine's own ratio than the
    effect is large."""
    runs = list(runs)
    parts, groups = [], set()
    for a_sys, b_sys in pairs:
        a, b = pick(runs, a_sys, concurrency), pick(runs, b_sys, concurrency)
        if a is None or b is None or (len(a.repeats) < 2 and len(b.repeats) < 2):
            continue
        groups |= {x.run_group for x in (a.repeats or [a]) + (b.repeats or [b])}
        by_group = values_by_run_group({"a": a, "b": b}, key)
        ratios = [
            (g, float(np.median(d["a"]) / np.median(d["b"])))
            for g, d in by_group.items()
            if d.get("a") and d.get("b") and float(np.median(d["b"])) != 0
        ]
        if not ratios:
            continue
        vals = sorted(r for _, r in ratios)
        text = (
            f"{label(a_sys)} / {label(b_sys)} "
            + ", ".join(f"{r:.2f} ({g})" for g, r in ratios)
            + (f", median {float(np.median(vals)):.2f}" if len(vals) > 1 else "")
        )
        st = ratio_stats(a, b, key)
        if st is not None and st.interval:
            text += (
                f"; over all {st.runs[0]} and {st.runs[1]} runs {st.point:.2f}, "
                f"90% {'paired ' if st.paired else ''}interval {st.lo:.2f}-{st.hi:.2f}"
            )
        parts.append(text)
    if not parts:
        return None
    text = f"ratios at C{concurrency} within one run group (its id, or its commit): " + "; ".join(
        parts
    )
    if len(groups) > 1:
        text += ". The figure's ratio is of the repeats' medians, which come from different GPU machines"
    return text


def eager_note(runs: Iterable[Run]) -> str | None:
    """A note naming the systems whose runs replayed no CUDA graph at all (a failed capture
    runs the rest of a server's life eagerly)."""
    eager = sorted({r.system for r in runs if graph_replay_share(r) == 0.0})
    if not eager:
        return None
    return (
        "These runs replayed no CUDA graph, so every step ran eagerly (for hisparse at 2K "
        "context an eager step took 36.6 ms against 4.9 ms replayed, "
        "results/cuda_graph/check-mma-h200.json): "
        + ", ".join(label(s) for s in eager)
        + ". Their server.log names the failed capture."
    )


def no_draft_note(runs: Iterable[Run]) -> str | None:
    """Names the speculative runs whose rounds verified no draft (one query per round: DSpark's
    scheduler found no prefix worth verifying), so they paid for drafting and gained nothing."""
    idle = sorted({r.system for r in runs if (q := queries_per_round(r)) is not None and q <= 1.05})
    if not idle:
        return None
    return (
        "these speculative runs verified no draft (one query per round): "
        + ", ".join(label(s) for s in idle)
        + "; DSpark's scheduler read the random-weight drafter's confidences, also under calibrated "
        "acceptance, until it took the calibrated acceptance as its confidence"
    )


def acceptance_note(runs: Iterable[Run]) -> str | None:
    """Names the speculative runs that verified exactly with the mini models' random-weight
    drafters: they accept (almost) nothing, so their speculation only adds verification cost
    and says nothing about the paper's trained drafters."""
    worst: dict[str, float] = {}
    for r in runs:
        a = accepted_per_round(r)
        if a is None or r.calibrated_acceptance:
            continue
        worst[r.system] = max(a, worst.get(r.system, 0.0))
    if not worst:
        return None
    parts = ", ".join(f"{label(s)} {a:.2f}" for s, a in sorted(worst.items()))
    return (
        "speculative runs with exact acceptance: the mini models' random-weight drafters accepted "
        f"at most {parts} drafts per round, so speculation only added verification cost "
        "(the Fig. 4 and Fig. 5 families use calibrated acceptance since; these runs predate it)"
    )


def diagnosis(runs: Iterable[Run], concurrency: int) -> str | None:
    """Everything that explains a throughput claim at one load: exact acceptance with
    random-weight drafters, rounds that verified no draft, the engine's time split
    (stall_diagnosis), the step's cost against its batch (batch_scaling_note), and admission
    that set the batch (admission_note)."""
    runs = list(runs)
    parts = [
        x
        for x in (
            acceptance_note(runs),
            no_draft_note(runs),
            stall_diagnosis(runs, concurrency),
            batch_scaling_note(runs, concurrency),
            admission_note(runs, concurrency),
        )
        if x
    ]
    return "; ".join(parts) or None


def stall_diagnosis(runs: Iterable[Run], concurrency: int) -> str | None:
    """Why a throughput claim at one load does not hold, from the engine's own time split
    (newer runs) or else the share of seconds without a completed decode step."""
    splits = {r.system: engine_time_split(r) for r in runs if r.concurrency == concurrency}
    splits = {k: v for k, v in splits.items() if v}
    if splits and min(v["decode"] for v in splits.values()) < 0.8:
        parts = "; ".join(
            f"{label(s)} " + ", ".join(f"{k} {100 * x:.0f}%" for k, x in v.items())
            for s, v in sorted(splits.items())
        )
        return (
            f"engine time at C{concurrency} (decode steps / steps that captured a CUDA graph / "
            f"handoffs / other): {parts}"
        )
    shares = {}
    for r in runs:
        if r.concurrency == concurrency:
            v = decode_stall_share(r)
            if v is not None:
                shares[r.system] = v
    if not shares or max(shares.values()) < 0.1:
        return None
    parts = ", ".join(f"{label(s)} {100 * v:.0f}%" for s, v in sorted(shares.items()))
    return (
        f"handoff-bound: at C{concurrency} no decode step completed in {parts} of the seconds "
        "with requests running (arrivals' handoffs ran instead)"
    )


def prefixes_made_while_measuring(r: Run) -> str | None:
    """How many of a run's shared prompts were prefilled (or loaded from DHS_PREFIX_CACHE) on
    its server inside the measured window: from the server's counters over the window where
    they were scraped, else from what the warm-up left (every prefix beyond its requests: the
    first load point a server measured; later points found them made). None when none."""
    npre = int(as_float(find_key(r.config, "prefixes")) or 0)
    if npre < 2:
        return None
    df = r.metrics if (r.path / "server_metrics.parquet").is_file() else None
    cols = ("dhs_num_prefills_total", "dhs_num_prefix_loads_total")
    if df is not None and cols[0] in df.columns and len(df):
        n = sum(float(df[c].iloc[-1] - df[c].iloc[0]) for c in cols if c in df.columns)
        return (
            f"{n:.0f} of {npre} shared prefixes prefilled inside the measured window" if n else None
        )
    warm = int(as_float(r.summary.get("warmup")) or 0)
    if warm >= npre:
        return None
    return (
        f"up to {npre - warm} of {npre} shared prefixes prefilled inside the measured window "
        "(no server counters: what the warm-up left)"
    )


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

    def val(
        self, system: str, concurrency: int | None, key: str, scale: float = 1.0
    ) -> float | None:
        r = self.run(system, concurrency)
        v = None if r is None else r.num(key)
        return None if v is None else v * scale

    def use(self, runs: Iterable[Run]) -> None:
        self._used.extend(runs)

    def take(self) -> str:
        used, self._used = self._used, []
        return provenance(used) if used else ""


def curves_and_claims_label(results, experiment: str, family: str = "GLM") -> str:
    """The preset words of a title whose curves plot the scaled preset's runs of ``experiment``
    while its claim rows come from ``<experiment>_h200`` (h200_ratio_row) where that has runs;
    ``family``: the presets' model family (GLM, DeepSeek)."""
    if load_runs(results, experiment + H200_SUFFIX):
        return f"{family}-like presets: scaled curves, H200 claims"
    return f"{family}-like scaled preset"


def h200_ratio_row(
    rep,
    results,
    experiment: str,
    key: str,
    what: str,
    paper,
    systems,
    paper_c: int,
    gpus: int,
    value_key: str,
) -> bool:
    """The claim row ``key`` (``what`` = "a / b output") from ``<experiment>_h200``, the
    experiment re-run on an H200 preset under the protocol, where it has runs of both
    ``systems`` at ours C = paper C / ``gpus``: the ratio of their medians over the interleaved
    repeats with its interval, the load both ways, the runs' breakdown as the reason where it
    may fail. True when it wrote the row (the caller then files its own runs' ratio apart)."""
    from harness.load_mapping import load_label, ours_concurrency

    c = ours_concurrency(paper_c, gpus)
    # runs that record the paper's load (not another point of the experiment at the same C)
    runs = [
        r
        for r in load_runs(results, experiment + "_h200")
        if r.point.get("paper_concurrency") == paper_c
    ]
    picked = [pick(runs, s, c) for s in systems]
    # an interval needs two repeats a side: a call cut after one stays out until completed
    if any(r is None or len(r.repeats) < 2 for r in picked):
        return False
    model = " / ".join(sorted({r.model or "?" for r in picked}))
    at = f"{load_label(paper_c, c, gpus)} ({model}, interleaved repeats)"
    row = compare_ratio(rep, key, f"{what} at {at}", paper, runs, systems, c, value_key)
    row.ours_c = c  # the claim's load: these runs', whatever the report's other runs ran
    why = claim_breakdown(runs, systems, c)
    if why:
        rep.diagnose((key,), why)
    return True


def compare_ratio(rep, key, quantity, paper, runs, systems, c: int, value_key: str):
    """A row of a / b (``systems``) at ours C ``c`` over ``runs``: the ratio of the two
    systems' medians over their repeats, with its bootstrap interval. Returns the row."""
    a, b = systems
    t = Tracker(runs)
    va, vb = t.val(a, c, value_key), t.val(b, c, value_key)
    return rep.compare(
        key,
        quantity,
        paper,
        ratio(va, vb),
        "x",
        t.take(),
        stats=ratio_stats(pick(runs, a, c), pick(runs, b, c), value_key),
    )


@cache
def _preset_geometry(name: str) -> dict | None:
    """The geometry (systems/models/config.GEOMETRY_KEYS) of model preset ``name`` as
    conf/model/ composes it today; None where no such preset exists."""
    from figures.presets import model_config
    from systems.models.config import GEOMETRY_KEYS

    if not (Path(__file__).resolve().parents[1] / "conf" / "model" / f"{name}.yaml").exists():
        return None
    m = model_config(name)
    return {k: getattr(m, k) for k in GEOMETRY_KEYS}


def geometry_change(run: Run) -> str:
    """Where the run's model section differs from its preset's geometry today, what it
    measured ('measured on an earlier <preset> geometry (key old, now new)'): a re-run draws
    other random weights of other shapes, so its numbers are not this preset's; else ''."""
    m = run.config.get("model") or {}
    now = _preset_geometry(str(m.get("name"))) if m.get("name") else None
    if not now:
        return ""

    def same(a, b) -> bool:
        return list(a) == list(b) if isinstance(b, (list, tuple)) else a == b

    moved = [f"{k} {m[k]}, now {now[k]}" for k in now if k in m and not same(m[k], now[k])]
    if not moved:
        return ""
    return f"measured on an earlier {m['name']} geometry ({'; '.join(moved)})"


# The provenance tags that are caveats on a claim wherever it stands (the headline table's
# "why not; caveats" column), one pattern per tag this module or harness.results writes:
# geometry_change's, and change_mix's runs-before-later-changes note (its text has "; " inside
# its brackets, so tags are found by pattern, not by splitting the provenance).
CAVEAT_PATTERNS = (
    re.compile(r"measured on an earlier [^;]*\)"),
    re.compile(r"made before \d+ later chang[^;]*;[^)]*\)"),
    re.compile(r"runs on several GPUs \([^)]*\)"),
)


def caveats(prov: str) -> list[str]:
    """The caveat tags of a provenance (CAVEAT_PATTERNS), the first of each kind."""
    found = (pattern.search(prov or "") for pattern in CAVEAT_PATTERNS)
    return [m.group(0) for m in found if m]


def provenance(runs: Iterable[Run] | Run | None, extra: str | None = None) -> str:
    """Where a measured number came from: scaled preset / calibrated input(s), device."""
    if runs is None:
        return extra or ""
    runs = [runs] if isinstance(runs, Run) else list(runs)
    tags: list[str] = []

    def add(t: str) -> None:
        if t and t not in tags:
            tags.append(t)

    for r in runs:
        model = r.model
        add(f"scaled preset ({model})" if model else "scaled preset")
        add(geometry_change(r))
        loc = as_float(find_key(r.config, "selection_locality"))
        if loc is None:
            loc = as_float(r.summary.get("selection_locality"))
        if loc:
            add(f"calibrated input: selection locality {loc:g}")
            # a greedy output of random weights can fall into a short token cycle, which
            # fetches nothing from host: the share then depends on the prompt (docs/presets.md)
            temp = as_float(find_key(r.config, "temperature"))
            add(f"outputs sampled at temperature {temp:g}" if temp else "greedy outputs")
        if r.calibrated_acceptance:
            add("calibrated input: acceptance")
        prof = ((r.config or {}).get("profile") or {}).get("name")
        if prof and prof != "none":
            # a collector's work (torch.profiler's recording, host stack samples) shares the
            # run's machine: its times are the profiled server's
            add(f"profiled run ({prof} collector on during the load)")
        lend = find_key(r.config, "lend_index_store")
        if find_key(r.config, "optional_residency") and not lend:
            # sec. 3.1's unused index backing: these runs kept optional history to payload pages
            before = "" if lend is False else " (run before free slots' index history was lent)"
            add("optional history in spare payload pages only" + before)
        made = prefixes_made_while_measuring(r)
        if made:
            # a prefix first met while measuring is prefilled (or loaded) on the serving GPU then
            add(made)
        if len(r.repeats) > 1:
            commits = sorted({x.commit for x in r.repeats if x.commit})
            # the spread is part of the number: one config's output differs by up to 40% between
            # GPU machines (the engine thread runs on the host CPU)
            outs = [as_float(x.summary.get("output_tok_s")) for x in r.repeats]
            details = []
            if all(o is not None for o in outs):
                details.append(
                    f"{label(r.system)} output " + " / ".join(f"{o:,.0f}" for o in outs) + " tok/s"
                )
            if len(commits) > 1:
                details.append("commits " + ", ".join(commits))
            add(
                f"median of {len(r.repeats)} repeat runs"
                + (f" ({'; '.join(details)})" if details else "")
            )
        dev = r.summary.get("gpu") or r.summary.get("device")
        if dev and str(dev) not in ("cpu",):
            add(str(dev))
        elif dev == "cpu":
            add("CPU run")
    add(change_mix(runs))
    # one number from runs on two kinds of GPU (a machine asked for an H200 may be an H100):
    # their times do not compare
    gpus = sorted(
        {str(x.summary["gpu"]) for r in runs for x in (r.repeats or [r]) if x.summary.get("gpu")}
    )
    if len(gpus) > 1:
        add(f"runs on several GPUs ({', '.join(gpus)})")
    # a run is finished with some requests failed (never all): its numbers count the rest
    failed = [(x, int(x.summary.get("errors") or 0)) for r in runs for x in (r.repeats or [r])]
    failed = [(x, n) for x, n in failed if n > 0]
    if failed:
        n_req = sum(n + int(x.summary.get("completed") or 0) for x, n in failed)
        add(
            f"{len(failed)} run(s) with failed requests ({sum(n for _, n in failed)} of {n_req} "
            "requests; their numbers count the successful ones)"
        )
    n_first, n_all = first_run_count(runs)
    if n_first:
        add(
            f"{n_first} of {n_all} runs the first of their system on a fresh machine "
            f"(such a run measured up to 2x slower; results/cold_cache/)"
        )
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


def median_over_repeats(run: Run, read) -> Any:
    """``read`` of each of the run's repeats (the run alone without any), as their median: a
    number's median, or a dict's median per key; None where no repeat has it."""
    vals = [v for v in (read(x) for x in (run.repeats or [run])) if v is not None]
    if not vals:
        return None
    if isinstance(vals[0], dict):
        keys = [k for k in vals[0] if all(v.get(k) is not None for v in vals)]
        return {k: float(np.median([v[k] for v in vals])) for k in keys}
    return float(np.median(vals))


def _admission(run: Run) -> dict | None:
    """Requests waiting, slots, and decode steps per second (admission runs between steps) while
    requests were running."""
    w = live_window(run, {"dhs_num_waiting_reqs", "dhs_num_slots", "dhs_num_steps", "ts"})
    if w is None:
        return None
    live, a, b = w
    wall = float(b["ts"] - a["ts"])
    steps = float(b["dhs_num_steps"] - a["dhs_num_steps"])
    return {
        "waiting": float(live["dhs_num_waiting_reqs"].mean()),
        "slots": float(live["dhs_num_slots"].max()),
        "steps_per_s": steps / wall if wall > 0 else None,
    }


def breakdown(run: Run) -> str | None:
    """What one run measured about where its time went, as numbers only, each the median over
    the run's repeats: the decode step's cost against the batch it carried (step_cost), the
    requests waiting with the slots and steps per second that admit them, the engine thread's
    time split (engine_time_split), the mean time to first
    token split into allocation wait, handoff and the rest (the request records, else the
    summary's handoff), and accepted drafts per round."""
    parts = []
    sc = step_cost(run)
    if sc is not None:
        parts.append(f"step {sc[0]:.1f} ms at {sc[1]:.0f} running")
    adm = median_over_repeats(run, _admission)
    if adm and "waiting" in adm:
        parts.append(
            f"{adm['waiting']:.0f} waiting for {adm['slots']:.0f} slots"
            + (f" at {adm['steps_per_s']:.1f} steps/s" if adm.get("steps_per_s") else "")
        )
    split = median_over_repeats(run, engine_time_split)
    if split:
        parts.append("engine time " + " / ".join(f"{k} {100 * v:.0f}%" for k, v in split.items()))
    blocked = median_over_repeats(run, admission_blocked_share)
    if blocked is not None:
        parts.append(
            f"admission off the CPU (GIL, sleeping waits) {100 * blocked:.0f}% of its time"
        )
    idle = median_over_repeats(run, gpu_idle_share)
    if idle is not None:
        parts.append(f"GPU without a step {100 * idle:.0f}% of its serving time")
    loop = median_over_repeats(run, server_loop_busy_share)
    if loop is not None:
        parts.append(f"server event loop on the CPU {100 * loop:.0f}% of the time")
    tt = median_over_repeats(run, lambda x: timing_split(x, post_wave=False) if x.records else None)
    if tt and tt.get("ttft_s") is not None and tt.get("handoff_s") is not None:
        parts.append(
            f"TTFT {tt['ttft_s']:.2f} s = allocation wait {1e3 * tt.get('alloc_wait_s', 0.0):.0f} ms"
            f" + handoff {1e3 * tt['handoff_s']:.0f} ms + other {tt.get('other_s', 0.0):.2f} s"
        )
    else:
        h = run.num("handoff_s_mean")
        if h is not None:
            parts.append(f"handoff {1e3 * h:.0f} ms per request")
    acc = median_over_repeats(run, accepted_per_round)
    if acc is not None:
        parts.append(f"{acc:.2f} drafts accepted per round")
    return ", ".join(parts) if parts else None


def claim_breakdown(runs: Iterable[Run], systems: Sequence[str], concurrency: int) -> str | None:
    """The measured breakdown (``breakdown``) of each compared system's run at one load, for the
    "why not" of a claim between them; None where no run has any of it."""
    runs = list(runs)
    parts = []
    for s in systems:
        r = pick(runs, s, concurrency)
        b = breakdown(r) if r is not None else None
        if b:
            parts.append(f"{label(s)} at C{concurrency}: {b}")
    return REASON_SEP.join(parts) if parts else None  # a note per system
