"""The W&B dashboard definition (harness/dashboard.py), built offline: every key its panels read
is one that runs log, with the logged keys taken from the logger's own output on a small run."""

import json
import re

import harness.wandb_logger as wl
from harness import dashboard
from harness.environment import REPO
from harness.reproduce import _run_cfg, plan
from harness.run import _load_points, run, wandb_labels
from systems.engine.config import compose
from tests.harness.test_wandb import BASE, logged_keys, record_wandb


def test_offline_make_dashboard_writes_the_definition(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "dash.json"
    assert dashboard.main(["--out", str(out)]) == 0
    spec = json.loads(out.read_text())
    assert set(spec) == {"workspace", "report"}
    text = capsys.readouterr().out
    for fam in dashboard.FAMILIES:
        assert fam.name in text  # says what it would create
        assert fam.name in json.dumps(spec["workspace"]) and fam.name in json.dumps(spec["report"])
    assert "experiment:fig9" in json.dumps(spec["report"])  # sections select runs by tag


def test_panels_read_only_keys_that_runs_log(tmp_path, monkeypatch):
    runs = record_wandb(monkeypatch)
    # a serving run of the hierarchy through the real logger: history and summary keys
    run(
        compose(
            BASE
            + [
                f"results_dir={tmp_path}",
                "system=adaptive_hisparse",
                "workload.schedule='2:1,3:1,2:1'",
            ]
        )
    )
    history_and_summary = logged_keys(runs[-1])
    # config keys: the logger's run_config for every experiment a section reads
    config_keys: set[str] = set()
    # (a family's re-runs under other names, fig4_h200 and the like, log the same keys)
    experiments = {e for f in dashboard.FAMILIES for e in f.experiments}
    conf_experiments = {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}
    for exp in sorted(experiments & conf_experiments):
        one_per_system = {ov[1]: ov for ov in plan(exp, smoke=False)}  # ov[1]: system=...
        for ov in one_per_system.values():
            cfg = _run_cfg(ov, None)
            for point in _load_points(cfg):  # what harness.run logs, nothing added by hand
                config_keys |= set(wl.run_config({}, wandb_labels(cfg, point)))
    # figure images: attach_figures on one file per figure script
    figs = tmp_path / "figs"
    figs.mkdir()
    names = [
        p.stem for p in (REPO / "figures").glob("*.py") if re.fullmatch(r"(fig|table)\w+", p.stem)
    ]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for n in names:
        plt.figure(figsize=(1, 1)).savefig(figs / f"{n}.png")
        plt.close("all")
    assert wl.attach_figures(figs) == len(names)
    media = logged_keys(runs[-1])

    keys = dashboard.panel_keys()
    assert keys.summary <= history_and_summary, keys.summary - history_and_summary
    assert keys.history <= history_and_summary, keys.history - history_and_summary
    assert keys.config <= config_keys, keys.config - config_keys
    assert keys.media <= media, keys.media - media
    # sections select runs by experiment tags that runs carry: a serving experiment's runs
    # are tagged with its experiment_name, the figures run with each figure's name
    figure_run_tags = set(runs[-1].kw["tags"])
    for fam in dashboard.FAMILIES:
        for exp in fam.experiments:
            tag = f"experiment:{exp}"
            served = exp in conf_experiments and tag in wl.tags(
                {"experiment": compose([f"experiment={exp}"]).experiment_name}
            )
            assert served or tag in figure_run_tags, tag


def test_sections_read_the_re_runs_of_their_experiments_too():
    """A section's tags take in its experiments' re-runs under other names (the H200 presets'
    runs, where the claims come from), by the experiment_name their runs are tagged with."""
    tags = {t for f in dashboard.FAMILIES for t in f.tags()}
    for name in ("fig4_h200", "fig4_h200_sweep", "fig5_h200", "fig6_h200", "fig9_dsv_h200"):
        assert f"experiment:{name}" in tags
    assert "experiment:fig4_more" not in tags  # its runs are tagged experiment:fig4
