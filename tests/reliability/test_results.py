"""Results are never lost or half-written: per-request records survive a killed load generator,
summaries are replaced atomically, an interrupted sweep resumes without redoing finished runs,
and a run whose server dies keeps its records and says why in error.txt."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import run as run_mod
from harness.records import atomic_write_json, load_records, read_jsonl
from systems.engine.config import compose
from systems.engine.engine import Engine
from tests.helpers import make_engine
from tests.reliability.support import ThreadedServer, assert_drained, wait_idle_sync

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_git(monkeypatch):
    # the runner records the commit; asking git would touch the index of a repo others use
    monkeypatch.setenv("DHS_GIT_COMMIT", "reliability-test")


# ---------------------------------------------------------------- records survive a kill -9
def test_records_survive_killing_the_load_generator(tmp_path):
    out = tmp_path / "records.jsonl"
    eng = make_engine("hardware.kv_pool_gib=0.01")
    with ThreadedServer(eng) as srv:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.loadgen",
                "--url",
                srv.url,
                "--concurrency",
                "4",
                "--num-requests",
                "100000",
                "--input-len",
                "23",
                "--output-len",
                "6",
                "--prefixes",
                "2",
                "--vocab-size",
                "512",
                "--out",
                str(out),
                "--metrics-interval",
                "0",
                "--quiet",
                "--disable-progress",
            ],
            env=env,
            cwd=str(REPO),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if out.exists() and sum(1 for _ in open(out, "rb")) >= 25:
                    break
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.05)
            else:
                raise AssertionError("the load generator wrote no records")
            os.kill(proc.pid, signal.SIGKILL)  # no chance to flush or close anything
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raw = out.read_bytes()
        lines = raw.split(b"\n")
        complete = lines[:-1]  # the last element is b"" or a partial line being written
        assert len(complete) >= 25
        for ln in complete:
            json.loads(ln)  # every complete line is a whole record
        recs = load_records(out)
        assert len(recs) >= len(complete)
        assert all(r.success and r.completion_tokens == 6 and len(r.chunks) == 6 for r in recs)
        assert len({r.rid for r in recs}) == len(recs)
        # the requests the killed client left in flight are aborted and freed server-side
        wait_idle_sync(eng, timeout=60)
        assert_drained(eng)


def test_reader_skips_a_torn_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"rid": "a", "index": 0}\n{"rid": "b", "index": 1}\n{"rid": "c", "ind')
    assert [d["rid"] for d in read_jsonl(p)] == ["a", "b"]


# ---------------------------------------------------------------- atomic summaries
class _Boom:
    def tolist(self):
        raise RuntimeError("serializer exploded mid-write")


@pytest.mark.parametrize("fault", ["serialize", "fsync", "replace"])
def test_failed_summary_write_leaves_the_old_file_intact(tmp_path, monkeypatch, fault):
    path = tmp_path / "summary.json"
    atomic_write_json(path, {"run": 1, "ok": True})
    before = path.read_bytes()
    obj = {"run": 2, "values": list(range(10_000))}
    if fault == "serialize":
        obj["late"] = _Boom()  # fails after most of the document was written to the temp file
    elif fault == "fsync":
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk gone")))
    else:
        monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("nope")))
    with pytest.raises((RuntimeError, OSError)):
        atomic_write_json(path, obj)
    assert path.read_bytes() == before
    assert json.loads(before) == {"run": 1, "ok": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp left


# ---------------------------------------------------------------- resumable sweeps
def _cfg(tmp_path, *extra):
    return compose(
        [
            "device=cpu",
            "server.mode=inprocess",
            "experiment_name=rel",
            f"results_dir={tmp_path}",
            "workload.concurrency=[1,2]",
            "workload.num_requests=3",
            "workload.input_len=8",
            "workload.output_len=3",
            "workload.warmup=0",
            "workload.prefixes=1",
            "hardware.kv_pool_gib=0.01",
            *extra,
        ]
    )


def _snapshot(d: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.iterdir())}


def test_interrupted_sweep_resumes_and_redoes_only_the_unfinished_run(tmp_path, capsys):
    dirs = run_mod.run(_cfg(tmp_path))
    assert len(dirs) == 2 and all((d / "summary.json").exists() for d in dirs)
    kept, redo = dirs
    assert json.loads((kept / "summary.json").read_text())["completed"] == 3
    kept_before = _snapshot(kept)
    (redo / "summary.json").unlink()  # as if the sweep died before this run finished
    old_records = (redo / "records.jsonl").read_bytes()
    capsys.readouterr()

    dirs2 = run_mod.run(_cfg(tmp_path))
    out = capsys.readouterr().out
    assert dirs2 == dirs
    assert f"{kept.name}: finished earlier, skipping" in out
    assert f"{redo.name}: done" in out and f"{kept.name}: done" not in out
    assert _snapshot(kept) == kept_before  # untouched, byte for byte and mtime
    assert json.loads((redo / "summary.json").read_text())["completed"] == 3
    aside = [p for p in redo.parent.iterdir() if p.name.startswith(redo.name + ".failed-")]
    assert len(aside) == 1  # the unfinished attempt was moved aside, not overwritten
    assert (aside[0] / "records.jsonl").read_bytes() == old_records
    assert not (aside[0] / "summary.json").exists()

    capsys.readouterr()
    assert run_mod.run(_cfg(tmp_path)) == dirs  # everything finished: nothing runs
    assert "done" not in capsys.readouterr().out.replace("finished earlier", "")


def test_a_run_whose_every_request_failed_is_not_finished(tmp_path, monkeypatch):
    """A server that refuses every request measured nothing: no summary (a resume redoes the
    run), the records and error.txt say why; one failed request among many only warns."""

    def refuse(self, req):
        raise ValueError("refused for this test")

    monkeypatch.setattr(Engine, "submit", refuse)
    cfg = _cfg(tmp_path, "workload.concurrency=[2]")
    with pytest.raises(run_mod.RunFailed, match="all 3 requests failed, first: .*refused"):
        run_mod.run(cfg)
    (d,) = [p for p in (tmp_path / "rel").iterdir() if not p.name.startswith(".")]
    assert not (d / "summary.json").exists()
    assert (d / "error.txt").read_text().startswith("run failed: RunFailed:")
    assert len(load_records(d / "records.jsonl")) == 3


@pytest.mark.parametrize(
    "override, message",
    [
        ("workload.input_len=0", "workload.input_len must be >= 1"),
        ("workload.num_requests=0", "workload.num_requests and workload.min_waves must be >= 1"),
        ("workload.temperature=-1", "workload.temperature must be >= 0"),
        ("device=tpu", "expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_a_bad_value_fails_before_any_server_starts(tmp_path, monkeypatch, override, message):
    import harness.servers

    def no_server(*a, **k):
        raise AssertionError("a server started for a config that cannot run")

    monkeypatch.setattr(run_mod, "bundled_server", no_server)
    monkeypatch.setattr(harness.servers, "bundled_server", no_server)
    with pytest.raises(run_mod.ConfigError, match=message):
        run_mod.run(_cfg(tmp_path, override))
    assert not (tmp_path / "rel").exists()


def test_the_command_line_says_a_config_error_in_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "harness.run", "workload.output_len=0", f"results_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "error: workload.output_len must be >= 1, got 0"
    assert "Traceback" not in r.stderr


def test_ctrl_c_ends_the_command_line_in_one_line_and_keeps_the_unfinished_run(tmp_path):
    argv = [sys.executable, "-m", "harness.run", "workload.num_requests=100000"]
    argv += ["workload.concurrency=[2]", f"results_dir={tmp_path}", "experiment_name=rel"]
    p = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    records = None
    for _ in range(600):  # until the load is under way
        time.sleep(0.1)
        records = next(tmp_path.glob("rel/*/records.jsonl"), None)
        if records is not None and records.stat().st_size > 0:
            break
    os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
    try:
        _, err = p.communicate(timeout=120)
    finally:  # a Ctrl-C that went unanswered must not leave a load running under later tests
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "[harness] interrupted: finished runs are kept"
    )
    d = records.parent
    assert not (d / "summary.json").exists() and (d / "error.txt").exists()


class SimulatedCrash(BaseException):
    """Not an Exception: the engine's per-request isolation does not catch it, its thread dies."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_that_dies_mid_run_leaves_records_and_error_txt(tmp_path, monkeypatch):
    calls = {"n": 0}

    def dying(orig):  # the step of either mode (synchronous or overlapped) dies
        def step(self, *args):
            calls["n"] += 1
            if calls["n"] > 12:  # a few requests complete first
                raise SimulatedCrash("simulated engine crash")
            return orig(self, *args)

        return step

    originals = {name: getattr(Engine, name) for name in ("_decode", "_overlapped_step")}
    for name, orig in originals.items():
        monkeypatch.setattr(Engine, name, dying(orig))
    cfg = _cfg(tmp_path, "workload.concurrency=[2]", "workload.num_requests=12")
    with pytest.raises(run_mod.ServerFailed, match="server failed during the run"):
        run_mod.run(cfg)
    (d,) = [p for p in (tmp_path / "rel").iterdir() if not p.name.startswith(".")]
    assert not (d / "summary.json").exists()  # not marked finished: a resume redoes it
    err = (d / "error.txt").read_text()
    assert err.startswith("run failed: ServerFailed:")
    first = err.splitlines()[0]
    assert "engine" in first and "simulated engine crash" in first  # /health says why
    recs = load_records(d / "records.jsonl")
    assert len(recs) == 12  # every request is on record, finished or failed
    ok = [r for r in recs if r.success]
    bad = [r for r in recs if not r.success]
    assert ok and bad
    assert all("engine stopped" in r.error or "HTTP 503" in r.error for r in bad), {
        r.error for r in bad
    }
    assert (d / "config.yaml").exists() and (d / "env.json").exists()

    for name, orig in originals.items():  # the server is fixed: the resume redoes it
        monkeypatch.setattr(Engine, name, orig)
    (d2,) = run_mod.run(cfg)
    assert d2 == d and (d / "summary.json").exists() and not (d / "error.txt").exists()
    aside = [p for p in d.parent.iterdir() if p.name.startswith(d.name + ".failed-")]
    assert len(aside) == 1 and (aside[0] / "error.txt").exists()


def test_an_interrupted_run_says_so_in_error_txt(tmp_path, monkeypatch):
    import harness.loadgen as lg

    def interrupted(cfg, observer=None):
        Path(cfg.out).write_text('{"rid": "x", "index": 0, "success": true}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(lg, "run_load_sync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_mod.run(_cfg(tmp_path, "workload.concurrency=[1]"))
    (d,) = [p for p in (tmp_path / "rel").iterdir() if not p.name.startswith(".")]
    assert (d / "error.txt").read_text().startswith("run failed: interrupted")
    assert (d / "records.jsonl").exists() and not (d / "summary.json").exists()
