"""Issue 23's protocol: experiments written in the paper's concurrency (mapped to ours in
harness.run, one place), and interleaved repeats in harness.reproduce (A B C A B C ..., a
throwaway warm-up run first, one run group, a distinct run id per repeat), without changing the
id of any run committed before."""

import json
from pathlib import Path

import pytest

import harness.reproduce as rp
from harness.environment import REPO
from harness.results import compared_loads, load_runs
from harness.run import _load_points, check_keys, point_plan, run_id
from systems.engine.config import compose

# Run ids of committed runs, as harness.run derived them before the paper-C key and the repeats
# existed (the hash part is what results/ holds: the legacy names keep the same hash).
COMMITTED_IDS = {
    ("fig4", "system=hisparse"): [
        "hisparse-glm53_mini-c4-B1024-4d20f7cc",
        "hisparse-glm53_mini-c16-B1024-7ed5de0b",
        "hisparse-glm53_mini-c64-B1024-3f5137a0",
        "hisparse-glm53_mini-c128-B1024-cf88e968",
    ],
    ("fig7", "system=adaptive_dhisparse"): [
        "adaptive_dhisparse-glm53_mini-c32-B1024-K4-80a44872",
        "adaptive_dhisparse-glm53_mini-c64-B1024-K4-03c9a8bc",
        "adaptive_dhisparse-glm53_mini-c128-B1024-K4-4d3b3bec",
    ],
    ("fig9", "system=hisparse"): [
        "hisparse-glm53_mini-c8-B512-d3e3e36b",
        "hisparse-glm53_mini-c128-B512-d50a45e2",
    ],
    ("fig6", "system=adaptive_hisparse"): ["adaptive_hisparse-glm53_mini-step-B1024-c7f2794a"],
}


@pytest.mark.parametrize("exp,system", list(COMMITTED_IDS))
def test_configs_without_the_new_keys_keep_their_run_ids(exp, system):
    ov = next(o for o in rp.plan(exp, smoke=False) if system in o)
    cfg = rp._run_cfg(ov, None)
    assert "repeat" not in cfg and "paper_concurrency" not in cfg.workload
    assert [run_id(cfg, p) for p in _load_points(cfg)] == COMMITTED_IDS[(exp, system)]
    _, plan = point_plan(cfg)
    assert all(done for _, _, done in plan)  # and results/ holds them finished
    for (_, rid, _), want in zip(plan, COMMITTED_IDS[(exp, system)]):
        assert rid.rsplit("-", 1)[1] == want.rsplit("-", 1)[1]


def test_paper_concurrency_is_mapped_in_one_place():
    cfg = compose(["experiment=fig4_protocol", "system=hisparse"])
    assert cfg.workload.concurrency is None and list(cfg.workload.paper_concurrency) == [32, 128]
    assert _load_points(cfg) == [
        {"concurrency": 8, "paper_concurrency": 32, "tag": "c8"},
        {"concurrency": 32, "paper_concurrency": 128, "tag": "c32"},
    ]
    # the same loads given in our C measure something else: another id (the paper's C is hashed)
    ours = compose(
        ["experiment=fig4_protocol", "system=hisparse", "workload.paper_concurrency=null"]
        + ["workload.concurrency=[8,32]"]
    )
    assert [p["tag"] for p in _load_points(ours)] == ["c8", "c32"]
    assert run_id(ours, _load_points(ours)[1]) != run_id(cfg, _load_points(cfg)[1])
    # our C agreeing with the mapping is accepted; a contradiction or an unmappable C is an error
    same = compose(["experiment=fig4_protocol", "system=hisparse", "workload.concurrency=[8,32]"])
    assert _load_points(same) == _load_points(cfg)
    with pytest.raises(ValueError, match="workload.concurrency says"):
        _load_points(compose(["experiment=fig4_protocol", "workload.concurrency=[32,128]"]))
    with pytest.raises(ValueError, match="multiple of 4"):
        _load_points(compose(["experiment=fig4_protocol", "workload.paper_concurrency=[30]"]))
    check_keys(cfg)  # an optional workload key, not an unknown one
    # the DeepSeek-like presets stand for a deployment of two decode GPUs: C maps to C/2
    dsv = compose(
        ["model=dsv41_mini", "workload.concurrency=null", "+workload.paper_concurrency=[128]"]
    )
    assert _load_points(dsv) == [{"concurrency": 64, "paper_concurrency": 128, "tag": "c64"}]


def test_a_repeat_is_part_of_the_id_only_when_set():
    base = ["experiment=fig4_protocol", "system=hisparse"]
    ids = {}
    for extra in ([], ["+repeat=1"], ["+repeat=2"], ["+repeat=2", "reproduce.repeats=5"]):
        cfg = rp._run_cfg(base + extra, None)
        check_keys(cfg, reproduce_keys=True)
        ids[tuple(extra)] = run_id(cfg, _load_points(cfg)[1])
    assert "-rep" not in ids[()] and "-rep1-" in ids[("+repeat=1",)]
    assert len({ids[()], ids[("+repeat=1",)], ids[("+repeat=2",)]}) == 3
    # how many repeats the plan makes is no part of what one of them measured
    assert ids[("+repeat=2",)] == ids[("+repeat=2", "reproduce.repeats=5")]


def test_the_plan_interleaves_the_compared_systems():
    (group,) = rp.groups("fig4_protocol", smoke=False)
    assert group.repeats == 3
    order = [(o[1], o[-1]) for o in group.runs]
    systems = ["system=hisparse", "system=adaptive_hisparse", "system=adaptive_dhisparse"]
    assert order == [(s, f"+repeat={i}") for i in (1, 2, 3) for s in systems]
    assert rp.plan("fig4_protocol", smoke=False) == group.runs
    # --where picks one round, --system one system's repeats, without changing a run
    assert rp.select(group.runs, None, ["repeat=2"]) == group.runs[3:6]
    assert rp.select(group.runs, ["hisparse"], None) == group.runs[0::3]
    # an experiment without repeats keeps its plan: one run per system and sweep value
    assert all(g.repeats is None and len(g.runs) == 1 for g in rp.groups("fig9", smoke=False))


def _main_calls(monkeypatch, tmp_path, pending=True, argv=(), warm_dir=None):
    calls = []
    monkeypatch.setattr(rp, "has_gpu", lambda: True)
    monkeypatch.setattr(rp, "has_pending", lambda *a, **k: pending)
    monkeypatch.setattr(
        rp, "warm_up", lambda ov, tags, results=None: calls.append(("warm-up", ov, None))
    )
    monkeypatch.setattr(
        rp, "run_one", lambda ov, res, tags, run_group=None: calls.append(("run", ov, run_group))
    )
    monkeypatch.setattr("harness.summaries.write_all", lambda *a: {})
    monkeypatch.setenv("DHS_RUN_GROUP", "batch-7")
    if warm_dir is None:  # gpu_batch.sh's machine-local marks: not here
        monkeypatch.delenv("DHS_WARM_DIR", raising=False)
    else:
        monkeypatch.setenv("DHS_WARM_DIR", str(warm_dir))
    assert rp.main(["--only", "fig4_protocol", "--results", str(tmp_path), *argv]) == 0
    return calls


def test_reproduce_runs_a_warm_up_per_system_then_the_rounds_in_one_run_group(
    monkeypatch, tmp_path
):
    calls = _main_calls(monkeypatch, tmp_path)
    assert [(c[0], c[1][1]) for c in calls[:3]] == [
        ("warm-up", "system=hisparse"),
        ("warm-up", "system=adaptive_hisparse"),
        ("warm-up", "system=adaptive_dhisparse"),
    ]
    runs = calls[3:]
    assert [c[0] for c in runs] == ["run"] * 9
    assert [(c[1][1], c[1][-1]) for c in runs] == [
        (s, f"+repeat={i}")
        for i in (1, 2, 3)
        for s in ("system=hisparse", "system=adaptive_hisparse", "system=adaptive_dhisparse")
    ]
    assert {c[2] for c in runs} == {"batch-7/fig4_protocol"}
    # nothing left to measure: no warm-up (the runs themselves skip their finished points)
    calls = _main_calls(monkeypatch, tmp_path, pending=False)
    assert [c[0] for c in calls] == ["run"] * 9
    # a subset keeps the interleaving and the warm-up
    calls = _main_calls(monkeypatch, tmp_path, argv=["--system", "adaptive_dhisparse"])
    assert [c[0] for c in calls] == ["warm-up"] + ["run"] * 3
    assert calls[0][1][1] == "system=adaptive_dhisparse"


def test_a_machine_warms_a_configuration_up_once(monkeypatch, tmp_path):
    """With DHS_WARM_DIR (gpu_batch.sh's), a later call that runs another repeat of the same
    group on the same machine skips the warm-ups its systems already had; other overrides are
    another configuration, warmed up again."""
    warm = tmp_path / "warm"
    first = _main_calls(monkeypatch, tmp_path, argv=["--where", "repeat=1"], warm_dir=warm)
    assert [c[0] for c in first] == ["warm-up"] * 3 + ["run"] * 3
    assert len(list(warm.iterdir())) == 3
    again = _main_calls(monkeypatch, tmp_path, argv=["--where", "repeat=2,3"], warm_dir=warm)
    assert [c[0] for c in again] == ["run"] * 6
    other = _main_calls(
        monkeypatch, tmp_path, argv=["--where", "repeat=2", "workload.output_len=64"], warm_dir=warm
    )
    assert [c[0] for c in other] == ["warm-up"] * 3 + ["run"] * 3


def test_dry_run_shows_the_interleaved_order(capsys, tmp_path):
    assert rp.main(["--dry-run", "--only", "fig4_protocol", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("[reproduce] experiment=")]
    assert [ln.split()[2:4] for ln in lines] == [
        [s, f"+repeat={i}"]
        for i in (1, 2, 3)
        for s in ("system=hisparse", "system=adaptive_hisparse", "system=adaptive_dhisparse")
    ]
    assert "interleaved group 'fig4_protocol': 3 repeat(s) of 3 system(s)" in out
    assert (
        "throwaway warm-up run per system (hisparse, adaptive_hisparse, adaptive_dhisparse for "
        "c8: one wave at C8" in out
    )
    assert "-rep2-" in out and "(paper C128): pending" in out
    assert "fig4_protocol       0 done   18 pending" in out


def test_a_load_step_warms_up_at_its_peak(capsys, tmp_path):
    """fig6_h200 steps C4 -> C64 -> C4: its warm-up wave runs at C64, so the kernels of the
    batch sizes the peak meets compile there, not in the first measured run."""
    assert rp.warm_up_point(rp.plan("fig6_h200", smoke=False)[0], None) == ("step", 64)
    assert rp.main(["--dry-run", "--only", "fig6_h200", "--results", str(tmp_path)]) == 0
    assert "(adaptive_hisparse for step: one wave at C64, not kept)" in capsys.readouterr().out


def test_an_experiment_caps_its_warm_up_wave_without_changing_a_run_id(tmp_path):
    """fig5_h200's C256 warm-up would be minutes of 125K-token handoffs a system:
    reproduce.warm_up_concurrency runs it at C64, and is no part of any run's id (fig11b_h200
    inherits it: its runs keep the ids they had before the key existed)."""
    from harness.results import REPRODUCE_UNHASHED

    ov = rp.plan("fig5_h200", smoke=False)[0]
    assert rp.warm_up_point(ov, None) == ("c256", 64)
    assert "warm_up_concurrency" not in rp._run_cfg(ov, None).reproduce
    assert "warm_up_concurrency" in REPRODUCE_UNHASHED
    assert rp.warm_up_point(rp.plan("fig4_h200", smoke=False)[0], None) == ("c32", 32)


def test_the_warm_up_is_one_wave_of_capped_outputs(monkeypatch):
    """fig1_h200's warm-up: one closed-loop wave at its load (C32), each request's output capped
    at WARM_UP_OUTPUT_TOKENS (its runs' 4,000 tokens would make the throwaway wave as long as a
    measured run); fig4_h200's 1,024-token outputs stay whole."""
    import harness.run

    seen = []
    monkeypatch.setattr(harness.run, "run", lambda cfg, reproduce_keys: seen.append(cfg.workload))
    for exp in ("fig1_h200", "fig4_h200"):
        rp.warm_up(rp.plan(exp, smoke=False)[0], None)
    assert [(w.concurrency, w.num_requests, w.min_waves) for w in seen] == [([32], 32, 1)] * 2
    assert [w.output_len for w in seen] == [rp.WARM_UP_OUTPUT_TOKENS, 1024] == [1024, 1024]
    assert compose(rp.plan("fig1_h200", smoke=False)[0]).workload.output_len == 4000


def test_the_warm_up_keeps_its_server_logs(tmp_path, monkeypatch):
    """The warm-up's run directory goes, its server's log stays beside the experiment's server
    logs (a fresh machine's start-up cost is in it), under a name no run's log has."""
    import harness.run

    def fake_run(cfg, reproduce_keys):
        d = Path(cfg.results_dir) / cfg.experiment_name
        (d / "hisparse-run").mkdir(parents=True)
        (d / ".server-hisparse-tiny").mkdir()
        (d / ".server-hisparse-tiny" / "server-1.log").write_text("start-up model 217 s\n")

    monkeypatch.setattr(harness.run, "run", fake_run)
    ov = rp.plan("fig4_protocol", smoke=True)[0]
    rp.warm_up(ov, None, results=str(tmp_path))
    exp = rp._run_cfg(ov, None).experiment_name
    kept = list(tmp_path.rglob("*.log"))
    assert [p.relative_to(tmp_path).as_posix() for p in kept] == [
        f"{exp}/.server-hisparse-tiny/warm-up-server-1.log"
    ]
    assert kept[0].read_text() == "start-up model 217 s\n"
    assert not list(tmp_path.rglob("hisparse-run"))


def test_smoke_protocol_end_to_end(tmp_path):
    """On CPU, two systems interleaved: distinct ids per repeat, one run group, the paper's C
    recorded in each run, no warm-up run among the results, and the figures fold the repeats."""
    res = tmp_path / "results"
    argv = ["--smoke", "--only", "fig4_protocol", "--results", str(res)]
    assert rp.main(argv + ["--system", "hisparse", "--system", "adaptive_hisparse"]) == 0
    dirs = sorted(d for d in (res / "fig4_protocol").iterdir() if not d.name.startswith("."))
    assert len(dirs) == 6 and all((d / "summary.json").is_file() for d in dirs)
    assert sorted(d.name.split("-")[-2] for d in dirs) == sorted(["rep1", "rep2", "rep3"] * 2)
    groups = {json.loads((d / "env.json").read_text())["run_group"] for d in dirs}
    assert len(groups) == 1 and groups.pop().endswith("/fig4_protocol")
    points = [json.loads((d / "summary.json").read_text())["point"] for d in dirs]
    assert all(p == {"concurrency": 2, "paper_concurrency": 8, "tag": "c2"} for p in points)
    assert sorted(p.name for p in res.iterdir()) == ["fig4_protocol"]  # the warm-up is not kept
    runs = load_runs(res, "fig4_protocol")
    assert len(runs) == 2 and all(len(r.repeats) == 3 for r in runs)
    assert compared_loads(runs) == {8: 2}


def test_gpu_batch_prewarm_overrides_are_accepted():
    """benchmarks/gpu_batch.sh's throwaway run marks itself +prewarm=1: an unknown key would stop
    it before it serves anything (and its output is filtered, so nobody would see why)."""
    text = (REPO / "benchmarks" / "gpu_batch.sh").read_text()
    assert "+prewarm=1" in text
    check_keys(compose(["experiment=hisparse_e2e", "system=adaptive_dhisparse", "+prewarm=1"]))


def test_system_overrides_reach_only_their_system_and_keep_the_others_ids():
    """fig4_h200_c256 gives the adaptive systems three waves (reproduce.system_overrides) and
    Resident its one: the override is in those systems' runs (so their ids change), while
    Resident's committed runs keep their ids (the key itself is plan metadata, not hashed)."""
    (group,) = rp.groups("fig4_h200_c256", smoke=False)
    for ov in group.runs:
        adaptive = ov[1] in ("system=adaptive_hisparse", "system=adaptive_dhisparse")
        assert ("workload.num_requests=192" in ov) == adaptive
    resident = [ov for ov in group.runs if ov[1] == "system=resident"]
    ids = [rid for ov in resident for _, rid, _ in point_plan(rp._run_cfg(ov, None))[1]]
    committed = {p.name for p in (REPO / "results" / "fig4_h200_c256").glob("resident-*")}
    assert {"resident-glm53_h200-c64-rep1-ec750c25", "resident-glm53_h200-c64-rep2-199ccedb"} <= (
        set(ids) & committed
    )
    # the smoke's own request count still wins over a system's
    (smoke,) = rp.groups("fig4_h200_c256", smoke=True)
    for ov in smoke.runs:
        assert ov.index("workload.num_requests=3") > max(
            (i for i, o in enumerate(ov) if o == "workload.num_requests=192"), default=-1
        )


def test_system_overrides_must_name_a_system_of_the_experiment(monkeypatch):
    from systems.engine import config as engine_config

    orig = engine_config.compose

    def compose(overrides):
        cfg = orig(overrides)
        cfg.reproduce.system_overrides = {"hisparse": {"workload.num_requests": 9}}
        return cfg

    monkeypatch.setattr(engine_config, "compose", compose)
    with pytest.raises(ValueError, match="system_overrides names systems"):
        rp.groups("fig4_h200_c256", smoke=False)


def test_a_system_on_another_kv_backend_is_named_for_both():
    """A quick try of a backend under an existing system (system.kv_backend=...) is filed as
    neither that system nor its backend: ``resident+hisparse``, in its run ids too."""
    from harness.run import name_backend

    cfg = compose(["system=resident", "system.kv_backend=hisparse"])
    name_backend(cfg)
    assert cfg.system.name == "resident+hisparse"
    assert run_id(cfg, _load_points(cfg)[0]).startswith("resident+hisparse-")
    name_backend(cfg)  # named once
    assert cfg.system.name == "resident+hisparse"
    own = compose(["system=adaptive_dhisparse"])
    name_backend(own)
    assert own.system.name == "adaptive_dhisparse"
