"""Regenerate every figure and table from results/, then write REPRODUCTION.md and
results/claims.json.

    python -m figures.make_all [--results DIR] [--out DIR] [--report FILE] [--only fig4,table2]

Each script runs in this process (none touches a GPU); a script that fails is reported in
REPRODUCTION.md and the others still run. claims.json has one entry per headline claim with the
paper's value, ours (null when not measured) with its bootstrap 90% interval, whether the claim
holds in our runs (null when not measured or untested) and the criterion used (figures/claims.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from figures import common as C
from figures.claims import (
    CLAIMS,
    DIRECTION,
    EQ13,
    GEOMETRY,
    MAGNITUDE,
    MAGNITUDE_TOLERANCE,
    THRESHOLD,
    criterion_text,
    judge,
    ours_load,
)
from figures.report import REASON_SEP
from harness.load_mapping import PAPER_DECODE_GPUS
from harness.results import start_read_log

SCRIPTS = (
    "table1",
    "fig1",
    "fig4",
    "table2",
    "tableA2",
    "tableA3",
    "fig5",
    "fig6",
    "tableA1",
    "fig7",
    "fig8",
    "fig9",
    "table3",
    "fig10",
    "fig11",
)


def build_claims(reports: dict[str, C.Report]) -> dict:
    out = {}
    for cid, cl in CLAIMS.items():
        rep = reports.get(cl.report)
        row = rep.row(cl.key) if rep else None
        ours = row.ours if row else None
        p = C.paper_number(cl.paper)
        holds, untested = judge(cl, row, rep)
        ours_c = ours_load(cl, row, rep)
        out[cid] = {
            "claim": cl.text,
            "kind": cl.kind,
            "paper": p,
            "ours": ours,
            "interval_90": list(row.interval) if row is not None and row.interval else None,
            "interval_paired": bool(row is not None and row.stats and row.stats.paired),
            "run_group_ratios": list(row.stats.group_ratios)
            if row is not None and row.stats
            else None,
            "holds": holds,
            "criterion": criterion_text(cl),
            "paper_concurrency": cl.paper_c,
            "ours_concurrency": ours_c,
            "ratio": (ours / p) if (ours is not None and p) else None,
            "source": f"figures/{cl.report}.py ({cl.key})",
            "paper_source": C.paper_source(cl.paper),
            "provenance": row.prov if row and row.measured else C.NOT_MEASURED,
        }
        if cl.kind == EQ13:  # the measured ratios the criterion compares
            meas = rep.row(cl.arg) if rep else None
            out[cid]["ours_measured"] = meas.ours if meas else None
            out[cid]["paper_measured"] = C.paper_number(meas.paper) if meas else None
        why = rep.why.get(cl.key) if rep else None
        if untested:
            out[cid]["why_not"] = untested + (f"{REASON_SEP}{why}" if why else "")
        elif why and holds is False:
            out[cid]["why_not"] = why
    return out


def _holds_text(c: dict) -> str:
    h = {True: "yes", False: "**no**", None: "—"}[c["holds"]]
    return "untested" if c["holds"] is None and c["ours"] is not None else h


def _ours_text(c: dict) -> str:
    ours = C.fmt(c["ours"]) if c["ours"] is not None else f"*{C.NOT_MEASURED}*"
    if c["kind"] == EQ13 and c["ours"] is not None and c.get("ours_measured") is not None:
        # the criterion compares these, not the prediction with the paper's
        paper = c.get("paper_measured")
        ours += f" predicted, {C.fmt(c['ours_measured'])} measured" + (
            f" (paper measured {C.fmt(paper)})" if paper is not None else ""
        )
    if c["interval_90"]:
        paired = "paired " if c.get("interval_paired") else ""
        ours += f" ({paired}{C.fmt(c['interval_90'][0])}–{C.fmt(c['interval_90'][1])})"
    return ours


def _load_text(c: dict) -> str:
    if c["ours_concurrency"]:
        return f"C{c['paper_concurrency']} / C{c['ours_concurrency']}"
    return f"C{c['paper_concurrency']} / —" if c["paper_concurrency"] else "—"


def _claims_table(claims: dict, kinds: set[str], notes: C.Footnotes) -> list[str]:
    """Every claim on its own row with its criterion and provenance (figures/out/headline.md)."""
    lines = [
        "| claim | load: paper / ours on one H200 | paper | ours (90% interval) | holds | criterion "
        "| ours from | measured reason, where it does not hold |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in claims.values():
        if c["kind"] not in kinds:
            continue
        prov = (
            c["provenance"] if c["provenance"] == C.NOT_MEASURED else notes.sources(c["provenance"])
        )
        why = notes.reasons(c["why_not"]) if c.get("why_not") else ""  # a note per reason
        # a magnitude row follows the direction row of its ratio
        text = "↳ by the paper's factor" if c["kind"] == MAGNITUDE else c["claim"]
        lines.append(
            f"| {text} | {_load_text(c)} | {C.fmt(c['paper'])} | {_ours_text(c)} | "
            f"{_holds_text(c)} | {c['criterion']} | {prov} | {why} |"
        )
    return lines


def _headline_table(claims: dict, notes: C.Footnotes) -> list[str]:
    """The measured claims, one row per claim: a ratio's direction and magnitude side by side,
    a bound's or eq. 13's verdict with its criterion; the reasons are numbered notes."""
    lines = [
        "| claim | load: paper / ours | paper | ours (90% interval) | direction holds "
        "| factor (±30%) or bound holds | why not; caveats |",
        "|---|---|---|---|---|---|---|",
    ]
    for cid, c in claims.items():
        if c["kind"] in (GEOMETRY, MAGNITUDE):
            continue
        why = [c.get("why_not", "")]
        if c["kind"] == DIRECTION:
            magnitude = claims[f"{cid}_magnitude"]
            direction, bound = _holds_text(c), _holds_text(magnitude)
            why.append(magnitude.get("why_not", ""))
        else:
            criterion = c["criterion"]
            direction = "—"
            bound = f"{_holds_text(c)} " + (
                f"({criterion})" if len(criterion) <= 20 else notes.ref(criterion)
            )
        # runs of a preset whose geometry changed since, or made before changes that move the
        # numbers: said wherever the claim stands
        caveats = C.caveats(c.get("provenance") or "")
        # the direction's and the magnitude's reasons share their notes
        cited = "".join(notes.reasons(w) for w in why if w) + "".join(
            notes.sources(w) for w in caveats if w
        )
        refs = dict.fromkeys(re.findall(r"\[\d+\]", cited))
        lines.append(
            f"| {c['claim']} | {_load_text(c)} | {C.fmt(c['paper'])} | {_ours_text(c)} | "
            f"{direction} | {bound} | {''.join(refs)} |"
        )
    return lines


def _headline_intro(measured: list[dict]) -> list[str]:
    held = sum(1 for c in measured if c["holds"] is True)
    failed = sum(1 for c in measured if c["holds"] is False)
    untested = sum(1 for c in measured if c["holds"] is None and c["ours"] is not None)
    # a claim's provenance names the preset its runs used (or the _h200 experiment's summary)
    on_h200 = sum(1 for c in measured if "_h200" in (c.get("provenance") or ""))
    return [
        f"{held} of {len(measured)} measured claims hold, {failed} do not, {untested} are untested "
        "(no interval). A ratio the paper reports is two claims: its direction holds when the "
        'whole bootstrap 90% interval over the repeat runs is on the paper\'s side of 1 ("paired": '
        "the bootstrap resampled interleaved pairs of runs, measured back to back on one "
        "machine), its "
        f"magnitude when ours is within ±{MAGNITUDE_TOLERANCE:.0%} of the paper's. Loads: one H200 "
        f"stands for one of the paper's {PAPER_DECODE_GPUS} decode GPUs (paper C128 = ours C32 "
        "on one H200); the load column gives the paper's C and the one our runs used. "
        f"{on_h200} of the {len(measured)} come from runs on the H200 presets derived from the "
        "paper (docs/presets.md), which follow the mapping; the others from a kernel benchmark "
        "or from runs on the mini presets, most made before the mapping (ours C128 on one H200 = "
        "paper C512 per decode GPU), until their `<experiment>_h200` re-runs exist.",
        "",
    ]


def write_headline(path: Path, claims: dict) -> None:
    """The headline claims in full: each claim on its own row with its criterion, the runs it
    was measured on and its measured reason, as numbered notes."""
    measured = [c for c in claims.values() if c["kind"] != GEOMETRY]
    lines = ["# Headline claims", "", *_headline_intro(measured)]
    notes = C.Footnotes()
    lines += _claims_table(claims, {DIRECTION, MAGNITUDE, EQ13, THRESHOLD}, notes) + [""]
    lines += notes.markdown()
    notes = C.Footnotes()
    lines += ["## Arithmetic on the paper's geometry (computed, not measured)", ""]
    lines += _claims_table(claims, {GEOMETRY}, notes) + [""] + notes.markdown()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _stale_runs_note(results: Path) -> list[str]:
    """A paragraph naming the experiments with committed runs and pending runs of their plan
    (points not yet measured, or a config changed after the runs: new run ids), whose figures
    read the committed runs until the re-run."""
    from harness import reproduce as rp

    stale = []
    for exp in rp.experiments():
        d = results / exp
        if not d.is_dir() or not any(
            p.is_dir() and not p.name.startswith(".") for p in d.iterdir()
        ):
            continue
        done, pending = rp.plan_status(exp, str(results))
        if pending:
            stale.append(f"`{exp}` ({pending} of {done + pending} planned runs)")
    if not stale:
        return []
    return [
        "Pending runs: " + ", ".join(stale) + " of experiments that have committed runs: "
        "points not yet measured, or a configuration changed after the committed runs (new run "
        "ids), which the figures read until the re-run; each figure's provenance says what its "
        "runs were made with.",
        "",
    ]


def noise_rows(results: Path) -> list[dict]:
    """Every point of the H200 experiments measured at least twice within one run group (one
    GPU call): its output's spread, (max - min) / median over those runs, against issue 23's
    bound. The effects a claim compares must stand above this noise."""
    rows = []
    for d in sorted(p for p in Path(results).glob(f"*{C.H200_SUFFIX}*") if p.is_dir()):
        for run in C.load_runs(results, d.name):
            for group, (sp, n) in C.within_call_spread(run, "output_tok_s").items():
                # the group's runs of this point in the order they started
                mine = sorted(
                    (x for x in (run.repeats or [run]) if x.run_group == group),
                    key=lambda x: str(x.env.get("time_utc") or ""),
                )
                vals = [v for v in (C.run_value(x, "output_tok_s") for x in mine) if v]
                rows.append(
                    {
                        "experiment": d.name,
                        "point": run.path.name.split("-rep")[0],
                        "group": group,
                        "runs": n,
                        "lo": min(vals),
                        "hi": max(vals),
                        "spread": sp,
                        # where the slowest run came (1: first): a cold first run shows as 1
                        "slowest": vals.index(min(vals)) + 1,
                    }
                )
    return rows


def write_noise(path: Path, rows: list[dict], report_dir: Path) -> list[str]:
    """figures/out/noise.md (every repeated point) and REPRODUCTION.md's section (per
    experiment: points within the bound, the largest spread)."""
    bound = C.SPREAD_TARGET
    full = [
        "# Noise within one GPU call",
        "",
        f"Each point measured two or more times in one run group; spread = (max - min) / median "
        f"of its output (tok/s), bound {bound:.0%} (issue 23).",
        "",
        "| experiment | point | run group | runs | output tok/s | spread | within bound "
        "| slowest run (in start order) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pos = r.get("slowest")
        where = "-" if pos is None else f"{pos} of {r['runs']}"
        full.append(
            f"| {r['experiment']} | {r['point']} | {r['group'].split('/')[0]} | {r['runs']} "
            f"| {r['lo']:,.0f}-{r['hi']:,.0f} | {r['spread']:.1%} "
            f"| {'yes' if r['spread'] <= bound else '**no**'} | {where} |"
        )
    path.write_text("\n".join(full) + "\n")
    if not rows:
        return []
    within = sum(r["spread"] <= bound for r in rows)
    outside = [r for r in rows if r["spread"] > bound]
    first = sum(r.get("slowest") == 1 for r in outside)
    cold = (
        f" In {first} of the {len(outside)} outside it the slowest run is the first of its group "
        "to start (a cold first run rather than noise throughout)."
        if outside
        else ""
    )
    lines = [
        "## Noise within one call",
        "",
        f"{within} of {len(rows)} points measured repeatedly within one GPU call stay within "
        f"the {bound:.0%} spread bound (every point: "
        f"[{path.name}]({os.path.relpath(path, report_dir)})).{cold}",
        "",
        "| experiment | points | within bound | largest spread |",
        "|---|---|---|---|",
    ]
    by_exp: dict[str, list[dict]] = {}
    for r in rows:
        by_exp.setdefault(r["experiment"], []).append(r)
    for exp, rs in by_exp.items():
        worst = max(rs, key=lambda r: r["spread"])
        lines.append(
            f"| {exp} | {len(rs)} | {sum(r['spread'] <= bound for r in rs)} "
            f"| {worst['spread']:.1%} ({worst['point']}) |"
        )
    return lines + [""]


def write_report(
    path: Path, reports: dict, failures: dict, claims: dict, out_dir: Path, results: Path
) -> None:
    """REPRODUCTION.md: the headline claims and, per figure, its compact table; the full reports
    (provenance, run lists, extra tables, notes) are out_dir's <name>.md and headline.md."""
    measured = [c for c in claims.values() if c["kind"] != GEOMETRY]
    headline = out_dir / "headline.md"
    write_headline(headline, claims)
    detail = os.path.relpath(headline, path.parent)
    lines = [
        "# Reproduction of *Adaptive DHiSparse* - paper vs ours",
        "",
        "Generated by `python -m figures.make_all` from the files under "
        f"`{os.path.relpath(results, path.parent)}/`; every script reads results only (no GPU). "
        "Each number says where ours came from: *computed* (capacity accounting), a *scaled "
        "preset* run (the mini models on one H200), and whether a *calibrated input* "
        "(selection locality, acceptance) was involved. Missing numbers are marked "
        f"*{C.NOT_MEASURED}*; nothing is filled in. This file is the summary: each figure's "
        "full report beside its image (figures/out/<name>.md) gives every number's provenance, "
        "run lists and notes.",
        "",
        *_stale_runs_note(results),
        "## Headline claims",
        "",
        *_headline_intro(measured),
    ]
    notes = C.Footnotes()
    lines += _headline_table(claims, notes) + [""] + notes.markdown()
    lines += [
        f"Each claim's criterion and the runs it was measured on: [{detail}]({detail}).",
        "",
    ]
    notes = C.Footnotes()
    lines += ["### Arithmetic on the paper's geometry (computed, not measured)", ""]
    lines += _claims_table(claims, {GEOMETRY}, notes) + [""] + notes.markdown()
    lines += write_noise(out_dir / "noise.md", noise_rows(results), path.parent)
    lines += ["## Index", "", "| figure / table | numbers measured | panels |", "|---|---|---|"]
    for name, rep in reports.items():
        pan = ", ".join(
            f"{k}: {'yes' if C.NOT_MEASURED not in v else 'no'}" for k, v in rep.panels.items()
        )
        lines.append(f"| [{rep.title}](#{name}) | {rep.n_measured} / {len(rep.rows)} | {pan} |")
    for name, err in failures.items():
        lines.append(f"| {name} | **script failed** | `{err}` |")
    lines.append("")
    for name, rep in reports.items():
        img = os.path.relpath(out_dir / f"{name}.png", path.parent)
        md = os.path.relpath(out_dir / f"{name}.md", path.parent)
        lines += [f'<a id="{name}"></a>', "", rep.summary_markdown(2, img, md), ""]
    if failures:
        lines += (
            ["## Scripts that failed", ""] + [f"- `{n}`: {e}" for n, e in failures.items()] + [""]
        )
    path.write_text("\n".join(lines))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m figures.make_all",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    ap.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get("DHS_RESULTS", C.DEFAULT_RESULTS)),
        help="the results tree the scripts read (default results/, or $DHS_RESULTS)",
    )
    ap.add_argument(
        "--out", type=Path, default=C.DEFAULT_OUT, help="where figures go (figures/out/)"
    )
    ap.add_argument(
        "--report",
        type=Path,
        default=None,
        help="the summary to write (default REPRODUCTION.md; with --only, none unless given)",
    )
    ap.add_argument(
        "--claims",
        type=Path,
        default=None,
        help="the claims file to write (default <results>/claims.json; with --only, none "
        "unless given)",
    )
    ap.add_argument("--dpi", type=int, default=150, help="figure resolution (default 150)")
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of the scripts: {', '.join(SCRIPTS)}",
    )
    ap.add_argument("--quiet", action="store_true", help="do not print each script's table")
    ap.add_argument(
        "--inputs",
        type=Path,
        default=None,
        help="also write the request records and server samples the scripts read, as JSON "
        "(harness.compact --prune-unused keeps exactly these)",
    )
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        ap.error(f"--results {args.results}: no such directory")
    names = [n for n in (args.only.split(",") if args.only else SCRIPTS) if n]
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        ap.error(f"--only: unknown script(s) {unknown}; the scripts are {', '.join(SCRIPTS)}")
    # the summary and the claims cover every script: a subset would overwrite them with a part
    report_path, claims_path = args.report, args.claims
    if not args.only:
        report_path = report_path or C.REPO / "REPRODUCTION.md"
        claims_path = claims_path or args.results / "claims.json"
    read_log = start_read_log() if args.inputs else None
    reports: dict[str, C.Report] = {}
    failures: dict[str, str] = {}
    t0 = time.perf_counter()
    for name in names:
        mod = importlib.import_module(f"figures.{name}")
        sub = ["--results", str(args.results), "--out", str(args.out), "--dpi", str(args.dpi)]
        if args.quiet:
            sub.append("--quiet")
        try:
            reports[name] = mod.main(sub)
        except Exception as e:  # noqa: BLE001 - one broken script must not hide the others
            failures[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    claims = build_claims(reports)
    wrote = []
    if claims_path is not None:
        claims_path.parent.mkdir(parents=True, exist_ok=True)
        claims_path.write_text(json.dumps(claims, indent=1) + "\n")
        wrote.append(str(claims_path))
    if report_path is not None:
        write_report(report_path, reports, failures, claims, args.out, args.results)
        wrote.insert(0, str(report_path))
    if read_log is not None:
        args.inputs.write_text(json.dumps(read_log.as_json(args.results), indent=1) + "\n")
    print(
        f"[make_all] {len(reports)} scripts ok, {len(failures)} failed in "
        f"{time.perf_counter() - t0:.1f} s -> "
        + (
            ", ".join(wrote)
            if wrote
            else f"{args.out} (--only: REPRODUCTION.md and claims.json left as they are)"
        )
    )
    if failures:
        print("[make_all] failed: " + ", ".join(failures), file=sys.stderr)
    return {"reports": reports, "failures": failures, "claims": claims}


if __name__ == "__main__":
    res = main()
    sys.exit(1 if res["failures"] else 0)
