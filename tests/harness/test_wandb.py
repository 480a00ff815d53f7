"""W&B logging end to end on CPU: what a run logs (live rows, summary, table, tags), offline by
default, and W&B failures that never cost a measurement."""

import json

import pytest

import harness.wandb_logger as wl
from harness.run import run
from systems.engine.config import compose

# a load step, so that the summary has phases and the live rows span the run
BASE = [
    "experiment=default_cpu",
    "server.mode=inprocess",
    "workload.warmup=0",
    "workload.schedule='2:1.5,3:1.5'",
    "workload.output_len=5",
    "logger=wandb",
]


class RecordingRun:
    """Stands in for a wandb run: keeps what the logger gives it."""

    def __init__(self, kw):
        self.kw = kw
        self.rows = []
        self.summary = {}
        self.finished = False

    def log(self, row):
        self.rows.append(row)

    def finish(self):
        self.finished = True


def record_wandb(monkeypatch) -> list[RecordingRun]:
    import wandb

    runs = []

    def init(**kw):
        runs.append(RecordingRun(kw))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", init)
    return runs


def fake_run(tmp_path, monkeypatch, system="resident") -> RecordingRun:
    """One small serving run through harness.run and the real logger, into a recording wandb."""
    runs = record_wandb(monkeypatch)
    run(compose(BASE + [f"results_dir={tmp_path}", f"system={system}"]))
    assert len(runs) == 1
    return runs[0]


def logged_keys(r: RecordingRun) -> set[str]:
    keys = set(r.summary)
    for row in r.rows:
        keys |= set(row)
    return keys


def test_a_run_logs_live_rows_a_table_a_flat_summary_and_tags(tmp_path, monkeypatch):
    wl._warned.clear()
    r = fake_run(tmp_path, monkeypatch, system="hisparse")
    kw = r.kw
    assert kw["mode"] == "offline" and kw["job_type"] == "serve" and kw["group"] == "default_cpu"
    assert {"system:hisparse", "model:tiny", "experiment:default_cpu", "load:step"} <= set(
        kw["tags"]
    )
    assert any(t.startswith("commit:") for t in kw["tags"]) and any(
        t.startswith("gpu:") for t in kw["tags"]
    )
    assert kw["config"]["hot_cache_rows"] == 16 and kw["config"]["system"]["name"] == "hisparse"
    live = [row for row in r.rows if wl.STEP in row]
    assert len(live) >= 2, "one row per scrape while the load runs"
    assert all(row[wl.STEP] >= 0 for row in live)
    assert any(k.startswith("server/") for k in live[0]) and "load/in_flight" in live[0]
    assert live[-1]["load/completed"] > live[0]["load/completed"] or live[0]["load/completed"] > 0
    tables = [row[wl.TABLE] for row in r.rows if wl.TABLE in row]
    assert len(tables) == 1 and list(tables[0].columns) == list(wl.TABLE_COLUMNS)
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert len(tables[0].data) == summary["completed"] + summary["errors"]
    assert r.summary["summary/output_tok_s"] == summary["output_tok_s"]
    assert r.summary["summary/phases/1/concurrency"] == 3  # nested values, flattened
    assert not any(k.startswith("summary/config") for k in r.summary)
    assert r.finished


def test_flatten_keeps_order_and_drops_non_finite():
    assert wl.flatten({"a": {"b": 1.0, "c": [{"d": 2}, {"d": float("nan")}]}}) == {
        "a/b": 1.0,
        "a/c/0/d": 2,
        "a/c/1/d": None,
    }


def test_offline_by_default_writes_an_offline_run(tmp_path, monkeypatch, capsys):
    wl._warned.clear()
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run(compose(BASE + [f"results_dir={tmp_path}"]))
    (offline,) = list(tmp_path.rglob("offline-run-*"))
    # the console says where (each run's directory) and how to upload, once
    err = capsys.readouterr().err
    assert err.count("upload with: wandb sync") == 1
    assert f"({offline.parent.parent}/wandb/...)" in err


@pytest.mark.parametrize("trouble", ["no_key", "unreachable"])
def test_online_trouble_warns_once_and_falls_back_offline(tmp_path, monkeypatch, capsys, trouble):
    """WANDB_MODE=online without an API key, or with a host that refuses connections: the
    measurement finishes (summary.json, no error.txt), one warning, an offline run instead."""
    wl._warned.clear()
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc key
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    if trouble == "unreachable":
        monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
        monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run(
        compose(
            BASE + [f"results_dir={tmp_path}", "workload.schedule='2:1'", "logger.init_timeout_s=2"]
        )
    )
    assert len(list(tmp_path.rglob("summary.json"))) == 1
    assert not list(tmp_path.rglob("error.txt"))
    err = capsys.readouterr().err
    # one warning about the trouble, one line on where the offline runs go
    assert err.count("run failed (") == 1 and "logging offline" in err
    assert err.count("upload with: wandb sync") == 1
    assert list(tmp_path.rglob("offline-run-*"))
    # the next run of this process goes offline at once, with no second warning
    run(
        compose(
            BASE + [f"results_dir={tmp_path}", "workload.schedule='3:1'", "logger.init_timeout_s=2"]
        )
    )
    assert "[harness] W&B:" not in capsys.readouterr().err
    assert len(list(tmp_path.rglob("summary.json"))) == 2


def test_a_failure_while_logging_never_costs_the_measurement(tmp_path, monkeypatch, capsys):
    wl._warned.clear()
    runs = record_wandb(monkeypatch)

    def broken(row):
        raise ConnectionError("quota exceeded")

    monkeypatch.setattr(RecordingRun, "log", lambda self, row: broken(row))
    run(compose(BASE + [f"results_dir={tmp_path}", "workload.schedule='2:1'"]))
    assert len(list(tmp_path.rglob("summary.json"))) == 1 and not list(tmp_path.rglob("error.txt"))
    assert "quota exceeded" in capsys.readouterr().err
    assert all(r.finished for r in runs)


def test_a_live_failure_finishes_its_run_after_the_load_not_during_it(tmp_path, monkeypatch):
    """A failed live log happens on the load generator's event loop: the failed run is finished
    (an online finish uploads: seconds) only once the load has ended, with the rest offline."""
    wl._warned.clear()
    monkeypatch.delenv("WANDB_MODE", raising=False)
    runs = record_wandb(monkeypatch)
    logger = wl.WandbLogger({"mode": "offline"})
    r = logger.start_run("rid", "group", {}, [], str(tmp_path))

    def broken(row):
        raise ConnectionError("network gone")

    monkeypatch.setattr(runs[0], "log", broken)
    r.sample({"ts": 1.0, "values": {}}, {"sent": 1})
    assert not runs[0].finished  # not on the load's loop
    r.finish({"completed": 1}, [], [{"ts": 1.0, "values": {}}])
    assert runs[0].finished and len(runs) == 2 and runs[1].finished  # the rest went offline
