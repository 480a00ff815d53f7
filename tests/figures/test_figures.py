"""Figure scripts: every script on a synthetic results tree and on an empty one, the paper-values
file, and the tolerant loader. Runs the scripts in-process at a low DPI (Agg backend)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from figures import common as C
from figures import make_all
from figures.paper_values import AMBIGUITIES, PAPER, PV, flatten, get
from figures.report import CELL_MAX, fold_grids
from harness import results as R
from tests.figures.fixture import build

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = make_all.SCRIPTS
ROW = re.compile(r"^\| (?P<q>[^|]+) \| (?P<paper>[^|]+) \| (?P<ours>[^|]+) \| (?P<ratio>[^|]+) \|")

# one test worker runs the module (make test: --dist loadgroup), so that the module-scoped
# ``full`` and ``empty`` runs of make_all (most of the module's time) are built once, not once
# per worker
pytestmark = pytest.mark.xdist_group("test_figures")


def _run_all(results: Path, tmp: Path) -> dict:
    out = tmp / "out"
    res = make_all.main(
        [
            "--results",
            str(results),
            "--out",
            str(out),
            "--report",
            str(tmp / "REPRODUCTION.md"),
            "--dpi",
            "30",
            "--quiet",
        ]
    )
    res["out"] = out
    res["report"] = tmp / "REPRODUCTION.md"
    res["results"] = results
    return res


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    # REPRODUCTION.md's pending-runs paragraph left out: it composes the config of every run the
    # fixture's experiments plan (half of make_all's time here, once per test worker), and the
    # fixture's runs, named by hand, are never the plan's runs; its own test is below
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(make_all, "_stale_runs_note", lambda results: [])
        return _run_all(build(tmp / "results"), tmp)


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("empty")
    (tmp / "results").mkdir()
    return _run_all(tmp / "results", tmp)


def _rows(md: str) -> list[dict]:
    rows = []
    for line in md.splitlines():
        m = ROW.match(line)
        if m and m.group("q") not in ("quantity", "---"):
            rows.append({k: v.strip() for k, v in m.groupdict().items()})
    return rows


# ------------------------------------------------------------------------------------- scripts
def test_no_script_fails(full, empty):
    assert full["failures"] == {}
    assert empty["failures"] == {}
    assert set(full["reports"]) == set(SCRIPTS)


def test_a_subset_leaves_the_summary_and_the_claims_alone(tmp_path, monkeypatch):
    """REPRODUCTION.md and claims.json cover every script: --only draws its figures and writes
    neither (unless asked), where it used to overwrite both with the subset's claims."""
    monkeypatch.setattr(C, "REPO", tmp_path)  # where REPRODUCTION.md would go
    res = tmp_path / "results"
    res.mkdir()
    out = tmp_path / "out"
    make_all.main(["--results", str(res), "--out", str(out), "--only", "fig7", "--quiet"])
    assert (out / "fig7.png").is_file()
    assert not (tmp_path / "REPRODUCTION.md").exists() and not (res / "claims.json").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--only", "fig99"], "unknown script(s) ['fig99']"),
        (["--results", "/nonexistent/results"], "no such directory"),
    ],
)
def test_a_bad_argument_is_a_usage_error(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        make_all.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_on_fixture(full, name):
    png, md = full["out"] / f"{name}.png", full["out"] / f"{name}.md"
    assert png.is_file() and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert f"![{name}]({name}.png)" in text
    rows = _rows(text)
    assert rows, f"{name}: no paper-vs-ours rows"
    measured = [r for r in rows if C.NOT_MEASURED not in r["ours"]]
    assert measured, f"{name}: nothing measured on the fixture"
    r = measured[0]
    assert re.search(r"\d", r["paper"]) and re.search(r"\d", r["ours"])
    # every measured number says where it came from
    for line in text.splitlines():
        m = ROW.match(line)
        if m and C.NOT_MEASURED not in m.group("ours") and m.group("q") not in ("quantity", "---"):
            assert line.rstrip().split("|")[-2].strip(), (
                f"{name}: a measured row without provenance"
            )


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s != "table1"])
def test_script_on_empty_results(empty, name):
    png, md = empty["out"] / f"{name}.png", empty["out"] / f"{name}.md"
    assert png.is_file() and md.is_file()
    text = md.read_text()
    assert C.NOT_MEASURED in text
    assert "## Not yet measured" in text
    rep = empty["reports"][name]
    assert any(C.NOT_MEASURED in v for v in rep.panels.values()), rep.panels
    # never invented: nothing measured unless it is computed from geometry
    for row in rep.rows:
        if row.measured:
            assert row.prov.startswith("computed"), (name, row.quantity, row.prov)


def test_table1_always_has_values(empty):
    rep = empty["reports"]["table1"]
    assert rep.rows and all(r.measured for r in rep.rows)
    assert rep.value("resident.gpu_100k") == pytest.approx(4.444, abs=5e-4)
    # panels e, f: the H200 presets' derivation beside the paper's values (figures/presets.py)
    assert rep.panels["e"].startswith("computed") and rep.panels["f"].startswith("computed")
    fixed = rep.row("preset.glm53_h200.fixed_share")
    assert fixed.paper["lo"] == 0.5 and fixed.paper["hi"] == 0.65 and 0.5 <= fixed.ours <= 0.65
    assert rep.row("preset.glm53_h200.slots").ours == rep.row("preset.glm53_h200.slots").paper


def test_known_values_on_fixture(full):
    r = full["reports"]
    # fixture: adaptive_dhisparse / hisparse outputs at C128 are smooth functions of C
    s = json.loads(
        next((full["results"] / "fig4").glob("adaptive_dhisparse-*-C128-x"))
        .joinpath("summary.json")
        .read_text()
    )
    h = json.loads(
        next((full["results"] / "fig4").glob("hisparse-*-C128-x"))
        .joinpath("summary.json")
        .read_text()
    )
    want = s["output_tok_s_per_gpu"] / h["output_tok_s_per_gpu"]
    row = r["fig4"].row("adhs_vs_hisparse_C128")
    assert row.ours == pytest.approx(want) and row.paper == 1.45
    assert row.ratio == pytest.approx(want / 1.45)
    assert "scaled preset (glm53_mini)" in row.prov and "selection locality 0.3" in row.prov
    assert "calibrated input: acceptance" in row.prov
    # the claims' C128 ratios come from the protocol's runs at the paper's per-GPU load
    proto = {
        sys_: [
            json.loads(d.joinpath("summary.json").read_text())["output_tok_s_per_gpu"]
            for d in sorted((full["results"] / "fig4_protocol").glob(f"{sys_}-glm53_mini-*"))
        ]
        for sys_ in ("hisparse", "adaptive_dhisparse")
    }
    row = r["fig4"].row("protocol.adhs_vs_hisparse_paperC128")
    assert len(proto["hisparse"]) == 3 and "paper C128 = ours C32 on one H200" in row.quantity
    assert row.ours == pytest.approx(
        sorted(proto["adaptive_dhisparse"])[1] / sorted(proto["hisparse"])[1]
    )
    assert row.stats is not None and row.stats.runs == (3, 3)
    # eq. 13's reason says how much of active sessions / TPOT each run delivered
    why13 = r["table2"].why.get("eq13.C128.predicted") or ""
    assert "active sessions / TPOT, and Adaptive DHiSparse delivered" in why13
    # the adaptive claim's reason sets the paper's two sources of gain beside ours
    why = r["fig4"].why.get("protocol.adaptive_vs_hisparse_paperC128") or ""
    assert "the paper's gain: TPOT 7 % lower" in why and "of 32 active" in why, why
    # HiSparse-only numbers do not inherit the drafter's calibrated acceptance
    assert "acceptance" not in r["fig4"].row("output.hisparse.C128").prov
    assert r["fig8"].value("host_path_gbps") == pytest.approx(49.0)
    assert r["fig7"].value("C128.tokens_b4") == pytest.approx(2.9)
    assert r["fig6"].value("host_low_reduction") == pytest.approx(14.2 / 1.4)
    assert r["fig6"].value("host_low_on") == pytest.approx(1.4)  # percent, not rescaled
    assert r["fig6"].value("coverage_low_on") == pytest.approx(90.0)
    # the reason beside the reduction claim is the run's measured coverage and residency-on share
    why = r["fig6"].why["host_low_reduction"]
    assert "coverage at low load 90 %" in why and "1.4 % of selected rows" in why
    assert r["tableA1"].value("C256.on.requests") == 417
    assert r["fig9"].value("glm128.best.hisparse") == 2
    assert r["tableA2"].value("C128.hisparse.post_wave_handoff_s") is not None
    # profiles written by profiling/kernel_timeline.py (kernels/kernel_summary.json) are read too
    assert r["fig10"].value("deepseek.step_ms") == pytest.approx(25.1)
    assert r["fig10"].value("deepseek.partition.expert matrix products") == pytest.approx(53.0)
    assert r["fig11"].value("share.C512 pressure") == pytest.approx(4.4)
    assert r["table3"].value("glm.bytes_per_miss_measured") == pytest.approx(656 * 26 / 7)
    text = (full["out"] / "fig4.md").read_text()
    assert "793" in text and "1.45" in text


def test_claims_json(full, empty):
    cf = json.loads((full["results"] / "claims.json").read_text())
    assert set(cf) == set(make_all.CLAIMS)
    for c in cf.values():
        assert set(c) >= {"paper", "ours", "holds"}
    assert cf["glm_c128_adhs_vs_hisparse"]["holds"] is True
    ce = json.loads((empty["results"] / "claims.json").read_text())
    for cid, c in ce.items():
        if c["provenance"].startswith("computed"):
            assert c["ours"] is not None
        else:
            assert c["ours"] is None and c["holds"] is None, cid


def _cells(md: str) -> list[str]:
    """The cells of every markdown table row (an escaped bar stays inside its cell)."""
    return [
        c.strip()
        for line in md.splitlines()
        if line.startswith("|")
        for c in re.split(r"(?<!\\)\|", line)[1:-1]
    ]


def _headline_rows(md: str) -> list[str]:
    block = md.split("## Headline claims", 1)[1].split("\n\n")
    table = next(b for b in block if b.startswith("| claim"))
    return table.splitlines()[2:]


def test_reproduction_md(full, empty):
    t = full["report"].read_text()
    assert "## Headline claims" in t
    for name in SCRIPTS:
        assert f'<a id="{name}"></a>' in t
        # the summary links each figure's full report, which exists beside its image
        assert f"](out/{name}.md)" in t and (full["out"] / f"{name}.md").is_file()
    assert (
        "](out/headline.md)" in t and "| ours from |" in (full["out"] / "headline.md").read_text()
    )
    assert "scaled preset" in t and "calibrated input" in t and "computed" in t
    assert C.NOT_MEASURED in empty["report"].read_text()
    # a ratio's direction and magnitude share one headline row
    assert len(_headline_rows(t)) == sum(
        1 for c in make_all.CLAIMS.values() if c.kind not in ("magnitude", "geometry")
    )
    for md in (t, empty["report"].read_text()):
        assert max(len(c) for c in _cells(md)) <= CELL_MAX


def test_pending_runs_paragraph_names_experiments_with_runs_left(tmp_path):
    """REPRODUCTION.md's "Pending runs" paragraph: an experiment with committed runs and points of
    its plan not measured (here a run of an older config, another id) is named with its counts;
    one whose plan finished, and one without runs, are not."""
    from harness import reproduce as rp
    from harness.run import point_plan

    res = tmp_path / "results"
    assert make_all._stale_runs_note(res) == []
    for ov in rp.plan("fig11b", smoke=False):  # every point of its plan finished
        exp_dir, points = point_plan(rp._run_cfg(ov, str(res)))
        for _, rid, _ in points:
            (exp_dir / rid).mkdir(parents=True)
            (exp_dir / rid / "summary.json").write_text("{}")
    (res / "fig10_eager" / "old-config-run").mkdir(parents=True)
    (res / "fig10_eager" / "old-config-run" / "summary.json").write_text("{}")
    (res / "fig9").mkdir()  # no runs
    done, pending = rp.plan_status("fig10_eager", str(res))
    assert done == 0 and pending > 0 and rp.plan_status("fig11b", str(res))[1] == 0
    note = make_all._stale_runs_note(res)
    assert note[0].startswith(f"Pending runs: `fig10_eager` ({pending} of {pending} planned runs)")
    assert "fig11b" not in note[0] and "fig9" not in note[0]
    make_all.write_report(tmp_path / "R.md", {}, {}, {}, tmp_path / "out", res)
    assert note[0] in (tmp_path / "R.md").read_text()


def test_committed_reproduction_md_stays_scannable():
    """The committed REPRODUCTION.md (from results/) stays a summary: under 60 KB, no table cell
    over 120 characters, a headline table of one screen; the detail lives in figures/out/."""
    t = (REPO / "REPRODUCTION.md").read_text()
    assert len(t.encode()) <= 60_000
    assert max(len(c) for c in _cells(t)) <= CELL_MAX
    assert len(_headline_rows(t)) <= 25
    for link in re.findall(r"\]\((figures/out/[\w.]+\.md)\)", t):
        assert (REPO / link).is_file(), link


def test_fold_grids_keeps_every_row_once():
    rep = C.Report("x", "X")
    for g in ("C4", "C8"):
        for m in ("TTFT", "TPOT"):
            rep.compare(f"{g}.{m}", f"{g}: {m}", 1.0, 2.0)
    rep.compare("lone", "C16: TTFT", 1.0, 3.0)  # one row: no group of its own
    rep.compare("dup.a", "D: TTFT", 1.0, 4.0)
    rep.compare("dup.b", "D: TTFT", 1.0, 5.0)  # a repeated quantity cannot share a grid row
    rep.compare("plain", "output ratio", 1.0, None)
    for g, ms in (("E", "ab"), ("F", "bc"), ("G", "cd")):  # 6 of 12 cells: stays rows
        for m in ms:
            rep.compare(f"{g}.{m}", f"{g}: {m}", 1.0, 1.0)
    grids, rest = fold_grids(rep.rows)
    assert [(cols, [label for label, _ in lines]) for cols, lines in grids] == [
        (["TTFT", "TPOT"], ["C4", "C8"])
    ]
    assert [r.key for r in rest][:4] == ["lone", "dup.a", "dup.b", "plain"] and len(rest) == 10
    md = rep.summary_markdown(2, "x.png", "x.md")
    assert "| C8 | 1 / 2 | 1 / 2 |" in md and "| output ratio | 1 | *not yet measured* | — |" in md
    assert "[x.md](x.md)" in md


def test_cli_arguments(tmp_path):
    res = build(tmp_path / "results")
    out = tmp_path / "o"
    env = {**os.environ, "MPLBACKEND": "Agg"}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "figures.fig8",
            "--results",
            str(res),
            "--out",
            str(out),
            "--dpi",
            "30",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "paper 49.4" in p.stdout and "ours/paper" in p.stdout
    assert (out / "fig8.png").is_file() and (out / "fig8.md").is_file()


# ------------------------------------------------------------------------------------- loader
def test_loader_tolerates_broken_runs(tmp_path):
    d = tmp_path / "fig4"
    (d / "good").mkdir(parents=True)
    (d / "good" / "summary.json").write_text(
        json.dumps(
            {"system": "hisparse", "point": {"concurrency": 8}, "output_tok_s_per_gpu": 10.0}
        )
    )
    (d / "good" / "records.jsonl").write_text('{"index": 0, "success": true}\n{"index": 1, "succ')
    (d / "torn").mkdir()
    (d / "torn" / "summary.json").write_text("{not json")
    (d / "running").mkdir()  # no summary.json yet
    (d / "file.txt").write_text("x")
    runs = C.load_runs(tmp_path, "fig4")
    assert [r.path.name for r in runs] == ["good"]
    r = runs[0]
    assert r.concurrency == 8 and r.system == "hisparse" and r.config == {}
    assert len(r.records) == 1 and r.metrics is None and r.profile is None
    assert C.load_runs(tmp_path, "nothing") == []
    assert C.load_json(tmp_path / "missing.json") is None


def test_canonical_system_names():
    assert C.canonical_system("adaptive_dhisparse_dspark") == "adaptive_dhisparse"
    assert C.canonical_system("resident_dspark") == "resident_dspark"
    assert C.canonical_system("resident_dflash2") == "resident_dflash2"
    assert C.canonical_system("hisparse") == "hisparse"


# ------------------------------------------------------------------------------------- paper values
def test_paper_values_tagged():
    v = PAPER["table2"]["C128"]["adaptive_dhisparse"]["output_tok_s_per_gpu"]
    assert v == 793 and isinstance(v, PV) and v.source == "Table 2"
    assert get("fig8.host_path_gbps") == 49.4
    vals = list(flatten())
    assert len(vals) > 400
    assert all(isinstance(p, PV) and p.source for _, p in vals)
    assert AMBIGUITIES


def test_paper_values_internally_consistent():
    t2, a2, a3 = PAPER["table2"], PAPER["tableA2"], PAPER["tableA3"]
    for cl in ("C128", "C256"):
        h = t2[cl]["hisparse"]["output_tok_s_per_gpu"]
        for s in ("adaptive_hisparse", "adaptive_dhisparse"):
            row = t2[cl][s]
            assert row["output_tok_s_per_gpu"] / h == pytest.approx(row["vs_hisparse"], abs=0.006)
        for s in ("hisparse", "adaptive_hisparse", "adaptive_dhisparse"):
            r2, ra2, ra3 = t2[cl][s], a2[cl][s], a3[s][cl]
            assert ra2["alloc_wait_s"] + ra2["handoff_s"] + ra2["other_s"] == pytest.approx(
                ra2["ttft_s"], abs=0.02
            )
            assert r2["ttft_s_mean"] == ra2["ttft_s"] == ra3["ttft_s_mean"]
            assert (
                r2["post_wave_ttft_s_mean"]
                == ra2["post_wave_ttft_s"]
                == ra3["post_wave_ttft_s_mean"]
            )
            assert r2["post_wave_ttft_s_p99"] == ra3["post_wave_ttft_s_p99"]
            assert r2["tpot_ms_mean"] == ra3["tpot_ms_mean"]
    f11 = PAPER["fig11"]["round_ms"]
    for b in ("4", "6"):
        parts = sum(v for k, v in f11[b].items() if k != "total")
        assert parts == pytest.approx(f11[b]["total"], abs=0.05)
    assert f11["6"]["total"] / f11["4"]["total"] == pytest.approx(1.17, abs=0.01)
    assert 100 * f11["4"]["cache kernels alone"] / f11["4"]["total"] == pytest.approx(17, abs=0.5)
    assert 100 * f11["6"]["cache kernels alone"] / f11["6"]["total"] == pytest.approx(20, abs=0.5)
    glm = PAPER["fig10"]["partition_pct"]["glm"]
    assert sum(glm.values()) == pytest.approx(100, abs=1.0)
    a1 = PAPER["tableA1"]
    assert a1["C16_before"]["off"]["host_pct"] / a1["C16_before"]["on"][
        "host_pct"
    ] == pytest.approx(10.3, abs=0.05)
    e = PAPER["eq13"]
    for cl in ("C128", "C256"):
        assert e[cl]["session_share"] / e[cl]["tpot_ratio"] == pytest.approx(
            e[cl]["predicted"], abs=0.02
        )


def test_engine_time_split_and_diagnosis(tmp_path):
    """The engine's cumulative time counters become shares of the running window, and the
    claim diagnosis names them (decode / capture / handoff / other). The window is the load's
    stretch of running samples, not the few requests that prepared shared prefixes before it
    (ts -3 and -2) with the idle gap between."""
    import json

    import pandas as pd

    from figures import common as C

    d = tmp_path / "fig4" / "hisparse-x-c128-0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"system": "hisparse", "concurrency": 128}))
    pd.DataFrame(
        {
            "ts": [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0],
            "dhs_num_running_reqs": [4, 4, 0, 0, 10, 128, 128, 0],
            # 0.8 s in the window
            "dhs_decode_seconds_total": [0.0, 0.5, 0.5, 0.5, 0.6, 1.0, 1.4, 1.4],
            # 0.2 s of it captured
            "dhs_capture_step_seconds_total": [0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2],
            "dhs_admit_seconds_total": [0.0, 0.3, 0.3, 0.3, 0.5, 0.9, 1.3, 1.3],  # 0.8 s
        }
    ).to_parquet(d / "server_metrics.parquet")
    (run,) = C.load_runs(tmp_path, "fig4")
    split = C.engine_time_split(run)  # window: ts 1..3, 2 s
    assert split == pytest.approx({"decode": 0.3, "capture": 0.1, "handoff": 0.4, "other": 0.2})
    why = C.stall_diagnosis([run], 128)
    assert "decode 30%" in why and "handoff 40%" in why and "C128" in why
    assert C.stall_diagnosis([run], 64) is None


def test_server_loop_busy_share_is_the_loop_threads_cpu_over_the_running_window(tmp_path):
    """The server's event-loop CPU seconds (/metrics) grow 1.5 s over the 2 s with requests
    running: 75 %, named by the claim breakdown; None without the counter."""
    import json

    import pandas as pd

    from figures import common as C
    from figures.notes import breakdown
    from harness.results import server_loop_busy_share

    d = tmp_path / "fig5" / "resident-x-c256-0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"system": "resident", "concurrency": 256}))
    frame = {
        "ts": [0.0, 1.0, 2.0, 3.0, 4.0],
        "dhs_num_running_reqs": [0, 5, 9, 9, 0],
        "dhs_server_loop_cpu_seconds_total": [0.0, 0.2, 1.0, 1.7, 1.8],
    }
    pd.DataFrame(frame).to_parquet(d / "server_metrics.parquet")
    (run,) = C.load_runs(tmp_path, "fig5")
    assert server_loop_busy_share(run) == pytest.approx(0.75)
    assert "server event loop on the CPU 75% of the time" in breakdown(run)
    del frame["dhs_server_loop_cpu_seconds_total"]
    pd.DataFrame(frame).to_parquet(d / "server_metrics.parquet")
    (run,) = C.load_runs(tmp_path, "fig5")
    assert server_loop_busy_share(run) is None


def test_admission_blocked_share_is_admission_wall_time_off_the_cpu(tmp_path):
    """Over the running window, the admission phases' wall seconds less the engine thread's CPU
    seconds in them, as a share of the wall; the claim breakdown names it; None without the CPU
    counters."""
    import json

    import pandas as pd

    from figures import common as C
    from figures.notes import breakdown
    from harness.results import admission_blocked_share

    d = tmp_path / "fig5" / "resident-x-c256-0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"system": "resident", "concurrency": 256}))
    w, c = "dhs_admit_phase_seconds_total", "dhs_admit_phase_cpu_seconds_total"
    frame = {
        "ts": [0.0, 1.0, 2.0, 3.0],
        "dhs_num_running_reqs": [0, 5, 9, 9],
        f'{w}{{phase="handoff"}}': [0.0, 1.0, 2.0, 4.0],  # 3 s in the window
        f'{c}{{phase="handoff"}}': [0.0, 0.5, 0.6, 0.9],  # 0.4 s of CPU
        f'{w}{{phase="prefix"}}': [0.0, 0.1, 0.6, 1.1],  # 1 s
        f'{c}{{phase="prefix"}}': [0.0, 0.1, 0.6, 1.1],  # all of it on the CPU
    }
    pd.DataFrame(frame).to_parquet(d / "server_metrics.parquet")
    (run,) = C.load_runs(tmp_path, "fig5")
    assert admission_blocked_share(run) == pytest.approx(1 - 1.4 / 4)
    assert "admission off the CPU (GIL, sleeping waits) 65% of its time" in breakdown(run)
    pd.DataFrame({k: v for k, v in frame.items() if "_cpu_" not in k}).to_parquet(
        d / "server_metrics.parquet"
    )
    (run,) = C.load_runs(tmp_path, "fig5")
    assert admission_blocked_share(run) is None


def test_exact_acceptance_runs_are_named_in_the_diagnosis(tmp_path):
    """Speculative runs that verified exactly with random-weight drafters (no accepted drafts)
    are named beside a failed claim; calibrated runs are not."""
    import json

    import pandas as pd
    import yaml

    from figures import common as C

    for name, mode, acc in (
        ("adaptive_dhisparse-x-c128-0", "exact", [0, 0, 0]),
        ("resident_dflash2-x-c128-0", "calibrated", [0, 180, 370]),
    ):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps({"system": name.split("-")[0], "concurrency": 128})
        )
        (d / "config.yaml").write_text(
            yaml.safe_dump({"system": {"speculation": {"acceptance": mode}}})
        )
        pd.DataFrame(
            {
                "ts": [0.0, 1.0, 2.0],
                "dhs_spec_rounds_total": [0, 100, 200],
                "dhs_spec_accepted_total": acc,
            }
        ).to_parquet(d / "server_metrics.parquet")
    runs = C.load_runs(tmp_path, "fig4")
    why = C.diagnosis(runs, 128)
    assert "exact acceptance" in why and "Adaptive DHiSparse 0.00" in why and "DFlash2" not in why
    assert C.accepted_per_round(runs[1]) == pytest.approx(1.85)
    assert C.diagnosis(runs[1:], 128) is None


def test_runs_without_graph_replays_are_named(tmp_path):
    import json

    import pandas as pd

    from figures import common as C

    for name, system, replays in (("a", "hisparse", [0, 0, 0]), ("b", "resident", [0, 40, 90])):
        d = tmp_path / "fig5" / f"{name}-c256-0"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": system, "concurrency": 256}))
        pd.DataFrame(
            {
                "ts": [0.0, 1.0, 2.0],
                "dhs_num_steps": [0, 50, 100],
                "dhs_graph_replays_total": replays,
            }
        ).to_parquet(d / "server_metrics.parquet")
    runs = C.load_runs(tmp_path, "fig5")
    shares = {r.system: C.graph_replay_share(r) for r in runs}
    assert shares == {"hisparse": 0.0, "resident": 0.9}
    note = C.eager_note(runs)
    assert "HiSparse" in note and "Resident" not in note


def test_newest_output_cap_is_used_once_it_covers_the_older_sweep(tmp_path):
    """One output cap per figure: a partial rerun at a new cap leaves the complete older sweep
    in place (and is named in the notes); once it covers every setting the older cap measured
    at its loads, it replaces it, and loads it did not measure are simply missing."""
    import json

    import yaml

    from figures import common as C

    def run(name, system, c, cap, rows, t):
        d = tmp_path / "fig9" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {"system": system, "concurrency": c, "point": {"concurrency": c, "tag": f"c{c}"}}
            )
        )
        (d / "env.json").write_text(json.dumps({"time_utc": t}))
        (d / "config.yaml").write_text(
            yaml.safe_dump({"workload": {"output_len": cap}, "model": {"hot_cache_rows": rows}})
        )

    for i, (c, rows) in enumerate([(8, 512), (8, 1024), (128, 512), (128, 1024)]):
        run(f"old{i}", "hisparse", c, 64, rows, f"2026-01-01T00:0{i}")
    run("new0", "hisparse", 128, 320, 512, "2026-02-01T00:00")  # partial: 1024 missing at C128
    runs = C.load_runs(tmp_path, "fig9")
    assert sorted(r.path.name for r in runs) == ["old0", "old1", "old2", "old3"]
    assert C.SUPERSEDED["fig9"] == (0, 64, 1)
    run("new1", "hisparse", 128, 320, 1024, "2026-02-01T00:01")  # C128 now complete
    runs = C.load_runs(tmp_path, "fig9")
    assert sorted(r.path.name for r in runs) == ["new0", "new1"]
    assert C.SUPERSEDED["fig9"] == (4, 320, 0)


def test_repeats_of_one_config_fold_into_their_median(tmp_path):
    """Runs of an identical config (``+rerun=...`` repeats) become one point whose numbers are
    the repeats' median; a rerun after a config change replaces the older run instead."""
    import json

    import yaml

    from figures import common as C

    def run(name, cfg, tput, t):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "system": "hisparse",
                    "concurrency": 128,
                    "output_throughput": tput,
                    "point": {"concurrency": 128, "tag": "c128"},
                }
            )
        )
        (d / "env.json").write_text(json.dumps({"time_utc": t}))
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))

    base = {"workload": {"output_len": 320}, "model": {"hot_cache_rows": 1024}}
    run("a", base, 3546.0, "2026-01-01T00:00")
    run("b", {**base, "rerun": "solo"}, 3485.0, "2026-01-02T00:00")
    run(
        "c",
        {**base, "rerun": 2, "reproduce": {"speculation": {"acceptance": "calibrated"}}},
        3763.0,
        "2026-01-03T00:00",
    )
    # an override the experiment adds for another system lands in that system's runs, not here
    run(
        "c2",
        {**base, "rerun": 3, "reproduce": {"system_overrides": {"adaptive_hisparse": {"x": 1}}}},
        3600.0,
        "2026-01-03T00:01",
    )
    runs = C.load_runs(tmp_path, "fig4")
    assert [r.path.name for r in runs] == ["c2"]
    assert [r.path.name for r in runs[0].repeats] == ["a", "b", "c", "c2"]
    assert runs[0].num("output_throughput") == 3546.0 + (3600.0 - 3546.0) / 2  # the median
    assert "median of 4 repeat runs" in C.provenance(runs)
    # a changed config is a replacement, not a repeat: the newest run alone
    run(
        "d",
        {**base, "model": {"hot_cache_rows": 1024, "selection_locality": 0.9}},
        3000.0,
        "2026-01-04T00:00",
    )
    runs = C.load_runs(tmp_path, "fig4")
    last = C.pick(runs, "hisparse", 128)
    assert last.path.name == "d" and last.repeats == [] and last.num("output_throughput") == 3000.0


def test_provenance_names_repeat_commits_and_a_kernel_change_between_runs(tmp_path):
    """Repeats at different commits are named in the provenance (env.json's git_commit), and
    runs on both sides of a MEASUREMENT_CHANGES commit are flagged (git ancestry of this repo:
    60e6be1 predates a5e1803, 1ef6892 follows it)."""
    import json

    from figures import common as C

    def run(name, commit, t, rerun=None):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "system": "hisparse",
                    "concurrency": 128,
                    "output_throughput": 3000.0,
                    "point": {"concurrency": 128, "tag": "c128"},
                }
            )
        )
        (d / "env.json").write_text(json.dumps({"time_utc": t, "git_commit": commit}))
        cfg = {"workload": {"output_len": 320}}
        (d / "config.yaml").write_text(json.dumps({**cfg, "rerun": rerun} if rerun else cfg))

    run("a", "60e6be1", "2026-01-01T00:00")
    run("b", "1ef6892", "2026-01-02T00:00", rerun=2)
    runs = C.load_runs(tmp_path, "fig4")
    assert runs[0].commit == "1ef6892"
    prov = C.provenance(runs)
    assert "median of 2 repeat runs (commits 1ef6892, 60e6be1)" in prov
    if R._after_change("1ef6892", "a5e1803") is None:
        pytest.skip("git history not available here")
    assert "mixes runs from before a5e1803 (60e6be1) and after it (1ef6892)" in prov
    # one side only: nothing mixes, but the run predates the later changes
    alone = C.change_mix([C.Run(runs[0].path, runs[0].summary)])
    assert "mixes" not in alone and alone.startswith("made before ")
    assert f"the newest, {R.MEASUREMENT_CHANGES[-1][0]}: " in alone
    # the headline table finds it as a caveat in a provenance, whole
    assert C.caveats(f"scaled preset (tiny); {alone}; H200") == [alone]
    # a run at HEAD follows every change: nothing to say
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    (runs[0].path / "env.json").write_text(json.dumps({"git_commit": head.stdout.strip()}))
    assert C.change_mix([C.Run(runs[0].path, runs[0].summary)]) == ""


def test_provenance_names_a_preset_geometry_changed_since_the_run(tmp_path):
    """A run whose model section has other shapes than its preset composes today measured
    other random weights: its provenance says which field moved; a run of today's shapes, or
    of a model no preset names, says nothing."""
    from figures import common as C
    from figures.presets import model_config

    now = model_config("glm53_mini")
    for name, model in (
        ("old", {"name": "glm53_mini", "intermediate_size": 999, "hidden_size": now.hidden_size}),
        ("new", {"name": "glm53_mini", "intermediate_size": now.intermediate_size}),
        ("adhoc", {"name": "no_such_preset", "intermediate_size": 999}),
    ):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": name, "concurrency": 8}))
        (d / "config.yaml").write_text(json.dumps({"model": model}))
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig4")}
    want = f"measured on an earlier glm53_mini geometry (intermediate_size 999, now {now.intermediate_size})"
    assert want in C.provenance(runs["old"])
    assert C.caveats(C.provenance(runs["old"])) == [want]  # the headline table's caveat
    assert "earlier" not in C.provenance([runs["new"], runs["adhoc"]])


def test_provenance_says_a_run_had_failed_requests(tmp_path):
    """A run finishes with some of its requests failed (never all): its figures say so."""
    from figures import common as C

    for name, errors in (("ok", 0), ("some", 3)):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        summary = {"system": name, "concurrency": 8, "completed": 61, "errors": errors}
        (d / "summary.json").write_text(json.dumps(summary))
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig4")}
    assert "failed requests" not in C.provenance(runs["ok"])
    assert "1 run(s) with failed requests (3 of 64 requests" in C.provenance(runs.values())


def test_provenance_flags_a_number_from_runs_on_different_gpus(tmp_path):
    """Runs on an H100 beside runs on an H200 behind one number: a caveat of the headline
    table; runs of one GPU are not flagged."""
    from figures import common as C

    for name, gpu in (("a", "NVIDIA H200"), ("b", "NVIDIA H200"), ("c", "NVIDIA H100 80GB HBM3")):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        summary = {"system": name, "concurrency": 8, "completed": 8, "gpu": gpu}
        (d / "summary.json").write_text(json.dumps(summary))
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig4")}
    assert "several GPUs" not in C.provenance([runs["a"], runs["b"]])
    mixed = C.provenance(runs.values())
    want = "runs on several GPUs (NVIDIA H100 80GB HBM3, NVIDIA H200)"
    assert want in mixed and C.caveats(mixed) == [want]


def test_provenance_flags_hisparse_runs_on_different_copy_grids(tmp_path):
    """HiSparse runs on the paper's fixed copy grid beside runs on the batch-scaled one (a
    sweep part re-run) are named; runs of one grid, or of other systems, are not."""
    import json

    from figures import common as C

    def run(name, system, kv):
        d = tmp_path / "fig9" / name
        d.mkdir(parents=True)
        summary = {"system": system, "concurrency": 32, "point": {"concurrency": 32, "tag": "c32"}}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "config.yaml").write_text(json.dumps({"system": {"name": system, "kv": kv}}))

    run("h-old", "hisparse", {"hot_cache_rows": 1024})
    run("h-new", "hisparse", {"hot_cache_rows": 2048, "copy_grid": 4})
    run("a", "adaptive_hisparse", {"copy_grid": 0})
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig9")}
    note = C.change_mix(runs.values())
    assert "1 on the batch-scaled grid, 1 on a fixed grid of 4 programs" in note
    assert C.change_mix([runs["h-new"], runs["a"]]) == ""


def test_admission_experiment_is_set_beside_the_figure_run_not_in_it(tmp_path):
    """A run under results/admission/ (a faster admission rate) is compared with the figure's run
    of that system and load; it never replaces the figure's point."""
    import json

    from figures import common as C

    def run(exp, name, per_step, tput):
        d = tmp_path / exp / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "system": "adaptive_dhisparse",
                    "model": "glm53_mini",
                    "concurrency": 256,
                    "output_tok_s": tput,
                    "point": {"concurrency": 256, "tag": "c256"},
                }
            )
        )
        (d / "config.yaml").write_text(json.dumps({"engine": {"max_handoffs_per_step": per_step}}))

    run("fig4", "base", 4, 3533.0)
    assert C.admission_experiment_note(tmp_path, C.load_runs(tmp_path, "fig4")) is None
    run("admission", "fast", 16, 3902.0)
    runs = C.load_runs(tmp_path, "fig4")
    assert [r.path.name for r in runs] == ["base"]
    note = C.admission_experiment_note(tmp_path, runs)
    assert (
        "16 handoffs per step made 3,902 tok/s" in note
        and "3,533 tok/s" in note
        and "(1.10x;" in note
    )


def test_paired_ratio_note_pairs_repeats_by_device_call(tmp_path):
    """With repeats from several device calls (one commit each), the note gives each call's own
    ratio, not only the ratio of medians."""
    import json

    from figures import common as C

    def run(name, system, commit, t, tput):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "system": system,
                    "concurrency": 128,
                    "output_tok_s": tput,
                    "point": {"concurrency": 128, "tag": "c128"},
                }
            )
        )
        (d / "env.json").write_text(json.dumps({"time_utc": t, "git_commit": commit}))
        (d / "config.yaml").write_text(
            json.dumps({"workload": {"output_len": 320}, **({"rerun": t} if t[-1] != "0" else {})})
        )

    for i, (commit, a, b) in enumerate(
        [("aaaaaaa", 3431.0, 3142.0), ("bbbbbbb", 4759.0, 4612.0), ("ccccccc", 3696.0, 4685.0)]
    ):
        run(f"adhs{i}", "adaptive_dhisparse", commit, f"2026-01-0{i + 1}T00:0{i}", a)
        run(f"hs{i}", "hisparse", commit, f"2026-01-0{i + 1}T00:0{i}", b)
    runs = C.load_runs(tmp_path, "fig4")
    assert len(runs) == 2 and all(len(r.repeats) == 3 for r in runs)
    note = C.paired_ratio_note(runs, (("adaptive_dhisparse", "hisparse"),), 128)
    assert "1.09 (aaaaaaa), 1.03 (bbbbbbb), 0.79 (ccccccc), median 1.03" in note
    assert "come from different GPU machines" in note
    assert C.paired_ratio_note(runs, (("adaptive_dhisparse", "resident"),), 128) is None
    # repeats all of one run group: no machines to tell apart
    for r in runs:
        for x in r.repeats:
            x.env["run_group"] = "one-call"
    note = C.paired_ratio_note(runs, (("adaptive_dhisparse", "hisparse"),), 128)
    assert "(one-call)" in note and "different GPU machines" not in note
    # env.json's device_call, where present, separates two calls made at one commit
    for name in ("adhs9", "hs9"):
        run(
            name,
            "adaptive_dhisparse" if name == "adhs9" else "hisparse",
            "ccccccc",
            "2026-01-05T00:09",
            5000.0 if name == "adhs9" else 4000.0,
        )
        env = json.loads((tmp_path / "fig4" / name / "env.json").read_text())
        (tmp_path / "fig4" / name / "env.json").write_text(
            json.dumps({**env, "device_call": "call-9"})
        )
    note = C.paired_ratio_note(
        C.load_runs(tmp_path, "fig4"), (("adaptive_dhisparse", "hisparse"),), 128
    )
    assert "0.79 (ccccccc)" in note and "1.25 (call-9)" in note
    # records written since name it run_group (benchmarks/gpu_batch.sh), read the same way
    for name in ("adhs9", "hs9"):
        env = json.loads((tmp_path / "fig4" / name / "env.json").read_text())
        env.pop("device_call")
        (tmp_path / "fig4" / name / "env.json").write_text(
            json.dumps({**env, "run_group": "batch-9"})
        )
    note = C.paired_ratio_note(
        C.load_runs(tmp_path, "fig4"), (("adaptive_dhisparse", "hisparse"),), 128
    )
    assert "1.25 (batch-9)" in note


def test_batch_scaling_note_compares_like_with_like(tmp_path):
    """The step's time against the requests it held, per system; the proportionality remark
    only compares systems of one kind (a speculative round costs more per request)."""
    import json

    import pandas as pd
    import yaml

    from figures import common as C

    def run(name, system, spec, steps_s, running):
        d = tmp_path / "fig5" / f"{name}-c256-0"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": system, "concurrency": 256}))
        (d / "config.yaml").write_text(
            yaml.safe_dump(
                {"system": {"name": system, "speculation": {"block_size": 8} if spec else None}}
            )
        )
        pd.DataFrame(
            {
                "ts": [0.0, 1.0, 2.0],
                "dhs_num_running_reqs": [running] * 3,
                "dhs_num_steps": [0, 100, 200],
                "dhs_decode_seconds_total": [0.0, 100 * steps_s, 200 * steps_s],
            }
        ).to_parquet(d / "server_metrics.parquet")

    run("a", "resident", False, 0.0114, 54)
    run("b", "hisparse", False, 0.0416, 205)
    run("c", "resident_dspark", True, 0.0249, 52)
    runs = C.load_runs(tmp_path, "fig5")
    note = C.batch_scaling_note(runs, 256)
    assert "HiSparse 41.6 ms at 205 running" in note
    assert "among the non-speculative systems" in note and "among the speculative" not in note
    run("d", "hisparse", False, 0.0416, 60)  # same batch as resident's: nothing to conclude
    runs = [r for r in C.load_runs(tmp_path, "fig5") if r.path.name != "b-c256-0"]
    assert "among" not in C.batch_scaling_note(runs, 256)


def test_admission_note_names_systems_whose_admission_set_the_batch(tmp_path):
    """Requests waiting, slots free and no memory refusal: the admission rate set the batch.
    Waiting because the pool refused (resident) is not that."""
    import json

    import pandas as pd
    import yaml

    from figures import common as C

    def run(name, system, running, waiting, refused):
        d = tmp_path / "fig5" / f"{name}-c256-0"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": system, "concurrency": 256}))
        (d / "config.yaml").write_text(yaml.safe_dump({"engine": {"max_handoffs_per_step": 4}}))
        pd.DataFrame(
            {
                "ts": [0.0, 5.0, 10.0],
                "dhs_num_running_reqs": [running] * 3,
                "dhs_num_waiting_reqs": [waiting] * 3,
                "dhs_num_slots": [256] * 3,
                "dhs_num_steps": [0, 40, 80],
                'dhs_admission_wait_events_total{reason="kv_pool_full"}': [0, refused, 2 * refused],
            }
        ).to_parquet(d / "server_metrics.parquet")

    run("a", "adaptive_dhisparse", 126, 92, 0)
    run("b", "resident", 54, 147, 10)
    run("c", "hisparse", 240, 10, 0)
    note = C.admission_note(C.load_runs(tmp_path, "fig5"), 256)
    assert note.startswith("admission-limited at C256: Adaptive DHiSparse held 126 running of 256")
    assert "8.0 steps/s and 4 handoffs per step" in note
    assert "Resident" not in note and note.count(" held ") == 1  # HiSparse: few waiting


def test_fig7_maps_the_paper_loads_to_the_halved_ones(tmp_path):
    """conf/experiment/fig7.yaml runs C32 / C64 / C128 for the paper's C64 / C128 / C256: the
    comparisons take the load at the same position, and say so in their labels."""
    from figures import fig7
    from tests.figures.fixture import _write_run

    res = tmp_path / "results"
    pts = []
    for c, base in ((32, 500.0), (64, 700.0), (128, 900.0)):
        for b in (4, 6, 8):
            pts.append(
                {
                    "block": b,
                    "concurrency": c,
                    "emitted_tokens_per_round": 2.0 + 0.25 * b,
                    "output_tok_s_per_gpu": base
                    * (1.0 + (0.05 if (c, b) == (128, 6) else -0.01 * b)),
                    "round_ms": 20.0 + b,
                }
            )
    (res / "fig7").mkdir(parents=True)
    (res / "fig7" / "summary.json").write_text(json.dumps({"points": pts}))
    _write_run(
        res,
        "fig7",
        "adaptive_dhisparse-glm53_mini-c32-x",
        {"system": "adaptive_dhisparse"},
        {"workload": {"concurrency": [32, 64, 128]}},
    )
    rep = fig7.main(["--results", str(res), "--out", str(tmp_path / "out"), "--dpi", "30"])
    assert rep.value("C256.best") == 6  # the paper's C256 is our C128, where block 6 wins
    assert rep.value("C64.round_b6") == pytest.approx(100 * (26 / 24 - 1))
    md = (tmp_path / "out" / "fig7.md").read_text()
    assert "C256 (ours C128): block with the highest output" in md


def test_fig10_with_replayed_graphs_does_not_split_what_the_trace_cannot(tmp_path):
    """A profile taken with CUDA graphs replayed cannot tell follower copies from resolver work
    nor expert from dense-projection matmuls: those shares are reported as not measured (their
    sum in a note), while cache work per step is still compared; an eager profile gives the split.
    A profile of steps far below the run's load (the warm-up request) is left out, with a note."""
    from figures import fig10
    from tests.figures.fixture import _config, _summary, _write_run

    def build(root, graphs, sessions, exp="fig10", run=True, eager_scale=1.0):
        prof = {
            "step_ms": 40.0 if graphs else 52.0,
            "sessions_per_step": sessions,
            "cache_kernel_ms": {"resolver": 3.0, "follower_copy": 0.0 if graphs else 9.0},
            "partition_pct": {
                "expert matrix products": 0.0 if graphs else 38.0 * eager_scale,
                "dense projections": 45.0 if graphs else 7.0 * eager_scale,
                "indexing and attention": 6,
                "other model kernels": 8,
                "several families at once": 28,
                "cache kernels alone": 9,
                "no kernel running": 4,
            },
        }
        s = _summary("adaptive_hisparse", "glm53_mini", exp, 128, b_over_k=2)
        s["point"] = {"concurrency": 128, "b_over_k": 2, "tag": "c128"}
        s["active_mean"] = 120.0
        cfg = {
            **_config("adaptive_hisparse", "glm53_mini"),
            "device": "cuda",
            "engine": {"disable_cuda_graph": not graphs},
        }
        _write_run(root, exp, "adaptive_hisparse-glm53_mini-c128-x", s, cfg, None, None, prof)
        return (
            fig10.main(
                [
                    "--results",
                    str(root),
                    "--out",
                    str(root.parent / f"out-{graphs}-{sessions}"),
                    "--dpi",
                    "30",
                ]
            )
            if run
            else None
        )

    rep = build(tmp_path / "graphs", True, 118.0)
    assert rep.value("glm.cache_ms.2") == pytest.approx(3.0)
    assert rep.value("glm.copy_share") is None
    assert rep.value("glm.partition.expert matrix products") is None
    assert rep.value("glm.partition.indexing and attention") == pytest.approx(6.0)
    md = (tmp_path / "out-True-118.0" / "fig10.md").read_text()
    assert "ours 45 %" in md and "follower-copy share: not measured" in md
    rep = build(tmp_path / "eager", False, 118.0)
    assert rep.value("glm.copy_share") == pytest.approx(0.75)
    assert rep.value("glm.partition.expert matrix products") == pytest.approx(38.0)
    # served (graph-replayed) profile in fig10 + an eager one in fig10_eager: cache work and step
    # time from the first, the two splits from the second
    # (the eager step's expert + dense shares, 38 + 7, are of a longer step: the served merged 45 %
    # is split 38 : 7, whatever the eager shares add up to)
    build(tmp_path / "both", False, 118.0, exp="fig10_eager", run=False, eager_scale=0.5)
    rep = build(tmp_path / "both", True, 118.0)
    assert rep.value("glm.cache_ms.2") == pytest.approx(3.0)
    assert rep.value("glm.step_ms") == pytest.approx(40.0)
    assert rep.value("glm.copy_share") == pytest.approx(0.75)
    assert rep.value("glm.partition.expert matrix products") == pytest.approx(45.0 * 38 / 45)
    assert rep.value("glm.partition.dense projections") == pytest.approx(45.0 * 7 / 45)
    assert rep.value("glm.partition.indexing and attention") == pytest.approx(6.0)
    assert "CUDA graphs off" in (tmp_path / "out-True-118.0" / "fig10.md").read_text()
    rep = build(tmp_path / "warmup", True, 1.0)
    assert rep.value("glm.cache_ms.2") is None
    assert (
        "covers steps carrying 1 request(s)" in (tmp_path / "out-True-1.0" / "fig10.md").read_text()
    )


def test_fig11b_splits_a_run_into_phases_by_the_batch_it_carried(tmp_path):
    """results/fig11b: a run profiled in cycles over its whole length; cycles before the batch
    first reaches C are the fill, after it last held C the drain, the rest the middle (step-weighted
    means). The top load's full-batch cycles stand for the paper's C512 under pressure."""
    from figures import fig11
    from tests.figures.fixture import _config, _summary, _write_run

    res = tmp_path / "results"
    for c, cycles in (
        (
            16,
            [
                (4, 6, 2.0),
                (4, 12, 1.8),
                (4, 16, 1.2),
                (3, 16, 1.6),
                (4, 15.75, 1.0),
                (4, 9, 0.4),
                (0, 0, 0.0),
            ],
        ),
        (256, [(4, 100, 3.0), (4, 256, 5.0), (4, 256, 4.0), (4, 200, 2.0)]),
    ):
        s = _summary("adaptive_hisparse", "dsv41_mini", "fig11b", c)
        d = _write_run(
            res,
            "fig11b",
            f"adaptive_hisparse-dsv41_mini-c{c}-x",
            s,
            _config("adaptive_hisparse", "dsv41_mini"),
        )
        (d / "kernels").mkdir()
        (d / "kernels" / "kernel_summary.json").write_text(
            json.dumps(
                {
                    "cycles": [
                        {
                            "num_steps": n,
                            "sessions_per_step": ses,
                            "resolver_share_pct_mean": sh,
                            "step_ms": 20.0,
                        }
                        for n, ses, sh in cycles
                    ]
                }
            )
        )
    ph = fig11.phase_shares(next(r for r in C.load_runs(res, "fig11b") if r.concurrency == 16))
    assert ph["fill"] == pytest.approx((4 * 2.0 + 4 * 1.8) / 8)
    assert ph["middle"] == pytest.approx(
        (4 * 1.2 + 3 * 1.6 + 4 * 1.0) / 11
    )  # 15.75: one step of four a request short
    assert ph["drain"] == pytest.approx(0.4)
    rep = fig11.main(["--results", str(res), "--out", str(tmp_path / "out"), "--dpi", "30"])
    assert rep.value("share.C16 drain") == pytest.approx(0.4)
    assert rep.value("share.C512 pressure") == pytest.approx(4.5)
    assert "our top load, C256" in (tmp_path / "out" / "fig11.md").read_text()
    # all C admitted at once (full from the first cycle): the fill is the prefill-heavy lead cycles
    d = next(r for r in C.load_runs(res, "fig11b") if r.concurrency == 16).path
    (d / "kernels" / "kernel_summary.json").write_text(
        json.dumps(
            {
                "cycles": [
                    {
                        "num_steps": 4,
                        "sessions_per_step": 16,
                        "resolver_share_pct_mean": sh,
                        "step_ms": ms,
                    }
                    for sh, ms in (
                        (0.9, 300.0),
                        (0.8, 70.0),
                        (2.0, 20.0),
                        (3.0, 21.0),
                        (2.5, 19.0),
                        (2.5, 22.0),
                    )
                ]
            }
        )
    )
    ph = fig11.phase_shares(next(r for r in C.load_runs(res, "fig11b") if r.concurrency == 16))
    assert (
        ph["fill"] == pytest.approx(0.85)
        and ph["middle"] == pytest.approx(2.5)
        and "drain" not in ph
    )


def test_spread_pct_counts_a_point_that_delivered_nothing():
    """An output spread over points: a point at 0 beside others is an unbounded spread (the
    output is not flat), not a point left out or a division by zero."""
    from figures import common as C

    assert C.spread_pct([100.0, 120.0, 110.0]) == pytest.approx(20.0)
    assert C.spread_pct([0.0, 5.0]) == math.inf
    assert C.spread_pct([0.0, 0.0]) == 0.0


def test_fig9_budget_spread_within_one_run_group():
    """Budget points that are medians of repeats from several machines: the spread is also given
    for each device call that ran every budget, and only for those."""
    from types import SimpleNamespace as NS

    from figures.fig9 import within_call_spread

    def run(call, out):
        return NS(run_group=call, summary={"output_tok_s_per_gpu": out}, repeats=[])

    def point(bk, *runs):
        return NS(bk=bk, run=NS(repeats=list(runs)))

    sel = [
        point(2, run("old", 1600.0), run("call-b", 2000.0)),
        point(16, run("call-a", 2800.0), run("call-b", 1600.0)),
    ]
    note = within_call_spread(sel)
    assert note is not None and "25% in call-b" in note and "call-a" not in note
    assert (
        within_call_spread([point(2, run("x", 1.0)), point(4, run("x", 2.0))]) is None
    )  # no repeats


def test_fig11b_a_lone_top_load_run_fills_no_low_load_row(tmp_path):
    """The low and top loads come from the experiment's config: with only the C256 run present,
    the C16 rows stay unmeasured instead of being filled from C256's cycles."""
    from figures import fig11
    from tests.figures.fixture import _config, _summary, _write_run

    res = tmp_path / "results"
    s = _summary("adaptive_hisparse", "dsv41_mini", "fig11b", 256)
    d = _write_run(
        res,
        "fig11b",
        "adaptive_hisparse-dsv41_mini-c256-x",
        s,
        {**_config("adaptive_hisparse", "dsv41_mini"), "workload": {"concurrency": [16, 256]}},
    )
    (d / "kernels").mkdir()
    (d / "kernels" / "kernel_summary.json").write_text(
        json.dumps(
            {
                "cycles": [
                    {
                        "num_steps": 4,
                        "sessions_per_step": ses,
                        "resolver_share_pct_mean": sh,
                        "step_ms": 20.0,
                    }
                    for ses, sh in ((100, 3.0), (256, 5.0), (256, 4.0), (90, 1.0))
                ]
            }
        )
    )
    rep = fig11.main(["--results", str(res), "--out", str(tmp_path / "out"), "--dpi", "30"])
    assert rep.value("share.C512 pressure") == pytest.approx(4.5)
    assert rep.value("share.C16 fill") is None and rep.value("share.C16 middle") is None


def test_fig11a_splits_graph_replayed_model_kernels_by_the_eager_round(tmp_path):
    """A Fig. 11a round profiled with CUDA graphs replayed has no expert-matmul split: its model
    kernels are split in the proportion the same block's eager round (fig11_eager) shows; without
    an eager round the expert row stays unmeasured and a note gives the sum."""
    from figures import fig11
    from tests.figures.fixture import _config, _summary, _write_run

    def write(root, exp, graphs, expert, other):
        prof = {
            "sessions_per_step": 64.0,
            "round_ms": {
                "cache kernels alone": 2.0,
                "expert matrix products": expert,
                "other model kernels": other,
                "several families at once": 2.0,
                "no kernel coverage": 4.0,
                "total": 8.0 + expert + other,
            },
        }
        s = _summary("adaptive_dhisparse", "glm53_mini", exp, 64)
        cfg = {
            **_config("adaptive_dhisparse", "glm53_mini", speculation={"block_size": 4}),
            "device": "cuda",
            "engine": {"disable_cuda_graph": not graphs},
        }
        _write_run(root, exp, f"adaptive_dhisparse-glm53_mini-c64-{exp}", s, cfg, None, None, prof)

    res = tmp_path / "results"
    write(res, "fig11", True, 0.0, 20.0)
    rep = fig11.main(["--results", str(res), "--out", str(tmp_path / "o1"), "--dpi", "30"])
    assert rep.value("b4.expert matrix products") is None
    assert rep.value("b4.other model kernels") == pytest.approx(20.0)
    write(res, "fig11_eager", False, 15.0, 5.0)
    rep = fig11.main(["--results", str(res), "--out", str(tmp_path / "o2"), "--dpi", "30"])
    assert rep.value("b4.expert matrix products") == pytest.approx(15.0)
    assert rep.value("b4.other model kernels") == pytest.approx(5.0)
    assert rep.value("b4.total") == pytest.approx(
        28.0
    )  # the served round's time, not the eager one's
    assert "75% expert" in (tmp_path / "o2" / "fig11.md").read_text()


def test_fig8_notes_the_phase_split_of_the_newest_phase_times_file(tmp_path):
    """results/fig8/phase_times_*.json (bench_resolver --phase-times): the newest file's (c) rows
    with a phase split become one note line each, naming the variant, file and commit."""
    from figures import fig8

    d = tmp_path / "fig8"
    d.mkdir()
    row = {
        "batch": 8,
        "misses_per_request": 77,
        "phase_times": True,
        "us_median": 31.7,
        "program_us_median": 22.8,
        "phase_us_slowest_request": {"B_scan": 7.7, "V_victims": 10.2},
    }
    (d / "phase_times_old-h200.json").write_text(
        json.dumps(
            {"date": "2026-01-01", "commit": "old", "fig8c_points": [dict(row, us_median=99.0)]}
        )
    )
    (d / "phase_times_new-h200.json").write_text(
        json.dumps(
            {
                "date": "2026-11-30",
                "commit": "abc1234",
                "gpu": "NVIDIA H200",
                "fig8c_points": [
                    {"batch": 8, "us_median": 40.0},
                    row,
                    dict(row, early_copy=True, copy_programs_per_request=4),
                    dict(row, resolved={"copy_programs_per_request": 1, "early_copy": False}),
                ],
            }
        )
    )
    notes = fig8.phase_notes(tmp_path)
    assert len(notes) == 3 and all("abc1234" in n for n in notes)
    # a row without knobs or resolved settings ran at its commit's defaults, which it does not name
    assert (
        "the defaults of commit abc1234" in notes[0]
        and "V_victims 10.2" in notes[0]
        and "of 31.7 µs" in notes[0]
    )
    assert "77 misses at batch 8, early copy, 4 copy programs per request" in notes[1]
    assert "one program per request" in notes[2]
    assert fig8.phase_notes(tmp_path / "nothing") == []


def test_provenance_says_whether_outputs_were_sampled(tmp_path):
    """Where a run carries a selection locality, its provenance says whether its outputs were
    greedy (a greedy output of random weights can cycle and fetch nothing) or sampled."""
    import json

    from figures import common as C

    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        d = tmp_path / name / "r"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": "hisparse", "concurrency": 32}))
        cfg = {"model": {"selection_locality": 0.75}, "workload": {"temperature": temp}}
        (d / "config.yaml").write_text(json.dumps(cfg))
    greedy = C.provenance(C.load_runs(tmp_path, "greedy"))
    sampled = C.provenance(C.load_runs(tmp_path, "sampled"))
    assert "greedy outputs" in greedy and "sampled" not in greedy
    assert "outputs sampled at temperature 1" in sampled and "greedy" not in sampled


def test_provenance_flags_prefixes_prefilled_while_measuring(tmp_path):
    """A run whose server prefilled shared prompts inside its measured window says how many:
    from the server's prefill counter over the window where it was scraped (the first load
    point a server measured, not the later ones), else from what its warm-up left."""
    import json

    import pandas as pd

    from figures import common as C

    cases = {  # name: (warm-up requests, prefill counter over the window or None)
        "first_point": (1, [1.0, 9.0, 16.0]),
        "later_point": (1, [16.0, 16.0]),
        "no_counters": (1, None),
        "no_warmup": (0, None),
        "prepared": (16, None),
    }
    for name, (warm, counter) in cases.items():
        d = tmp_path / name / "r"
        d.mkdir(parents=True)
        s = {"system": "hisparse", "concurrency": 32, "warmup": warm}
        (d / "summary.json").write_text(json.dumps(s))
        (d / "config.yaml").write_text(json.dumps({"workload": {"prefixes": 16}}))
        if counter is not None:
            df = pd.DataFrame({"t": range(len(counter)), "dhs_num_prefills_total": counter})
            df.to_parquet(d / "server_metrics.parquet")
    prov = {n: C.provenance(C.load_runs(tmp_path, n)) for n in cases}
    assert "15 of 16 shared prefixes prefilled inside the measured window" in prov["first_point"]
    assert "up to 15 of 16" in prov["no_counters"] and "up to 16 of 16" in prov["no_warmup"]
    assert "prefilled" not in prov["later_point"] and "prefilled" not in prov["prepared"]


def test_fig9_says_how_the_budget_sweeps_pools_were_sized():
    """fig9's note on the H200 sweep: the pools of one B kept over the sweep (the paper's), one
    capacity per B (runs before system.kv.pools_sized_for_rows), or a mix; a run whose pools were
    sized for its own B counts either way."""
    from types import SimpleNamespace as NS

    from figures.fig9 import pools_note

    def pt(B, N=None):
        kv = {"hot_cache_rows": B} | ({} if N is None else {"pools_sized_for_rows": N})
        return NS(run=NS(config={"system": {"kv": kv}}))

    kept = pools_note([pt(1024, 2048), pt(2048), pt(4096, 2048)])
    assert "configured for B = 2,048 rows at every budget" in kept
    assert "one capacity sized for each B" in pools_note([pt(1024), pt(2048), pt(4096)])
    assert "a mix" in pools_note([pt(1024), pt(4096, 2048)])


def test_provenance_says_a_run_was_profiled(tmp_path):
    """A collector ran during the load (torch.profiler, host samples): the numbers are the
    profiled server's, and the provenance says so; a run without one says nothing."""
    from figures import common as C

    for name, prof in (("plain", {"name": "none"}), ("prof", {"name": "kernels"})):
        d = tmp_path / "fig10" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": name, "concurrency": 8}))
        (d / "config.yaml").write_text(json.dumps({"profile": prof}))
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig10")}
    assert "profiled run (kernels collector" in C.provenance(runs["prof"])
    assert "profiled" not in C.provenance(runs["plain"])


def test_a_change_of_one_kv_backend_flags_only_its_runs(tmp_path):
    """A MEASUREMENT_CHANGES entry scoped to some KV backends (CHANGE_SCOPE: adaptive
    residency's reserve, 02d92fa) counts against the runs on them, not against HiSparse's, and
    one scoped to speculation not against runs without a drafter; a run whose config does
    not say counts them all."""
    from figures import common as C

    def run(name, backend):
        d = tmp_path / "fig4" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"system": name, "concurrency": 8}))
        (d / "env.json").write_text(json.dumps({"git_commit": "60e6be1"}))
        system = {"name": name} | ({"kv_backend": backend, "speculation": None} if backend else {})
        (d / "config.yaml").write_text(json.dumps({"system": system}))

    run("hisparse", "hisparse")
    run("adaptive_hisparse", "adaptive_hisparse")
    run("unknown", None)
    if R._after_change("60e6be1", "02d92fa") is None:
        pytest.skip("git history not available here")
    runs = {r.path.name: r for r in C.load_runs(tmp_path, "fig4")}
    assert R.CHANGE_SCOPE["02d92fa"] == {"kv_backend": ("adaptive_hisparse",)}

    def count(name):  # "made before N later changes"
        return int(C.change_mix([runs[name]]).split("made before ")[1].split()[0])

    adaptive_only = [c for c, v in R.CHANGE_SCOPE.items() if v.get("kv_backend") == (
        "adaptive_hisparse",)]  # fmt: skip
    speculative = [c for c, v in R.CHANGE_SCOPE.items() if v.get("speculative")]
    # neither run has a drafter (speculation: null), the unknown run's config does not say
    assert count("unknown") == count("adaptive_hisparse") + len(speculative)
    assert count("adaptive_hisparse") == count("hisparse") + len(adaptive_only)
    assert "02d92fa" not in C.change_mix([runs["hisparse"]])
