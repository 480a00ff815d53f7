"""profile=host: the sampled window over the server's threads, and the synchronizing CUDA calls
in it."""

from __future__ import annotations

import json
import sys
import threading
import time
import warnings

import pytest
import torch

from profiling.collectors import maybe_profile
from profiling.host import SYNC_WARNING, HostProfile


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _engine_work() -> None:
    _spin(0.01)


def _loop_work(stop: threading.Event) -> None:
    while not stop.is_set():
        _spin(0.002)
        time.sleep(0.002)  # lets the engine thread run (and the sampler)


def test_window_samples_each_thread_apart(tmp_path, monkeypatch):
    import systems.engine.server as server_mod

    monkeypatch.setattr(server_mod, "SERVING_LOOP", "uvloop")  # a server in this process
    stop = threading.Event()
    other = threading.Thread(target=_loop_work, args=(stop,), name="event-loop")
    other.start()
    try:
        cfg = {"name": "host", "wait": 2, "active": 20, "top": 50, "interval_ms": 0.5}
        with maybe_profile({**cfg, "syncs": False}, out_dir=tmp_path) as prof:
            assert isinstance(prof, HostProfile)
            for _ in range(25):
                _engine_work()
                prof.step(sessions=4)
    finally:
        stop.set()
        other.join()
    out = json.loads((tmp_path / "host" / "host_profile.json").read_text())
    assert out["steps"] == 20 and out["after_steps"] == 2 and out["mean_running"] == 4
    assert out["event_loop"] == "uvloop" and out["engine_process"] is False
    assert out["wall_ms_per_step"] >= 10 and out["engine_cpu_ms_per_step"] > 0
    threads = {t["thread"]: t for t in out["threads"]}
    assert out["threads"][0]["thread"] == "engine" and "event-loop" in threads

    def cum(thread: str, fn: str) -> float:
        rows = threads[thread]["by_cumulative_time"]
        return sum(r["share"] for r in rows if r["function"].endswith(f":{fn}"))

    # each thread's samples are its own: no thread's function turns up in the other's stacks
    assert cum("engine", "_engine_work") > 0.5 and cum("engine", "_loop_work") == 0
    assert cum("event-loop", "_loop_work") > 0.9 and cum("event-loop", "_engine_work") == 0
    own = threads["engine"]["by_own_time"][0]
    assert own["function"].split("@")[0].endswith(":_spin") and own["ms_per_step"] > 5
    folded = (tmp_path / "host" / threads["engine"]["folded"]).read_text().splitlines()
    assert any(";" in line and line.rsplit(" ", 1)[1].isdigit() for line in folded)
    assert out["syncs_watched"] is False and out["syncs"] == []


def test_an_engine_process_records_the_server_processs_loop(monkeypatch):
    """In an engine process (server.engine_process) MainThread receives the server's messages;
    the profile names the loop the server's process served on and says it ran elsewhere."""
    import systems.engine.engine_process as ep
    from profiling.host import _serving_loop

    assert _serving_loop()["engine_process"] is False
    monkeypatch.setattr(ep, "SERVER_LOOP", "uvloop")
    assert _serving_loop() == {"event_loop": "uvloop", "engine_process": True}


def _half_busy(stop: threading.Event) -> None:
    while not stop.is_set():
        _spin(0.01)
        time.sleep(0.01)


def test_a_thread_busy_half_its_time_reads_about_half(tmp_path):
    """Samples stand for the time since the previous one, and the window's switch interval
    lets the sampler in while a thread runs Python: counted alike at Python's 5 ms interval, a
    thread spinning half its time read ~12 % busy."""
    stop = threading.Event()
    busy = threading.Thread(target=_half_busy, args=(stop,), name="half-busy")
    busy.start()
    before = sys.getswitchinterval()
    try:
        prof = HostProfile(tmp_path, wait=0, active=40, top=20, syncs=False, switch_interval_ms=0.2)
        assert sys.getswitchinterval() == pytest.approx(0.0002)
        for _ in range(40):
            time.sleep(0.01)  # the "engine" waits; the other thread is the one measured
            prof.step()
    finally:
        stop.set()
        busy.join()
    assert sys.getswitchinterval() == pytest.approx(before)
    out = json.loads((tmp_path / "host_profile.json").read_text())
    t = next(t for t in out["threads"] if t["thread"] == "half-busy")
    spin = sum(r["share"] for r in t["by_own_time"] if ":_spin@" in r["function"])
    assert 0.3 < spin < 0.7, spin
    assert out["switch_interval_ms"] == pytest.approx(0.2)


def test_run_ending_inside_the_window_reports_its_steps(tmp_path):
    with maybe_profile({"name": "host", "wait": 1, "active": 100}, out_dir=tmp_path) as prof:
        for _ in range(4):
            _engine_work()
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
