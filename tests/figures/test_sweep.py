"""figures.sweep: any experiment directory's runs, one line per setting, repeats folded."""

import json

from figures import sweep


def _run(root, name, system, c, out_tok_s, B=None, K=None):
    d = root / "mysweep" / name
    d.mkdir(parents=True)
    summary = {
        "system": system,
        "model": "tiny",
        "point": {"concurrency": c, "tag": f"c{c}"},
        "output_tok_s": out_tok_s,
        "tpot_ms_mean": 1000.0 / out_tok_s,
        "ttft_ms_mean": 10.0 * c,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    sysc = {"name": system}
    if B is not None:
        sysc["kv"] = {"hot_cache_rows": B}
    if K is not None:
        sysc["speculation"] = {"block_size": K}
    cfg = {"system": sysc, "workload": {"input_len": 64, "output_len": 32}}
    (d / "config.yaml").write_text(json.dumps(cfg))


def test_lines_are_settings_and_repeats_fold_into_their_median(tmp_path):
    _run(tmp_path, "r1", "resident", 2, 500.0)
    _run(tmp_path, "r2", "resident", 8, 900.0)
    for c in (2, 8):
        for B in (32, 64):
            _run(tmp_path, f"h-{c}-{B}", "hisparse", c, 100.0 * c + B, B=B)
    _run(tmp_path, "h-8-64-again", "hisparse", 8, 1064.0, B=64)  # a repeat: median of 864 and 1064
    runs = sweep.finished_runs(tmp_path, "mysweep")
    groups = sweep.lines(runs, "concurrency")
    # B varies across the runs, so it names the lines; resident has none; model, input and
    # output are the same everywhere and stay out of the labels
    assert set(groups) == {("resident",), ("hisparse", "B=32"), ("hisparse", "B=64")}
    assert sorted(groups[("hisparse", "B=64")]) == [2, 8]
    assert sweep._median(groups[("hisparse", "B=64")][8], "output_tok_s") == 964.0
    # another x axis: the budget, one line per system and load
    by_b = sweep.lines(runs, "B")
    assert set(by_b[("hisparse",)]) == {32, 64}
    assert sweep.main(["mysweep", "--results", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "sweep-mysweep.md").read_text()
    assert (tmp_path / "o" / "sweep-mysweep.png").stat().st_size > 0
    assert "h-8-64-again" in md and md.count("| hisparse |") == 5


def test_a_directory_without_finished_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    assert sweep.main(["mysweep", "--results", str(tmp_path)]) == 1
    assert "no finished runs under" in capsys.readouterr().err


def test_a_paper_figure_says_when_its_runs_are_not_what_it_compares(tmp_path, capsys):
    """A smoke or ad-hoc sweep under a figure's experiment directory (another model, other
    loads) leaves every panel unmeasured: the report says runs were found and what plots them."""
    from figures import fig9

    d = tmp_path / "fig9" / "hisparse-tiny-c2-B16-1234abcd"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"system": "hisparse", "model": "tiny"}))
    rep = fig9.main(["--results", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"])
    assert all(r.ours is None for r in rep.rows)
    assert "Finished runs were found (1 in" in rep.md.read_text()
    assert "figures.sweep" in capsys.readouterr().err


def test_the_input_length_as_x_draws_one_line_across_lengths(tmp_path):
    for n in (64, 128, 256):
        _run(tmp_path, f"r{n}", "resident", 4, 500.0)
        cfg_path = tmp_path / "mysweep" / f"r{n}" / "config.yaml"
        cfg = json.loads(cfg_path.read_text())
        cfg["workload"]["input_len"] = n
        cfg_path.write_text(json.dumps(cfg))
    groups = sweep.lines(sweep.finished_runs(tmp_path, "mysweep"), "input_len")
    assert {k: sorted(v) for k, v in groups.items()} == {("resident",): [64, 128, 256]}


def test_a_figure_names_only_its_own_experiments_runs(tmp_path):
    """fig1's report does not point at fig10's runs (a shared prefix), only at fig1's own."""
    from figures.report import Report

    d = tmp_path / "fig10" / "run-a"
    d.mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    rep = Report("fig1", "Fig. 1")
    rep.compare("x", "a quantity", 1.0, None)
    rep._note_unused_runs(tmp_path)
    assert rep.notes == []
    (tmp_path / "fig1_h200" / "run-b").mkdir(parents=True)
    (tmp_path / "fig1_h200" / "run-b" / "summary.json").write_text("{}")
    rep._note_unused_runs(tmp_path)
    assert len(rep.notes) == 1 and "fig1_h200" in rep.notes[0]
