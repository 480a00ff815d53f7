"""Every experiment config composes and runs end to end in smoke mode on CPU, and the figure
scripts draw from what it produced."""

import json

import pytest

from harness.reproduce import experiments, groups, plan, select
from harness.reproduce import main as reproduce_main


def test_every_experiment_has_a_plan():
    names = experiments()
    assert {"fig1", "fig4", "fig5", "fig6", "fig7", "fig9", "fig9_dsv", "fig11"} <= set(names)
    for n in names:
        runs = plan(n, smoke=True)
        assert runs and all(f"experiment={n}" in r for r in runs)


def test_every_experiment_sets_global_keys():
    """An experiment file without '# @package _global_' nests its keys under ``experiment.``:
    it composes, but its loads and sizes silently stay the parent's (fig4_more ran Fig. 4's
    loads that way on the H200 once)."""
    from pathlib import Path

    from systems.engine.config import compose

    for n in experiments():
        text = (
            Path(__file__).resolve().parents[2] / "conf" / "experiment" / f"{n}.yaml"
        ).read_text()
        assert text.lstrip().startswith("# @package _global_"), n
        cfg = compose([f"experiment={n}"])
        assert "experiment" not in cfg and cfg.experiment_name, n
    more = compose(["experiment=fig4_more"])
    assert list(more.workload.concurrency) == [32, 256] and more.experiment_name == "fig4"
    assert more.hardware.max_running_requests == 256


def _smoke_plans() -> tuple[list[str], list[str], dict]:
    """(experiments with interleaved repeats, the others, each one's smoke runs)."""
    plans = {n: groups(n, smoke=True) for n in experiments()}  # composed once, read below
    repeated = [n for n, gs in plans.items() if any(g.repeats for g in gs)]
    once = [n for n in plans if n not in repeated]
    return repeated, once, {n: [ov for g in gs for ov in g.runs] for n, gs in plans.items()}


def _only(names: list[str]) -> list[str]:
    return [a for n in names for a in ("--only", n)]


def _all_ran(res, expected: int) -> list:
    summaries = list(res.glob("*/*/summary.json"))  # run dirs (not results/fig6/summary.json)
    assert len(summaries) >= expected  # one run per combination and load point
    for s in summaries:
        d = json.loads(s.read_text())
        assert d["completed"] > 0 and d["errors"] == 0, s
    return summaries


def test_smoke_reproduction_of_the_interleaved_experiments(tmp_path, monkeypatch):
    """The experiments with interleaved repeats (the H200 re-runs, the protocol) run their first
    round only: every config composes and runs, and a round's repeats differ by their marker
    alone (tests/harness/test_protocol.py runs a protocol's three rounds end to end). Their
    throwaway warm-up runs are recorded, not run: reproduce only prints a failed warm-up and goes
    on with the measured runs, so here they could fail nothing (test_protocol.py runs them). Apart
    from the other experiments' smoke, so that the two share the test workers."""
    import harness.reproduce as rp

    res = tmp_path / "results"
    repeated, _, runs = _smoke_plans()
    warmed = []
    monkeypatch.setattr(
        rp, "warm_up", lambda ov, tags, results=None: warmed.append(rp.setting(ov, "experiment"))
    )
    first = ["--where", "repeat=1"]
    assert reproduce_main(["--smoke", "--results", str(res), *_only(repeated), *first]) == 0
    assert set(warmed) == set(repeated)  # a warm-up before each interleaved group
    assert repeated and all(select(runs[n], None, ["repeat=1"]) for n in repeated)
    _all_ran(res, sum(len(select(runs[n], None, ["repeat=1"])) for n in repeated))


def test_smoke_reproduction_then_figures(tmp_path, monkeypatch):
    """Every experiment without interleaved repeats runs its smoke plan; then the summaries, a
    resumed pass that redoes nothing, and every figure over those runs."""
    import harness.reproduce as rp
    from figures import make_all

    res = tmp_path / "results"
    _, once, runs = _smoke_plans()
    warmed = []
    monkeypatch.setattr(
        rp, "warm_up", lambda ov, tags, results=None: warmed.append(rp.setting(ov, "experiment"))
    )
    assert reproduce_main(["--smoke", "--results", str(res), *_only(once)]) == 0
    assert not warmed
    summaries = _all_ran(res, sum(len(runs[n]) for n in once))
    # profile=host's collector wrote its window in each of its served runs
    assert len(list(res.glob("fig10_host_h200/*/host/host_profile.json"))) == len(
        runs["fig10_host_h200"]
    )
    f6 = json.loads((res / "fig6" / "summary.json").read_text())
    for k in (
        "host_fetch_share_low_on",
        "host_fetch_share_low_off",
        "coverage_low_on",
        "seconds_to_coverage_below_1pct",
        "seconds_to_coverage_above_50pct_after_drop",
    ):
        assert k in f6
    assert f6["host_fetch_share_low_on"] is not None and f6["host_fetch_share_low_off"] is not None
    f7 = json.loads((res / "fig7" / "summary.json").read_text())
    assert {p["block"] for p in f7["points"]} == {4, 6, 8}
    assert all(
        p["emitted_tokens_per_round"] and p["emitted_tokens_per_round"] >= 1 for p in f7["points"]
    )
    # a repeat of a point (a later run of the same config, block and load) joins it: the
    # summary lists the newest run and the median output of both
    import shutil

    from harness.summaries import fig7 as fig7_summary

    src = res / f7["points"][0]["run"]
    dup = src.with_name(src.name + "-rerun")
    shutil.copytree(src, dup)
    env = json.loads((dup / "env.json").read_text())
    env["time_utc"] = "9999"  # sorts after every real run
    (dup / "env.json").write_text(json.dumps(env))
    d = json.loads((dup / "summary.json").read_text())
    d["output_tok_s_per_gpu"] = 12345.0
    (dup / "summary.json").write_text(json.dumps(d))
    f7b = fig7_summary(res)
    assert len(f7b["points"]) == len(f7["points"])
    both = (f7["points"][0]["output_tok_s_per_gpu"] + 12345.0) / 2  # the median of two
    assert [p["output_tok_s_per_gpu"] for p in f7b["points"] if p["run"].endswith("-rerun")] == [
        pytest.approx(both)
    ]
    shutil.rmtree(dup)
    fig7_summary(res)
    # resumable: a second pass finds everything finished and redoes nothing
    before = {s: s.stat().st_mtime_ns for s in summaries}
    assert reproduce_main(["--smoke", "--results", str(res), "--only", "fig4"]) == 0
    assert all(s.stat().st_mtime_ns == t for s, t in before.items())
    # REPRODUCTION.md's pending-runs paragraph composes the config of every run of every full
    # (not smoke) plan, a sixth of this test's time, and smoke runs are never the full plan's;
    # its own test is in tests/figures/test_figures.py
    monkeypatch.setattr(make_all, "_stale_runs_note", lambda results: [])
    out = tmp_path / "out"
    rc = make_all.main(
        [
            "--results",
            str(res),
            "--out",
            str(out),
            "--report",
            str(tmp_path / "REPRODUCTION.md"),
            "--dpi",  # the images' resolution is no part of this test (nor its time)
            "30",
            "--quiet",
        ]
    )
    assert not rc["failures"] and len(rc["reports"]) == 15
    assert (out / "fig4.png").exists() and (out / "table2.md").exists()
    assert "paper" in (tmp_path / "REPRODUCTION.md").read_text().lower()


def test_subset_selection_keeps_the_full_sweeps_run_ids(tmp_path):
    """--system / --where / --point pick runs out of the plan without changing their configs:
    the subset's run ids are the ones the full sweep writes, so the full sweep resumes them."""
    from harness.reproduce import select

    runs = plan("fig9", smoke=True)
    sub = select(runs, ["hisparse"], ["b_over_k=4,8"])
    assert [r for r in sub if "+b_over_k=4" in r] and len(sub) == 2
    assert all("system=hisparse" in r for r in sub)
    assert select(runs, None, ["b_over_k=3"]) == [] and select(runs, None, None) == runs
    res = tmp_path / "results"
    assert (
        reproduce_main(
            [
                "--smoke",
                "--results",
                str(res),
                "--only",
                "fig9",
                "--system",
                "hisparse",
                "--where",
                "b_over_k=8",
                "--point",
                "c2",
            ]
        )
        == 0
    )
    first = {p.parent.name for p in res.glob("fig9/*/summary.json")}
    assert len(first) == 1  # one run: hisparse, B = 8k, C2
    assert (
        reproduce_main(["--smoke", "--results", str(res), "--only", "fig9", "--system", "hisparse"])
        == 0
    )
    after = {p.parent.name for p in res.glob("fig9/*/summary.json")}
    assert first < after and len(after) == 4  # the first run was kept, not redone or duplicated


def test_dry_run_lists_each_point_finished_or_pending(tmp_path, capsys):
    """--dry-run names each load point's run id and whether it finished, with the load time of
    an earlier run of the same point as a guide for a time box."""
    import re

    res = tmp_path / "results"
    assert reproduce_main(["--only", "fig7", "--smoke", "--dry-run", "--results", str(res)]) == 0
    out = capsys.readouterr().out
    rids = re.findall(r"(adaptive_dhisparse-tiny-c\d+-B\d+-K\d+-[0-9a-f]{8}): pending", out)
    assert len(rids) == 3 and "finished" not in out  # three blocks, one smoke load each
    done = res / "fig7" / rids[0]
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"duration_s": 12.0}))
    (done / "config.yaml").write_text("workload: {output_len: 6}\n")
    assert reproduce_main(["--only", "fig7", "--smoke", "--dry-run", "--results", str(res)]) == 0
    out = capsys.readouterr().out
    assert f"{rids[0]}: finished" in out
    assert f"took 12 s: {rids[0]}" in out  # the other blocks' point, same system and load


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--only", "fig9", "--system", "nope"],
            "it has systems ['adaptive_hisparse', 'hisparse']",
        ),
        (["--only", "fig9", "--where", "b_over_k=3"], "b_over_k: 1, 2, 4, 8"),
        (["--only", "fig9", "--where", "b_over_k"], "--where wants key=value"),
        (["--only", "fig9", "--point", "c999"], "--point ['c999']: its load points are"),
        (["--only", "fig9", "+nope=3"], "unknown config key(s) ['nope']"),
        (["--only", "fig9,fig7", "--system", "hisparse"], "fig7: --system / --where select none"),
    ],
)
def test_a_selection_or_override_that_cannot_run_is_a_usage_error(tmp_path, capsys, argv, says):
    """Checked for every experiment before any runs (a dry run too), naming what can be chosen:
    an unknown key would otherwise change every run id and show the finished runs as pending."""
    with pytest.raises(SystemExit) as e:
        reproduce_main([*argv, "--dry-run", "--results", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_only_takes_a_comma_list(tmp_path, capsys):
    assert reproduce_main(["--only", "fig7,fig6", "--dry-run", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "experiment=fig7" in out and "experiment=fig6" in out
