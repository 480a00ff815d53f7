"""benchmarks/calibrate_locality.py end to end on CPU (tiny model): every point is written as it
is measured, and the fit needs both of Fig. 9e's published budgets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import calibrate_locality as cl  # noqa: E402

ARGS = ["--model", "tiny", "--device", "cpu", "--context", "120", "--requests", "2", "--steps",
        "2", "--warmup", "1", "--pool-gib", "0.05", "--host-gib", "0.1"]  # fmt: skip


def test_fit_over_both_published_budgets(tmp_path, monkeypatch):
    out = tmp_path / "loc.json"
    monkeypatch.setattr(sys, "argv", ["x", *ARGS, "--lams", "0,0.5", "--budgets", "1,8",
                                      "--out", str(out)])  # fmt: skip
    cl.main()
    d = json.loads(out.read_text())
    assert len(d["points"]) == 4 and d["model"] == "tiny"
    assert d["fitted_lambda"] in (0.0, 0.5) and d["fit_error_log2"] >= 0


def test_without_both_budgets_there_is_no_fit(tmp_path, monkeypatch):
    out = tmp_path / "loc.json"
    monkeypatch.setattr(sys, "argv", ["x", *ARGS, "--lams", "0.5", "--budgets", "2",
                                      "--out", str(out)])  # fmt: skip
    cl.main()
    d = json.loads(out.read_text())
    assert len(d["points"]) == 1 and d["fitted_lambda"] is None
