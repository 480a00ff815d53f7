"""Start / attach / stop logic of harness.sglang_launch, in the main environment.

The bundled server stands in for SGLang: attached to directly, or started through the launcher
by tests/sglang/fake_sglang.py, which accepts SGLang's and the router's command lines, records
them, and serves the bundled engine. The load is harness.loadgen, as in a real run.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import open_dict

from harness import sglang_launch as launch
from harness.sglang_launch import free_port, sglang_server
from tests.sglang.common import FAKE_SGLANG, REPO, repo_env, sglang_cfg


def _closed(url: str) -> bool:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) != 0


def run_loadgen(
    url: str, out: Path, n: int = 8, conc: int = 4, input_len: int = 16, output_len: int = 4
) -> dict:
    """harness.loadgen as its own process, as the runner's load is."""
    summary = out / "summary.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.loadgen",
            "--url",
            url,
            "--api",
            "generate",
            "--concurrency",
            str(conc),
            "--num-requests",
            str(n),
            "--input-len",
            str(input_len),
            "--output-len",
            str(output_len),
            "--vocab-size",
            "512",
            "--out",
            str(out / "records.jsonl"),
            "--summary-out",
            str(summary),
            "--metrics-interval",
            "0.2",
            "--disable-progress",
            "--quiet",
        ],
        check=True,
        env=repo_env(),
        cwd=str(REPO),
        timeout=120,
    )
    return json.loads(summary.read_text())


def _fake_cfg(tmp_path: Path, *overrides: str):
    """server=sglang with the launch commands pointed at the fake SGLang."""
    cfg = sglang_cfg("model=tiny", "server.startup_timeout_s=60", *overrides)
    fake = [sys.executable, str(FAKE_SGLANG)]
    record = tmp_path / "record"
    record.mkdir()
    with open_dict(cfg):
        cfg.server.sglang.command = fake
        cfg.server.sglang.router_command = fake
        cfg.server.sglang.env = {"PYTHONPATH": str(REPO), "FAKE_SGLANG_RECORD": str(record)}
    return cfg, record


def _recorded(record: Path, url: str) -> dict:
    return json.loads((record / f"{url.rsplit(':', 1)[1]}.json").read_text())


def test_attach_waits_for_health_and_runs_the_load(bundled_server, tmp_path):
    cfg = sglang_cfg(
        "system=hisparse",
        "server.sglang.launch=attach",
        f"server.url={bundled_server}/",
        f"server.sglang.attach_health_urls=[{bundled_server}]",
    )
    with sglang_server(cfg, tmp_path) as url:
        assert url == bundled_server
        s = run_loadgen(url, tmp_path)
    assert (s["completed"], s["errors"]) == (8, 0)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (8 * 16, 8 * 4)
    assert s["scrape_samples"] > 0  # /metrics answered, as SGLang's does with --enable-metrics
    assert not _closed(bundled_server)  # attach never stops what it did not start


def test_attach_refuses_unsupported_systems_and_dead_endpoints(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = sglang_cfg(
        "system=adaptive_hisparse", "server.sglang.launch=attach", f"server.url={dead}"
    )
    with pytest.raises(ValueError, match="no SGLang equivalent"):
        with sglang_server(cfg, tmp_path):
            pass
    cfg = sglang_cfg(
        "system=resident",
        "server.sglang.launch=attach",
        f"server.url={dead}",
        "server.startup_timeout_s=1",
    )
    with pytest.raises(TimeoutError, match="not healthy"):
        with sglang_server(cfg, tmp_path):
            pass
    with pytest.raises(ValueError, match="server.url is required"):
        with sglang_server(sglang_cfg("server.sglang.launch=attach"), tmp_path):
            pass


def test_launch_one_server_runs_the_load_and_stops_it(tmp_path):
    cfg, record = _fake_cfg(tmp_path, "system=hisparse", "server.sglang.gpus=[3]")
    with sglang_server(cfg, tmp_path / "work") as url:
        seen = _recorded(record, url)
        s = run_loadgen(url, tmp_path)
    assert (s["completed"], s["errors"]) == (8, 0)
    assert seen["cuda_visible_devices"] == "3"
    assert "--enable-hisparse" in seen["argv"] and "--model-path" in seen["argv"]
    assert _closed(url)
    assert (tmp_path / "work" / "sglang-server.log").exists()
    assert "sglang.launch_server" not in (tmp_path / "work" / "sglang-commands.sh").read_text()


def test_launch_pd_starts_prefill_decode_router_and_stops_all(tmp_path):
    cfg, record = _fake_cfg(
        tmp_path,
        "system=hisparse",
        "server.sglang.pd.enabled=true",
        "server.sglang.pd.prefill.gpus=[0]",
        "server.sglang.pd.decode.gpus=[1]",
        f"server.sglang.pd.bootstrap_port={free_port()}",
    )
    plan = launch.build_plan(cfg, pick_port=free_port)
    prefill, decode = plan.servers
    with launch.launch_plan(plan, tmp_path / "work", 60) as url:
        assert url == plan.url
        s = run_loadgen(url, tmp_path, n=4, conc=2)
        p, d, r = (_recorded(record, u) for u in (prefill.url, decode.url, url))
    assert s["completed"] == 4
    assert (p["cuda_visible_devices"], d["cuda_visible_devices"]) == ("0", "1")
    assert "--enable-hisparse" not in p["argv"] and "--enable-hisparse" in d["argv"]
    assert r["argv"][:4] == [
        "--pd-disaggregation",
        "--prefill",
        prefill.url,
        str(plan.router_args[3]),
    ]
    assert all(_closed(u) for u in (prefill.url, decode.url, url))
    assert {f.name for f in (tmp_path / "work").iterdir()} == {
        "sglang-prefill.log",
        "sglang-decode.log",
        "sglang-router.log",
    }


def test_a_server_that_dies_at_start_up_reports_its_log(tmp_path):
    cfg, _ = _fake_cfg(tmp_path, "system=resident", "server.sglang.extra_args=[--fake-exit,3]")
    with pytest.raises(RuntimeError, match="exited with code 3") as e:
        with sglang_server(cfg, tmp_path / "work"):
            pass
    assert "exiting with 3 as asked" in str(e.value)


def test_runner_drives_an_attached_endpoint(bundled_server, tmp_path):
    """harness.run end to end with server=sglang attached to a stand-in endpoint."""
    from harness.run import run

    cfg = sglang_cfg(
        "system=resident",
        "model=tiny",
        "device=cpu",
        "server.sglang.launch=attach",
        f"server.url={bundled_server}",
        f"results_dir={tmp_path}",
        "experiment_name=sglang_attach",
        "workload.concurrency=[2]",
        "workload.num_requests=4",
        "workload.input_len=16",
        "workload.output_len=4",
        "workload.warmup=0",
    )
    (run_dir,) = run(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["completed"], summary["errors"]) == (4, 0)
