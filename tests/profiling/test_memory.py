"""Memory per session and the occupancy sampler, on hand-made reports and a real backend."""

from __future__ import annotations

import json

import pytest

from profiling import memory as M
from systems.kv.base import MemoryReport


def rep():
    return MemoryReport(
        capacity=1000,
        required=300,
        optional=200,
        reserve=50,
        components={
            "index": 100,
            "hot_cache_and_tail": 200,
            "optional_history": 200,
            "host_backup": 4000,
        },
    )


def test_component_locations():
    assert M.component_location("host_backup") == M.HOST
    assert M.component_location("optional_history") == M.GPU_OPTIONAL
    assert M.component_location("index") == M.GPU_REQUIRED
    assert M.component_location("history_pages") == M.GPU_REQUIRED


def test_memory_table_and_per_session():
    rows = {r["component"]: r for r in M.memory_table(rep(), sessions=4)}
    assert rows["index"]["bytes_per_session"] == 25
    assert rows["total:gpu_required"]["bytes"] == 300  # = report.required
    assert rows["total:gpu_optional"]["bytes"] == 200
    assert rows["total:host"]["bytes_per_session"] == 1000
    ps = M.per_session(rep(), 4)
    assert ps["required_bytes_per_session"] == 75
    assert ps["host_backup_bytes_per_session"] == 1000
    assert ps["required_gib_per_session"] == pytest.approx(75 / 2**30)
    assert M.per_session(rep(), 0)["required_bytes_per_session"] is None
    assert M.report_dict(rep())["free"] == 1000 - 300 - 200 - 50


def test_sampler_rate_limit_and_save(tmp_path):
    t = [0.0]
    reports = iter([rep() for _ in range(10)])
    s = M.MemorySampler(lambda: next(reports), interval_s=1.0, clock=lambda: t[0])
    for _ in range(5):
        s.step()
        t[0] += 0.4
    assert [r["ts"] for r in s.rows] == [0.0, pytest.approx(1.2)]
    paths = s.save(tmp_path)
    assert (tmp_path / "memory_timeline.csv").exists()
    data = json.loads((tmp_path / "memory_per_session.json").read_text())
    assert data["peak_required"] == 300
    occ = M.occupancy(s.rows)
    assert occ["required_mean"] == pytest.approx(0.3) and occ["free_min"] == pytest.approx(0.45)
    assert len(paths) == 2


def test_sampler_on_a_real_engine():
    from tests.helpers import make_engine

    eng = make_engine("system=hisparse")
    s = M.MemorySampler(eng)
    row = s.sample()
    assert row["sessions"] == 0 and row["capacity"] > 0
    assert "component:host_backup" in row


def test_per_session_is_taken_where_the_sessions_are(tmp_path):
    """A run's last sample comes after its load drained (no session to divide by): the
    per-session file reads the sample with the most sessions."""
    s = M.MemorySampler(interval_s=0.0, clock=lambda: 0.0)
    for ts, n in ((0.0, 0), (1.0, 4), (2.0, 4), (3.0, 0)):
        s.record(rep(), sessions=n, ts=ts)
    s.save(tmp_path)
    data = json.loads((tmp_path / "memory_per_session.json").read_text())
    assert data["at_ts"] == 2.0  # the latest of the busiest samples
    assert data["per_session"]["required_bytes_per_session"] == 75  # 300 / 4
