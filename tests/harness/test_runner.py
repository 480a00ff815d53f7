"""The Hydra runner end to end on CPU: results layout, resumability, optional W&B."""

import json

import pytest

from harness.run import run
from systems.engine.config import compose

BASE = [
    "experiment=default_cpu",
    "server.mode=inprocess",
    "workload.concurrency=[2]",
    "workload.num_requests=4",
    "workload.output_len=5",
    "workload.warmup=0",
]


def test_run_writes_every_result_file_and_resumes(tmp_path, capsys):
    cfg = compose(BASE + [f"results_dir={tmp_path}"])
    dirs = run(cfg)
    assert len(dirs) == 1
    d = dirs[0]
    for f in ("config.yaml", "records.jsonl", "server_metrics.parquet", "summary.json", "env.json"):
        assert (d / f).exists(), f
    s = json.loads((d / "summary.json").read_text())
    assert s["completed"] == 4 and s["errors"] == 0 and s["system"] == "resident"
    assert len((d / "records.jsonl").read_text().splitlines()) == 4
    mtime = (d / "summary.json").stat().st_mtime_ns
    run(compose(BASE + [f"results_dir={tmp_path}"]))  # finished: skipped, never rewritten
    assert (d / "summary.json").stat().st_mtime_ns == mtime
    assert "finished earlier, skipping" in capsys.readouterr().out
    # an unfinished attempt is moved aside and redone
    (d / "summary.json").unlink()
    run(compose(BASE + [f"results_dir={tmp_path}"]))
    assert (d / "summary.json").exists()
    assert list(d.parent.glob(f"{d.name}.failed-*"))


def test_bad_config_fails_before_any_server_starts(tmp_path):
    with pytest.raises(ValueError, match="index_topk"):
        run(compose(BASE + [f"results_dir={tmp_path}", "model.index_topk=100000"]))
    assert not any(tmp_path.iterdir())


def test_profile_kernels_lands_in_the_run_directory(tmp_path):
    """The collectors' outputs are written when the server stops, after the run's summary: the
    summary says profile_pending until they are in place, and a run left so (cut between the
    two) is not finished for the plan."""
    from harness.run import point_plan

    cfg = compose(
        BASE
        + [
            f"results_dir={tmp_path}",
            "profile=kernels",
            "workload.num_requests=8",
            "profile.wait=1",
            "profile.active=3",
        ]
    )
    dirs = run(cfg)
    summary = dirs[0] / "kernels" / "kernel_summary.json"
    assert summary.exists()
    d = json.loads(summary.read_text())
    assert d  # steps were classified into families
    s = json.loads((dirs[0] / "summary.json").read_text())
    assert "profile_pending" not in s and point_plan(cfg)[1][0][2]
    (dirs[0] / "summary.json").write_text(json.dumps({**s, "profile_pending": True}))
    assert not point_plan(cfg)[1][0][2]  # cut before its profile came: measured again


def test_min_waves_sets_a_floor_of_waves_times_concurrency():
    from omegaconf import OmegaConf

    from harness.run import num_requests

    w = OmegaConf.create({"num_requests": 64})
    assert [num_requests(w, c) for c in (4, 128)] == [64, 128]  # default: one wave at least
    w.min_waves = 2
    assert [num_requests(w, c) for c in (4, 16, 128)] == [64, 64, 256]
    assert num_requests(w, None) == 64  # schedules and open loops have no C


def test_experiment_speculation_block_reaches_only_the_speculative_systems():
    """fig4's reproduce.speculation.acceptance (calibrated) reaches the speculative systems
    through their config's interpolation, a command-line setting still wins, and the
    non-speculative systems keep the run ids they had without the block."""
    from omegaconf import OmegaConf

    from harness.run import run_id

    point = {"concurrency": 4, "tag": "c4"}
    spec = compose(["experiment=fig4", "system=adaptive_dhisparse"])
    assert spec.system.speculation.acceptance == "calibrated"
    exact = compose(
        ["experiment=fig4", "system=adaptive_dhisparse", "system.speculation.acceptance=exact"]
    )
    assert exact.system.speculation.acceptance == "exact"
    assert run_id(spec, point) != run_id(exact, point)  # a different measurement, a different id
    assert compose(["system=resident_dspark"]).system.speculation.acceptance == "exact"  # no block

    plain = compose(["experiment=fig4", "system=hisparse"])
    assert not plain.system.get("speculation")
    bare = OmegaConf.to_container(plain, resolve=True)
    del bare["reproduce"]["speculation"]
    assert run_id(plain, point) == run_id(OmegaConf.create(bare), point)
    # the ids of this session's H200 runs (hisparse before the block existed, ADHS after it),
    # kept through the typed config's move of B to system.kv (harness.run._hashed_layout)
    assert run_id(plain, point).endswith("-4d20f7cc")
    assert run_id(spec, point).endswith("-09332484")


def test_the_h200_baseline_copies_on_a_fixed_grid_and_only_it_changes_id():
    """fig4_h200 gives its HiSparse baseline the paper's fixed copy grid (reproduce.kv reaches
    system.kv of the HiSparse system only); the adaptive systems keep the batch-scaled grid and
    the run ids they had before the key existed."""
    import harness.reproduce as rp
    from harness.run import point_plan
    from systems.engine.config import kv_options_from, model_config_from

    ids = {}
    for ov in rp.plan("fig4_h200", smoke=False)[:3]:  # repeat 1 of each system
        cfg = rp._run_cfg(ov, None)
        ids[cfg.system.name] = (cfg.system.kv.copy_grid, point_plan(cfg)[1][0][1])
    assert ids["hisparse"][0] == 4 and ids["adaptive_hisparse"][0] == 0
    assert ids["adaptive_hisparse"][1].endswith("-0cbeb5cf")  # committed in results/fig4_h200
    assert ids["adaptive_dhisparse"][1].endswith("-8e7bee80")
    assert ids["hisparse"][1].endswith("-80e0e6ae")  # committed; the scaled grid's was -1c8ce751
    assert compose(["system=hisparse"]).system.kv.copy_grid == 0  # no experiment, no fixed grid
    cfg = compose(["system=hisparse", "system.kv.copy_grid=-1"])
    with pytest.raises(ValueError, match="copy_grid"):
        kv_options_from(cfg.system, model_config_from(cfg.model, "cpu"), "cpu")


def test_the_budget_sweep_keeps_the_pools_of_2k_and_only_other_budgets_change_id():
    """fig9_h200 sizes the pools for B = 2k whatever B is (reproduce.kv.pools_sized_for_rows);
    at B = 2k that is the default's build, so those runs keep their committed ids (and the
    experiments built on fig9_h200 at B = 2k theirs)."""
    import harness.reproduce as rp
    from harness.run import point_plan

    ids = {}
    for ov in rp.plan("fig9_h200", smoke=False)[:4]:  # repeat 1 of each budget
        cfg = rp._run_cfg(ov, None)
        ids[int(cfg.system.kv.hot_cache_rows)] = (
            cfg.system.kv.pools_sized_for_rows,
            point_plan(cfg)[1][0][1],
        )
    assert {n for n, _ in ids.values()} == {2048}
    assert ids[2048][1].endswith("-f33ac9a6")  # committed in results/fig9_h200
    assert ids[8192][1].endswith("-d89ec3b2")  # the shared pool's was -0d3d3383
    assert compose(["system=hisparse"]).system.kv.pools_sized_for_rows == 0
    # the DeepSeek-like sweeps keep the pools of the preset's B = 16k (2,048 rows at k = 128)
    for exp in ("fig9_dsv_h200", "fig10_dsv_h200"):
        cfgs = [rp._run_cfg(ov, None) for ov in rp.plan(exp, smoke=False)[:4]]
        assert {int(c.system.kv.hot_cache_rows) for c in cfgs} == {256, 512, 1024, 2048}
        assert {c.system.kv.pools_sized_for_rows for c in cfgs} == {2048}


def test_a_skipped_nsight_profile_says_why_on_the_console(tmp_path, capsys):
    """On a machine without nsight-python / ncu / a GPU the server skips profile=nsight; the
    harness says so where the user looks, not only in the server's log."""
    from profiling.nsight import nsight_available

    ok, why = nsight_available()
    if ok:
        pytest.skip("nsight can run here")
    run(
        compose(
            BASE
            + [
                f"results_dir={tmp_path}",
                "profile=nsight",
                "workload.num_requests=1",
                "workload.output_len=2",
            ]
        )
    )
    out = capsys.readouterr().out
    assert f"profile=nsight will be skipped: {why}" in out
