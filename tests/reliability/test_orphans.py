"""No orphans (issue 26, point 5): a runner killed with SIGKILL (nothing of it runs, so neither
exit_on_sigterm nor a ``finally``) takes its engine server with it, and the server its engine
process; the per-process launch config it left behind is removed by the next runner that starts
in that folder."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

from harness.servers import remove_stale_launch_configs
from tests.harness.test_sigterm import REPO, _alive, _children

# a runner: the bundled server in its own process, as harness.run starts it
SCRIPT = r"""
import sys, time
from pathlib import Path
from harness import servers
from systems.engine.config import compose
cfg = compose(["device=cpu", "server.mode=subprocess", "hardware.kv_pool_gib=0.01"])
with servers.bundled_server(cfg, Path(sys.argv[1])) as url:
    (pid,) = servers._LIVE
    print("SERVER", pid, url, flush=True)
    time.sleep(300)
"""


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_runner_takes_its_server_with_it_and_stale_files_go(tmp_path):
    stale = tmp_path / f"server_config-{_dead_pid()}.yaml"
    stale.write_text("{}\n")
    live = tmp_path / f"server_config-{os.getpid()}.yaml"  # a live runner's (the other lane)
    live.write_text("{}\n")
    runner = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    try:
        line = ""
        while not line.startswith("SERVER "):
            line = runner.stdout.readline()
            assert line, f"runner exited with {runner.wait()}"
        pid, url = int(line.split()[1]), line.split()[2]
        assert not stale.exists() and live.exists()
        assert (tmp_path / f"server_config-{runner.pid}.yaml").exists()
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        engine = _children(pid)  # the engine process (server.engine_process), its tracker
        assert engine
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(map(_alive, {pid, *engine})) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the server outlived its runner"
        assert not any(map(_alive, engine)), "the engine process outlived its server"
    finally:
        if runner.poll() is None:
            runner.kill()
    # the dead runner's launch config is stale now: the next start in the folder removes it
    assert remove_stale_launch_configs(tmp_path) == [tmp_path / f"server_config-{runner.pid}.yaml"]
    assert live.exists()
