"""Fig. 8 - what resolution costs: (a) resolver time against the unique host-miss payload of a
call (GLM-like, width 8, batch 32, B = 4,096) with the least-squares rate; (b) single-query
resolver time against hot-cache size without host misses (DeepSeek-like), direct path dotted;
(c) at B = 4,096 with and without 77 host misses per request.

Reads results/fig8/summary.json: host_path_gbps, fit_r2, nomiss_b4096_batch8_us,
nomiss_b4096_batch160_us, miss77_b4096_batch8_us, miss77_b4096_batch160_us, points [{case,
cache, unique_miss_bytes, time_ms}], b_sweep [{B, batch, misses, time_us[, path]}].
"""

from __future__ import annotations

import numpy as np

from figures import common as C
from figures.paper_values import PAPER

NAME = "fig8"
CASE_MARKERS = {"shared": "o", "partial75": "^", "partial": "s", "partial25": "v", "disjoint": "D"}


def fit(points):
    x = np.array([p["unique_miss_bytes"] for p in points], float) / 1e6  # MB
    y = np.array([p["time_ms"] for p in points], float)
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope, icpt = np.polyfit(x, y, 1)
    pred = slope * x + icpt
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else None
    gbps = (1e6 / (slope * 1e-3)) / 1e9 if slope > 0 else None  # MB/ms -> GB/s
    return slope, icpt, r2, gbps


def sweep_val(bs, B, batch, misses=0, path=None):
    for e in bs:
        if (
            int(e.get("B", -1)) == B
            and int(e.get("batch", -1)) == batch
            and int(e.get("misses", 0)) == misses
            and (e.get("path") or None) == path
        ):
            return C.as_float(e.get("time_us"))
    return None


def _bench_points(S: dict) -> list[dict]:
    """Panel (a) points from benchmarks/bench_resolver.py's layout (fig8a.points)."""
    return [
        {
            "case": p.get("pattern"),
            "cache": p.get("cache"),
            "unique_miss_bytes": (C.as_float(p.get("payload_mb")) or 0.0) * 1e6,
            "time_ms": p.get("ms_median"),
            "min_ms": p.get("ms_min"),
            "max_ms": p.get("ms_max"),
        }
        for p in (S.get("fig8a") or {}).get("points") or []
    ]


def _bench_sweep(S: dict) -> list[dict]:
    """Panel (b)/(c) points from the benchmark's layout: kernel time (events, launch excluded)
    where measured, else the do_bench median."""
    out = []
    for e in S.get("fig8b_points") or []:
        if e.get("sweep"):  # tuning sweeps are not the figure
            continue
        t = e.get("us_median_events_guarded", e.get("us_median"))
        path = e.get("path")
        out.append(
            {
                "B": e["B"],
                "batch": e["batch"],
                "misses": 0,
                "time_us": t,
                "path": None if path in (None, "scan") else path,
            }
        )
    for e in S.get("fig8c_points") or []:
        if e.get("misses_per_request") and not e.get("sweep"):  # tuning sweeps are not the figure
            out.append(
                {
                    "B": e["B"],
                    "batch": e["batch"],
                    "misses": e["misses_per_request"],
                    "time_us": e.get("us_median"),
                    "path": None,
                }
            )
    return out


def phase_notes(results) -> list[str]:
    """Where a 77-miss call's time goes, by resolver phase (the kernel's %globaltimer stamps,
    bench_resolver --phase-times), from the newest of results/fig8/phase_times_*.json and the record
    (summary.json) that holds such rows: one line per batch and resolver variant, each phase the
    slowest request's (the call waits for it)."""
    files = sorted((results / NAME).glob("phase_times_*.json")) + [results / NAME / "summary.json"]
    runs = [
        (d.get("date") or "", f.name, d)
        for f in files
        if (d := C.load_json(f)) and any(p.get("phase_times") for p in d.get("fig8c_points") or [])
    ]
    if not runs:
        return []
    _, name, d = max(runs)
    out, seen = [], set()
    for p in d.get("fig8c_points") or []:
        per = p.get("phase_us_slowest_request")
        if not p.get("phase_times") or not isinstance(per, dict):
            continue
        # the settings the call ran with: recorded (``resolved``), else the knobs the row names; a
        # row of an older file without either ran at its commit's defaults, which it does not record
        run = p.get("resolved") or {
            k: p[k] for k in ("copy_programs_per_request", "early_copy", "self_early") if k in p
        }
        S = run.get("copy_programs_per_request")
        if not run:
            how = f"the defaults of commit {d.get('commit', '?')}"
        elif run.get("early_copy"):
            how = f"early copy, {S} copy programs per request" + (
                " (roles by program id)"
                if run.get("pid_roles")
                else " (tickets)"
                if "pid_roles" in run
                else ""
            )
        else:
            how = ("one program per request" if S in (None, 1) else f"{S} programs per request") + (
                ", its first tile read early" if run.get("self_early") else ""
            )
        if (
            p.get("batch"),
            how,
        ) in seen:  # the defaults and a variant that resolves to them: one line
            continue
        seen.add((p.get("batch"), how))
        out.append(
            f"{p.get('misses_per_request', '?')} misses at batch {p.get('batch')}, {how}, by phase "
            "(slowest request, µs): "
            + ", ".join(f"{k} {C.fmt(v)}" for k, v in per.items())
            + f"; the resolver program {C.fmt(p.get('program_us_median'))} of {C.fmt(p.get('us_median'))} µs "
            f"per call ({name}, commit {d.get('commit', '?')}, {d.get('gpu', '?')})."
        )
    return out


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    S = C.load_json(args.results / NAME / "summary.json") or {}
    prov = C.summary_provenance(S, "resolver microbenchmark") if S else ""
    rep = C.Report(NAME, "Fig. 8 - What resolution costs (ours: resolver microbenchmarks)")
    P = PAPER["fig8"]
    pts = [
        p
        for p in S.get("points") or _bench_points(S)
        if C.as_float(p.get("unique_miss_bytes")) is not None
        and C.as_float(p.get("time_ms")) is not None
    ]
    bs = [
        e for e in S.get("b_sweep") or _bench_sweep(S) if C.as_float(e.get("time_us")) is not None
    ]
    f = fit(pts) if pts else None
    fig, axes = C.subplots(1, 3, width=3.7, height=3.0)

    ax = axes[0][0]
    if pts:
        for p in pts:
            mk = CASE_MARKERS.get(str(p.get("case")), "x")
            cold = str(p.get("cache", "cold")) == "cold"
            ax.scatter(
                p["unique_miss_bytes"] / 1e6,
                p["time_ms"],
                marker=mk,
                s=28,
                facecolors=C.PALETTE[0] if cold else "white",
                edgecolors=C.PALETTE[0],
                label=f"{p.get('case')} ({p.get('cache', 'cold')})",
            )
        if f:
            xs = np.linspace(0, max(p["unique_miss_bytes"] for p in pts) / 1e6, 50)
            gb = C.as_float(S.get("host_path_gbps")) or f[3]
            ax.plot(
                xs,
                f[0] * xs + f[1],
                "--",
                color="#555555",
                linewidth=1,
                label=f"fit {C.fmt(gb)} GB/s",
            )
            # the paper's line: its no-miss call plus its host path's rate (MB / (GB/s) = ms)
            ax.plot(
                xs,
                P["nomiss_ms"] + xs / P["host_path_gbps"],
                ":",
                color="black",
                linewidth=1,
                label=f"paper {C.fmt(P['host_path_gbps'])} GB/s",
            )
        ax.set_xlabel("Unique host-miss payload (MB per call)")
        ax.set_ylabel("Resolver time (ms per call)")
        C.legend(ax)
        rep.panel("a", "measured")
    else:
        C.not_measured_panel(ax, "time vs unique host-miss payload")
        rep.panel("a", f"{C.NOT_MEASURED} (time vs host-miss payload)")
    C.panel_title(ax, "a", "GLM-like, width 8, batch 32")

    ax = axes[0][1]
    nomiss = [e for e in bs if int(e.get("misses", 0)) == 0 and not e.get("path")]
    if nomiss:
        for batch, col in ((8, C.PALETTE[0]), (160, C.PALETTE[1])):
            es = sorted((e for e in nomiss if int(e["batch"]) == batch), key=lambda e: e["B"])
            if es:
                ax.plot(
                    [e["B"] for e in es],
                    [e["time_us"] for e in es],
                    marker="o",
                    color=col,
                    label=f"batch {batch}",
                )
        ax.scatter(  # the paper gives the no-miss call's time at B = 4,096
            [4096, 4096],
            [P["nomiss_b4096_batch8_us"], P["nomiss_b4096_batch160_us"]],
            marker="_",
            s=300,
            color="black",
            zorder=3,
            label="paper (B = 4,096)",
        )
        d = sweep_val(bs, 4096, 8, 0, "direct")
        if d is not None:
            ax.axhline(d, linestyle=":", color=C.PALETTE[0], label="direct path, batch 8")
        ax.set_xscale("log", base=2)
        Bs = sorted({int(e["B"]) for e in nomiss})
        ax.set_xticks(Bs)
        ax.set_xticklabels([f"{b:,}" for b in Bs])
        ax.set_xlabel("Hot-cache size B (rows)")
        ax.set_ylabel("Resolver time (µs per call)")
        C.legend(ax)
        rep.panel("b", "measured")
    else:
        C.not_measured_panel(ax, "no-miss time vs hot-cache size")
        rep.panel("b", f"{C.NOT_MEASURED} (time vs B)")
    C.panel_title(ax, "b", "DeepSeek-like, no host miss")

    ax = axes[0][2]
    vals = {}
    for batch in (8, 160):
        for m in (0, 77):
            key = f"{'nomiss' if m == 0 else 'miss77'}_b4096_batch{batch}_us"
            vals[(batch, m)] = C.as_float(S.get(key))
            if vals[(batch, m)] is None:
                vals[(batch, m)] = sweep_val(bs, 4096, batch, m)
    if any(v is not None for v in vals.values()):
        x = np.arange(2)
        for j, (m, lab) in enumerate(((0, "no host miss"), (77, "77 host misses"))):
            ys = [vals[(b, m)] if vals[(b, m)] is not None else np.nan for b in (8, 160)]
            bars = ax.bar(x + (j - 0.5) * 0.38, ys, 0.38, color=C.PALETTE[j], label=lab)
            for rect, y in zip(bars, ys):
                if not np.isnan(y):
                    ax.text(
                        rect.get_x() + rect.get_width() / 2,
                        y,
                        C.fmt(y),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        for j, m in enumerate((0, 77)):  # the paper's calls, on their bars
            key = "nomiss" if m == 0 else "miss77"
            ax.scatter(
                x + (j - 0.5) * 0.38,
                [P[f"{key}_b4096_batch{b}_us"] for b in (8, 160)],
                marker="_",
                s=300,
                color="black",
                zorder=3,
                label="paper" if j == 0 else None,
            )
        ax.set_xticks(x)
        ax.set_xticklabels(["batch 8", "batch 160"])
        ax.set_ylabel("Resolver time (µs per call)")
        C.legend(ax)
        rep.panel("c", "measured")
    else:
        C.not_measured_panel(ax, "B = 4,096 with / without 77 misses")
        rep.panel("c", f"{C.NOT_MEASURED} (misses at B = 4,096)")
    C.panel_title(ax, "c", "DeepSeek-like, B = 4,096")
    fig.tight_layout()

    gb = C.as_float(S.get("host_path_gbps")) or (f[3] if f else None)
    rep.compare(
        "host_path_gbps",
        "host-path rate (least-squares fit)",
        P["host_path_gbps"],
        gb,
        "GB/s",
        prov,
    )
    r2 = C.as_float(S.get("fit_r2")) or (f[2] if f else None)
    rep.compare("fit_r2", "R² of the fit", P["fit_r2"], r2, "", prov)
    rep.compare("cases", "cases in panel a", P["cases"], len(pts) if pts else None, "", prov)
    zero = [p["time_ms"] for p in pts if float(p["unique_miss_bytes"]) == 0]
    rep.compare(
        "nomiss_ms",
        "resolver time with no miss (panel a)",
        P["nomiss_ms"],
        min(zero) if zero else None,
        "ms",
        prov,
    )
    top = max(pts, key=lambda p: p["unique_miss_bytes"]) if pts else None
    rep.compare(
        "max_ms",
        "resolver time at the largest payload",
        P["max_ms"],
        top["time_ms"] if top else None,
        "ms",
        prov,
    )
    rep.compare(
        "max_mb",
        "largest unique host-miss payload",
        P["max_unique_miss_mb"],
        top["unique_miss_bytes"] / 1e6 if top else None,
        "MB",
        prov,
        "ours: our preset's k and row bytes",
    )

    def case_t(case):
        c = [p for p in pts if p.get("case") == case and str(p.get("cache", "cold")) == "cold"] or [
            p for p in pts if p.get("case") == case
        ]
        return max((p["time_ms"] for p in c), default=None)

    rep.compare(
        "disjoint_over_shared",
        "disjoint / shared selections (cold cache)",
        P["disjoint_over_shared"],
        C.ratio(case_t("disjoint"), case_t("shared")),
        "x",
        prov,
    )
    for (batch, m), key in (
        ((8, 0), "nomiss_b4096_batch8_us"),
        ((160, 0), "nomiss_b4096_batch160_us"),
        ((8, 77), "miss77_b4096_batch8_us"),
        ((160, 77), "miss77_b4096_batch160_us"),
    ):
        rep.compare(
            key,
            f"B = 4,096, batch {batch}, {'no miss' if m == 0 else '77 misses'}",
            P[key],
            vals[(batch, m)],
            "µs",
            prov,
        )
    for batch in (8, 160):
        rep.compare(
            f"miss_slowdown_{batch}",
            f"77 misses slow a call at batch {batch}",
            P[f"miss_slowdown_batch{batch}"],
            C.ratio(vals[(batch, 77)], vals[(batch, 0)]),
            "x",
            prov,
        )
    per = [
        (vals[(b, 77)] - vals[(b, 0)]) / b
        for b in (8, 160)
        if None not in (vals[(b, 77)], vals[(b, 0)])
    ]
    rep.compare(
        "miss_cost_per_request",
        "added time per request with 77 misses (mean of both batches)",
        P["miss_cost_us_per_request"],
        float(np.mean(per)) if per else None,
        "µs",
        prov,
    )
    for batch in (8, 160):
        rep.compare(
            f"scan_4x_{batch}",
            f"B 2,048 -> 8,192 without misses, batch {batch}",
            P[f"scan_4x_B_slowdown_batch{batch}"],
            C.ratio(sweep_val(bs, 8192, batch), sweep_val(bs, 2048, batch)),
            "x",
            prov,
        )
    rep.compare(
        "direct_over_scan",
        "scan / direct path at B = 4,096, batch 8",
        P["direct_over_scan_B4096"],
        C.ratio(sweep_val(bs, 4096, 8), sweep_val(bs, 4096, 8, 0, "direct")),
        "x",
        prov,
    )
    # where (b)/(c) came from; why the host path stops short of the bulk rate
    rep.note_reasons(
        str(S[k]) for k in ("a_source", "bc_source", "host_path_line_note") if S.get(k)
    )
    for line in phase_notes(args.results):
        rep.note(line)
    rep.measured_with = prov
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
