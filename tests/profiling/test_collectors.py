"""maybe_profile dispatch, a real CPU torch.profiler run over ranges, the engine-fed
collectors, and the nsight extra's skip path and case builder."""

from __future__ import annotations

import json

import pytest
import torch

from profiling import ranges as R
from profiling.collectors import maybe_profile
from profiling.kernel_timeline import maybe_profile_kernels


@pytest.mark.parametrize("cfg", [None, {"name": "none"}, {}])
def test_off_yields_none(cfg, tmp_path):
    with maybe_profile(cfg, out_dir=tmp_path) as prof:
        assert prof is None
    with maybe_profile_kernels(cfg) as prof:
        assert prof is None
    assert not list(tmp_path.iterdir())


def test_unknown_name_is_an_error():
    with pytest.raises(ValueError, match="profile.name"):
        with maybe_profile({"name": "flamegraph"}):
            pass


def test_hydra_configs_compose():
    from systems.engine.config import compose

    for name in ("none", "kernels", "memory", "census", "nsight", "host"):
        cfg = compose([f"profile={name}"])
        assert cfg.profile.name == name
        assert "output_dir" in cfg.profile or name == "none"


def test_ranges_are_noops_when_off():
    prev = R.enable_ranges(False)
    try:
        a = R.nvtx_range(R.MLP)
        b = R.nvtx_range(R.PROJ)
        assert a is b  # one shared null context: no allocation per range
        with a:
            pass
    finally:
        R.enable_ranges(prev)


def test_kernels_profile_on_cpu_classifies_ops(tmp_path):
    """A real torch.profiler run: CPU ops stand in for kernels and inherit range families."""
    x = torch.randn(16, 16)
    cfg = {
        "name": "kernels",
        "wait": 1,
        "warmup": 1,
        "active": 2,
        "repeat": 1,
        "write_events": True,
    }
    before = R.ranges_enabled()
    with maybe_profile(cfg, out_dir=tmp_path) as prof:
        assert prof is not None and R.ranges_enabled()
        for _ in range(5):
            with R.nvtx_range(R.STEP):
                with R.nvtx_range(R.PROJ):
                    h = x @ x
                with R.nvtx_range(R.MLP):
                    h = torch.relu(h @ x) @ x
                with R.nvtx_range(R.RESOLVER):
                    torch.topk(h, 4, dim=-1)
                torch.softmax(h, dim=-1)  # no range: the name decides
            prof.step(sessions=3)
    rep = prof.reports[0]
    assert len(rep.steps) == 2  # active steps only
    fams = {(k.name, k.family) for k in rep.events if k.step is not None}
    assert ("aten::matmul", "dense_projection") in fams
    assert ("aten::matmul", "expert_mlp_matmul") in fams
    assert ("aten::topk", "resolver") in fams
    assert ("aten::softmax", "indexing_attention") in fams
    for row in rep.steps:
        parts = sum(row[f"alone_{f}_us"] for f in R.FAMILIES) + row["several_us"] + row["idle_us"]
        assert parts == pytest.approx(row["dur_us"])
        assert row["resolver_calls"] == 1
    out = tmp_path / "kernels"
    assert (out / "trace_0.json.gz").exists() and (out / "kernel_steps.csv").exists()
    summ = json.loads((out / "kernel_summary.json").read_text())
    assert summ["cycles"][0]["num_steps"] == 2
    assert prof.summary["work_expert_mlp_matmul_ms"] > 0
    assert prof.summary["sessions_per_step"] == 3 == summ["cycles"][0]["sessions_per_step"]
    assert R.ranges_enabled() == before  # switched back off on exit


def _run_engine(eng, n_req=2, new_tokens=4, prof=None):
    from systems.engine.request import Request, SamplingParams

    g = torch.Generator().manual_seed(0)
    for _ in range(n_req):
        eng.submit(
            Request(
                eng.new_rid(),
                torch.randint(2, 500, (40,), generator=g).tolist(),
                SamplingParams(max_new_tokens=new_tokens),
            )
        )
    for _ in range(1000):
        did = eng.step()
        if prof is not None and did:
            prof.step()
        if not eng.scheduler.running and not eng.scheduler.waiting and eng._inbox.empty():
            return
    raise RuntimeError("engine did not go idle")


def test_memory_and_census_collectors_on_an_engine(tmp_path):
    from tests.helpers import make_engine

    eng = make_engine("system=hisparse")
    with maybe_profile({"name": "census", "interval_s": 0.0}, out_dir=tmp_path, source=eng) as cen:
        with maybe_profile(
            {"name": "memory", "interval_s": 0.0}, out_dir=tmp_path, source=eng
        ) as mem:
            _run_engine(eng, prof=None)
            mem.step()
            cen.step()
    c = json.loads((tmp_path / "census" / "census.json").read_text())["census"]
    # 2 x 4 tokens generated, the first of each from the prefill at admission (no lookup):
    # "per token" counts the 6 decoded ones
    assert c["tokens"] == 6 and c["requests"] == 2
    assert c["row_lookups"] > 0
    assert c["direct_share"] + c["hot_share"] + c["host_share"] == pytest.approx(1.0)
    assert c["follower_split"] == "geometry"
    geo = json.loads((tmp_path / "census" / "census.json").read_text())["geometry"]
    assert geo["selecting_layers"] == eng.cfg.model.num_selecting_layers
    assert (tmp_path / "memory" / "memory_timeline.csv").exists()
    assert len(mem.rows) >= 2


def test_nsight_skips_without_ncu(tmp_path, capsys):
    from profiling import nsight as N

    ok, why = N.nsight_available()
    if ok:
        pytest.skip("nsight-python and ncu are present here")
    assert why
    with maybe_profile({"name": "nsight", "cases": "smoke"}, out_dir=tmp_path) as prof:
        assert prof is None
    assert N.profile_resolver(N.PRESETS["smoke"]) is None
    assert "skipped" in capsys.readouterr().err


@pytest.mark.parametrize(
    "case_kw",
    [
        dict(batch=2, queries=1, k=16, hot_rows=32, misses=5, direct=3),
        dict(batch=2, queries=3, k=16, hot_rows=32, misses=4, disjoint=True),
        dict(batch=1, queries=2, k=16, hot_rows=16, misses=10, disjoint=True),  # overflow: staging
    ],
)
def test_resolver_case_builder_counts(case_kw):
    """The synthetic call resolves as designed: exactly the planned host rows are copied."""
    from profiling import nsight as N
    from systems.kernels.resolver import (
        COUNTER_DIRECT,
        COUNTER_HOST_COPIES,
        COUNTER_HOST_SEL,
        COUNTER_HOT_HIT,
    )

    case = N.ResolverCase(page_size=16, row_bytes=32, **case_kw)
    call = N.warm(N.build_call(case, "cpu"), impl="reference")
    Q, k, m, d = case.queries, case.k, case.misses, case.direct
    uniq = m * (Q if case.disjoint else 1)
    c = call.counters
    assert c[COUNTER_HOST_COPIES] == case.batch * uniq
    assert c[COUNTER_HOST_SEL] == case.batch * Q * m
    assert c[COUNTER_DIRECT] == case.batch * Q * d
    assert c[COUNTER_HOT_HIT] == case.batch * Q * (k - m - d)
    assert call.host_bytes == case.batch * uniq * case.row_bytes
    # reset restores the cache: a second call copies the same rows again
    res = call(impl="reference")
    assert int(res.counters[:, COUNTER_HOST_COPIES].sum()) == case.batch * uniq
    loc = res.locations
    assert int((loc < 0).sum()) == 0  # staging took every overflow row


def test_step_from_another_thread_warns():
    import threading

    cfg = {"name": "kernels", "wait": 100, "warmup": 1, "active": 1}
    caught = []
    with maybe_profile(cfg) as prof:

        def other():
            with pytest.warns(RuntimeWarning, match="engine thread") as w:
                prof.step()
            caught.extend(w)

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert caught


def test_admission_opens_the_handoff_range(monkeypatch):
    """KVBackend.admit runs inside ``dhs::handoff`` (docs/profiling.md's table): a copy a
    handoff queues, a reclaim's backup included, is admission's work in a profile."""
    from systems.kv import base
    from tests.helpers import make_engine

    opened = []
    real = base.nvtx_range

    def spy(name):
        opened.append(name)
        return real(name)

    monkeypatch.setattr(base, "nvtx_range", spy)
    eng = make_engine("system=hisparse", "system.kv.hot_cache_rows=8")
    entry = eng.prefixes.get(list(range(2, 40)))[0]
    slot = eng.backend.admit(entry.prefix, 4)
    assert opened == [R.HANDOFF]
    eng.backend.release(slot)
