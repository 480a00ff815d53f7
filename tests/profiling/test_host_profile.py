"""profile=host: the engine thread's cProfile window and the synchronizing CUDA calls in it."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from profiling.collectors import maybe_profile
from profiling.host import SYNC_WARNING, HostProfile


def _work(n: int = 2000) -> int:
    return sum(i * i for i in range(n))


def test_window_profiles_only_its_steps(tmp_path):
    cfg = {"name": "host", "wait": 2, "active": 3, "top": 50, "syncs": False}
    with maybe_profile(cfg, out_dir=tmp_path) as prof:
        assert isinstance(prof, HostProfile)
        for i in range(8):
            _work()
            if i == 3:  # inside the window (steps 3-5 are profiled: after the 2nd, until the 5th)
                _work()
            prof.step(sessions=4)
    out = json.loads((tmp_path / "host" / "host_profile.json").read_text())
    assert out["steps"] == 3 and out["after_steps"] == 2 and out["mean_running"] == 4
    row = next(r for r in out["by_cumulative_time"] if r["function"].endswith(":_work"))
    assert row["calls_per_step"] == pytest.approx(4 / 3)  # 3 window steps + the extra call
    assert out["wall_ms_per_step"] > 0 and out["thread_cpu_ms_per_step"] > 0
    assert (tmp_path / "host" / "host_profile.prof").stat().st_size > 0
    assert out["syncs_watched"] is False and out["syncs"] == []


def test_run_ending_inside_the_window_reports_its_steps(tmp_path):
    with maybe_profile({"name": "host", "wait": 1, "active": 100}, out_dir=tmp_path) as prof:
        for _ in range(4):
            _work()
            prof.step()
    out = json.loads((tmp_path / "host" / "host_profile.json").read_text())
    assert out["steps"] == 3


def test_run_ending_before_the_window_writes_nothing(tmp_path):
    with maybe_profile({"name": "host", "wait": 10, "active": 5}, out_dir=tmp_path) as prof:
        prof.step()
    assert not (tmp_path / "host").exists()


def test_bad_window_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="active >= 1"):
        HostProfile(tmp_path, wait=0, active=0, top=5, syncs=False)


def _syncing_call() -> None:
    warnings.warn(f"{SYNC_WARNING}.", UserWarning, stacklevel=2)  # as torch's "warn" mode does


def test_sync_sites_are_counted_and_the_watch_undone(tmp_path, monkeypatch):
    """On a GPU the window turns on torch's sync debug mode and counts each warning's call
    site; the mode, warnings' display hook and filters are restored when it closes."""
    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(now=m))
    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: others.append(message))
    shown_before, filters_before = warnings.showwarning, list(warnings.filters)
    prof = HostProfile(tmp_path, wait=0, active=2, top=10, syncs=True)
    assert mode["now"] == "warn"
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("something else", UserWarning, stacklevel=1)  # still shown as before
    assert [str(m) for m in others] == ["something else"]
    for _ in range(2):
        for _ in range(2):
            _syncing_call()  # one call site, met four times
        prof.step()
    assert mode["now"] == 0
    assert warnings.showwarning is shown_before and warnings.filters == filters_before
    out = json.loads((tmp_path / "host_profile.json").read_text())
    assert out["syncs_per_step"] == 2
    (site,) = out["syncs"]
    assert site["count"] == 4 and site["stack"][-1].endswith(":_syncing_call")
    assert not any("warnings.py" in fr for fr in site["stack"])
