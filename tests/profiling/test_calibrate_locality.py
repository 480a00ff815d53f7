"""benchmarks/calibrate_locality.py end to end on CPU (tiny model): every point is written as it
is measured, and the fit needs all three published budgets (Fig. 9e's ends, Table A1's 2k)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import calibrate_locality as cl  # noqa: E402
import pytest  # noqa: E402

ARGS = ["--model", "tiny", "--device", "cpu", "--context", "120", "--requests", "2", "--steps",
        "3", "--warmup", "1", "--window", "2", "--pool-gib", "0.05", "--host-gib", "0.1"]  # fmt: skip


def _curve(goal: float, at: float):
    """A fake measurement: the share falls with lambda and meets ``goal`` at lambda ``at``."""

    def fake(lam, bk, args):
        share = goal * math.exp(-20 * (lam - at))
        return {"lambda": lam, "b_over_k": bk, "host_share_pct": share, "step_ms": 1.0,
                "min_distinct_tokens_last_window": 128}  # fmt: skip

    return fake


def _solve(monkeypatch, tmp_path, fake, *argv: str) -> dict:
    """calibrate_locality's main over ``fake`` with ``argv``; its JSON output."""
    monkeypatch.setattr(cl, "measure", fake)
    out = tmp_path / "loc.json"
    monkeypatch.setattr(sys, "argv", ["x", *argv, "--out", str(out)])
    cl.main()
    return json.loads(out.read_text())


def test_points_and_fit(tmp_path, monkeypatch):
    out = tmp_path / "loc.json"
    argv = ["x", *ARGS, "--lams", "0,0.5", "--budgets", "1,2,8", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    cl.main()
    d = json.loads(out.read_text())
    assert len(d["points"]) == 6 and d["model"] == "tiny"
    # the share over all 3 steps, and per window of 2 (the last window is the 1 step left)
    assert all(len(p["host_share_pct_by_window"]) == 2 for p in d["points"])
    assert all(0 <= p["host_share_pct"] <= 100 for p in d["points"])
    assert d["fitted_lambda"] in (0.0, 0.5) and d["fit_error_log2"] >= 0
    assert d["settings"]["temperature"] == 1.0  # the serving experiments' temperature
    # the random weights' shapes it measured, so a later change of the preset marks it stale
    assert d["model_geometry"]["hidden_size"] == 64 and "intermediate_size" in d["model_geometry"]


def test_sampled_outputs_leave_the_greedy_cycles():
    """tiny's greedy outputs cycle through a few tokens (a repeated query fetches nothing from
    host); sampled at temperature 1 they do not: the cycle detector tells the two apart."""
    from types import SimpleNamespace

    base = dict(model="tiny", device="cpu", context=120, requests=2, steps=24, warmup=1,
                window=24, pool_gib=0.05, host_gib=0.1)  # fmt: skip
    greedy = cl.measure(0.5, 1, SimpleNamespace(**base, temperature=0.0))
    sampled = cl.measure(0.5, 1, SimpleNamespace(**base, temperature=1.0))
    assert greedy["min_distinct_tokens_last_window"] <= 12
    assert sampled["min_distinct_tokens_last_window"] >= 18


def test_the_grid_needs_every_published_budget(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["x", "--lams", "0.5", "--budgets", "1,8"])
    with pytest.raises(SystemExit):
        cl.main()


def test_solve_at_bisects_to_the_papers_share(tmp_path, monkeypatch):
    """--solve-at: the share falls with lambda; bisection keeps the paper's 13.8% at B = 2k
    between its ends and the fit is the measured lambda nearest to it (a fake measurement: a
    known share curve, so the answer is known)."""

    # 13.8 % at lambda = 0.75
    d = _solve(monkeypatch, tmp_path, _curve(13.8, 0.75), "--lams", "0.7,0.8", "--solve-at", "2",
               "--iters", "3")  # fmt: skip
    lams = [p["lambda"] for p in d["points"]]
    assert lams == [0.7, 0.8, 0.75, 0.725, 0.7375] and {p["b_over_k"] for p in d["points"]} == {2}
    assert d["fitted_lambda"] == 0.75 and d["fit"].startswith("bisection at B/k = 2")


def test_solve_at_needs_a_published_budget_and_two_ends(monkeypatch):
    for extra in (["--solve-at", "4", "--lams", "0.7,0.8"], ["--solve-at", "2", "--lams", "0.7"]):
        monkeypatch.setattr(sys, "argv", ["x", *extra])
        with pytest.raises(SystemExit):
            cl.main()


def test_solve_at_stops_when_the_ends_do_not_bracket_the_paper(tmp_path, monkeypatch):
    monkeypatch.setattr(
        cl,
        "measure",
        lambda lam, bk, args: {
            "lambda": lam,
            "b_over_k": bk,
            "host_share_pct": 50.0,
            "step_ms": 1,
            "min_distinct_tokens_last_window": 128,
        },
    )
    out = tmp_path / "loc.json"
    argv = ["x", "--lams", "0.7,0.8", "--solve-at", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        cl.main()
    assert "widen --lams" in str(e.value.code)
    d = json.loads(out.read_text())
    assert d["fitted_lambda"] is None and d["bracketed"] is False
    # the upper end moved out twice (--widen 2), up to lambda = 1
    assert [p["lambda"] for p in d["points"]] == [0.7, 0.8, 0.9, 1.0]


def test_solve_at_widens_an_end_that_does_not_bracket_the_paper(tmp_path, monkeypatch):
    """The paper's share needs lambda 0.62, below both ends: the lower end moves down by the
    ends' distance until it brackets the share, then bisection runs between the new ends."""

    d = _solve(monkeypatch, tmp_path, _curve(13.8, 0.62), "--lams", "0.7,0.8", "--solve-at", "2",
               "--iters", "2")  # fmt: skip
    assert [p["lambda"] for p in d["points"]] == [0.7, 0.8, 0.6, 0.65, 0.625]
    assert d["bracketed"] and d["fitted_lambda"] == 0.625


def test_deepseek_like_presets_calibrate_to_their_own_published_points(tmp_path, monkeypatch):
    """A dsv* preset is fitted to Fig. 9g's ends (36 % at B = 2k, 9.5 % at 16k) and bisects at
    its serving budget, 16k; a grid over GLM's budgets is refused for it."""
    assert cl.paper_points("dsv41_h200") == {2: 36.0, 16: 9.5}
    assert cl.paper_points("glm53_h200")[2] == 13.8

    # 9.5 % at B = 16k for lambda = 0.8
    d = _solve(monkeypatch, tmp_path, _curve(9.5, 0.8), "--model", "dsv41_h200", "--lams",
               "0.7,0.9", "--solve-at", "16", "--iters", "1")  # fmt: skip
    assert d["paper_host_share_pct"] == {"2": 36.0, "16": 9.5}
    assert d["fitted_lambda"] == 0.8 and {p["b_over_k"] for p in d["points"]} == {16}
    # the grid needs DeepSeek's own budgets
    monkeypatch.setattr(sys, "argv", ["x", "--model", "dsv41_h200", "--budgets", "1,2,8"])
    with pytest.raises(SystemExit):
        cl.main()


def test_a_bisection_cut_after_one_end_has_no_fit(tmp_path, monkeypatch):
    """The file is written after every point: one written before the second end is measured
    (the call cut there) must not name the first end as the fit."""
    fake = _curve(9.5, 0.8)

    def cut_after_one(lam, bk, args):
        if lam != 0.75:
            raise RuntimeError("cut")
        return fake(lam, bk, args)

    with pytest.raises(RuntimeError):
        _solve(monkeypatch, tmp_path, cut_after_one, "--model", "dsv41_h200", "--lams",
               "0.75,0.8", "--solve-at", "16")  # fmt: skip
    d = json.loads((tmp_path / "loc.json").read_text())
    assert [p["lambda"] for p in d["points"]] == [0.75]
    assert d["fitted_lambda"] is None and d["bracketed"] is False


def test_a_request_that_fails_stops_the_point(monkeypatch):
    """A request whose prefill fails (out of memory, say) never runs: the point says so
    instead of stepping an engine that waits for it until the call's time box ends."""
    from types import SimpleNamespace

    from systems.engine.prefill import PrefixStore

    def oom(self, prompt_ids):
        raise MemoryError("out of memory in the prefill")

    monkeypatch.setattr(PrefixStore, "_prefill", oom)
    args = SimpleNamespace(model="tiny", device="cpu", context=120, requests=2, steps=3,
                           warmup=1, window=2, pool_gib=0.05, host_gib=0.1, temperature=1.0)  # fmt: skip
    with pytest.raises(RuntimeError, match="a request failed"):
        cl.measure(0.5, 1, args)


def test_a_point_frees_its_engine(monkeypatch):
    """Engines hold reference cycles: a point must collect its engine before the next one is
    built (with automatic collection off here, only the point's own collection can free it)."""
    import gc
    import weakref
    from types import SimpleNamespace

    import systems.engine.engine as engine_mod

    built = []

    class Recorded(engine_mod.Engine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(weakref.ref(self))

    monkeypatch.setattr(engine_mod, "Engine", Recorded)
    args = SimpleNamespace(model="tiny", device="cpu", context=120, requests=2, steps=3,
                           warmup=1, window=2, pool_gib=0.05, host_gib=0.1, temperature=1.0)  # fmt: skip
    gc.disable()
    try:
        cl.measure(0.5, 1, args)
        assert len(built) == 1 and built[0]() is None
    finally:
        gc.enable()
