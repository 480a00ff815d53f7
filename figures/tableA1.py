"""Table A1 - load-step statistics per phase, optional residency on / off: requests, share fetched
from host, TPOT, tokens/s per session and its gain, TTFT, allocation wait.

Reads the ``phases`` list of results/fig6_h200/<run>/summary.json where that experiment has runs,
else results/fig6/<run>/ (figures/fig6.py; the harness's per-phase statistics;
``host_fetched_share`` is a fraction). The paper's last row covers the time after the in-flight
count returned to 16; ours is the summary's ``phase_after_recovery`` (the same window, at our
low load), or the whole third phase for runs made before the harness recorded it.
"""

from __future__ import annotations

from figures import common as C
from figures.fig6 import step_loads
from figures.paper_values import PAPER, TABLEA1_PHASES
from harness.summaries import arm_of

NAME = "tableA1"
COLS = (  # paper key, our phase key, scale, unit, title
    ("requests", "requests", 1.0, "", "requests"),
    ("host_pct", "host_fetched_share", 100.0, "%", "from host"),
    ("tpot_ms", "tpot_ms_mean", 1.0, "ms", "TPOT"),
    ("tok_s_per_session", "tok_s_per_session", 1.0, "tok/s", "tok/s per session"),
    ("ttft_s", "ttft_ms_mean", 1e-3, "s", "TTFT"),
    ("alloc_wait_s", "alloc_wait_s_mean", 1.0, "s", "allocation wait"),
)
PHASE_LABEL = {
    "C16_before": "C16 before",
    "C256": "C256",
    "C16_after_recovery": "C16 after recovery",
}


def recovery_window(run: C.Run) -> dict | None:
    """The summary's window after recovery where it stands for Table A1's last row: a three-phase
    step whose last phase steps down."""
    rec = run.summary.get("phase_after_recovery")
    return rec if isinstance(rec, dict) and len(run.summary.get("phases") or []) == 3 else None


def phase_rows(run: C.Run | None) -> list[dict]:
    if run is None:
        return []
    ph = list((run.summary.get("phases") or [])[:3])
    rec = recovery_window(run)
    if rec is not None:
        ph[2] = rec
    return ph


def main(argv=None) -> C.Report:
    args = C.parse_args(NAME, __doc__, argv)
    exp, runs = C.load_preferred(args.results, "fig6")
    A = {}
    for r in runs:  # Table A1 needs only the phases, not the counters
        a = arm_of(r)
        if a:
            A[a] = r
    rep = C.Report(
        NAME,
        "Table A1 - Load step, optional residency on / off "
        f"(ours: {C.preset_label(exp)}, time-scaled phases)",
    )
    rep.loads = step_loads(A.values())
    P = PAPER["tableA1"]
    ours = {arm: phase_rows(A.get(arm)) for arm in ("on", "off")}
    for i, ph in enumerate(TABLEA1_PHASES):
        for arm in ("on", "off"):
            row = ours[arm][i] if i < len(ours[arm]) else {}
            prov = C.provenance(A[arm]) if arm in A else ""
            for pk, ok, sc, unit, title in COLS:
                v = C.as_float(row.get(ok))
                rep.compare(
                    f"{ph}.{arm}.{pk}",
                    f"{PHASE_LABEL[ph]}, residency {arm}: {title}",
                    P[ph][arm][pk],
                    None if v is None else v * sc,
                    unit,
                    prov,
                )
        on = ours["on"][i] if i < len(ours["on"]) else {}
        off = ours["off"][i] if i < len(ours["off"]) else {}
        g = C.pct_change(
            C.as_float(on.get("tok_s_per_session")), C.as_float(off.get("tok_s_per_session"))
        )
        rep.compare(
            f"{ph}.gain",
            f"{PHASE_LABEL[ph]}: per-session speed gain (on vs off)",
            P[ph]["gain_pct"],
            g,
            "%",
            C.provenance(list(A.values())) if A else "",
        )

    fig, axes = C.subplots(1, 4, width=3.0, height=2.8)
    cats = [f"{PHASE_LABEL[ph]}\n{arm}" for ph in TABLEA1_PHASES for arm in ("on", "off")]
    colors = [
        C.PALETTE[2] if arm == "on" else C.PALETTE[0]
        for _ in TABLEA1_PHASES
        for arm in ("on", "off")
    ]
    for ax, (pk, ok, sc, unit, title), lt in zip(
        axes[0], (COLS[1], COLS[2], COLS[4], COLS[5]), "abcd"
    ):
        pv = [P[ph][arm][pk] for ph in TABLEA1_PHASES for arm in ("on", "off")]
        ov = []
        for i, _ in enumerate(TABLEA1_PHASES):
            for arm in ("on", "off"):
                row = ours[arm][i] if i < len(ours[arm]) else {}
                v = C.as_float(row.get(ok))
                ov.append(None if v is None else v * sc)
        C.paper_vs_ours_bars(
            ax, cats, pv, ov, f"{title} ({unit})" if unit else title, colors=colors
        )
        C.panel_title(ax, lt, title)
        rep.panel(
            lt, "measured" if any(v is not None for v in ov) else f"{C.NOT_MEASURED} (fig6 phases)"
        )
    C.legend(axes[0][0])
    for arm, r in sorted(A.items()):
        rec = recovery_window(r)
        if rec is not None:
            rep.note(
                f"Residency {arm}: the last row starts {rec.get('recovered_after_s', 0):.1f} s into "
                "the last phase, when the in-flight count returned to its load."
            )
        elif len(r.summary.get("phases") or []) >= 3:
            rep.note(
                f"Residency {arm}: the last row covers the whole last phase (the run has no "
                "window after recovery: made before the harness recorded one, or the higher "
                "load had not drained by the phase's end)."
            )
    rep.measured_with = C.provenance(list(A.values())) if A else ""
    fig.tight_layout()
    return rep.finish(fig, args)


if __name__ == "__main__":
    main()
