"""Shared by the kernel tests: compile-mode checks run in a process without TRITON_INTERPRET."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def triton_has_nvidia_backend() -> bool:
    try:
        import triton.backends.nvidia  # noqa: F401

        return True
    except Exception:
        return False


needs_nvidia_backend = pytest.mark.skipif(
    not triton_has_nvidia_backend(), reason="triton without the NVIDIA backend"
)


def run_compiled(code: str, timeout: int = 300) -> None:
    """Run ``code`` (which prints ``ok``) where Triton compiles for real: the interpreter
    accepts things the compiler rejects, and ptxas ships with triton, so no GPU is needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


def interpreted(kernel) -> pytest.MarkDecorator:
    """Skip unless ``kernel`` runs under Triton's interpreter in this process (the CPU tests
    need TRITON_INTERPRET=1 set before triton's first import; tests/conftest.py sets it)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction

        ok = isinstance(kernel, InterpretedFunction)
    except Exception:
        ok = False
    return pytest.mark.skipif(
        not ok, reason="triton imported without TRITON_INTERPRET=1 in this process"
    )
