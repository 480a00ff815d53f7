"""Shared fixtures of the SGLang tests.

Four test files live here:
- test_server_args.py runs in the SGLang environment (.venv-sglang, built by
  scripts/sglang_env.sh) and parses our argument lists with SGLang's own parsers; in the main
  environment it is skipped (sglang is not importable there);
- test_adapter.py and test_launch.py run in the main environment and need no sglang: the
  bundled server stands in for an SGLang endpoint;
- test_bench_serving.py runs in the main environment and calls SGLang's bench_serving from
  .venv-sglang against the bundled server; skipped when .venv-sglang is absent.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.servers import free_port, stop_process, wait_healthy
from tests.sglang.common import REPO, repo_env


@pytest.fixture(scope="module")
def bundled_server(tmp_path_factory):
    """Our engine's server (model=tiny, CPU) in a subprocess: the stand-in SGLang endpoint."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("bundled") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "systems.engine.server",
                "--port",
                str(port),
                "model=tiny",
                "device=cpu",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=repo_env(),
            cwd=str(REPO),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 60, proc, log_path, "bundled server")
        yield url
    finally:
        stop_process(proc)
