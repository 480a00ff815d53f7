"""What a result was measured on: GPU, versions, commit. Stored beside every run."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """HEAD (with -dirty when tracked files changed). DHS_GIT_COMMIT overrides it: the GPU
    machine receives a copy of the tree without history."""
    if os.environ.get("DHS_GIT_COMMIT"):
        return os.environ["DHS_GIT_COMMIT"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return (sha or "unknown") + ("-dirty" if dirty.strip() else "")
    except Exception:
        return "unknown"


def cpu_model() -> str | None:
    """The host CPU's model name and core count (the bundled engine's Python thread runs on it,
    so serving output moves with it: runs on two GPU machines differ by up to 40% at one config)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    except OSError:
        return None
    if not names:  # e.g. aarch64 lists no model name: the machine type at least
        return platform.machine() or None
    return f"{names[0]} x {len(names)}"


def environment() -> dict:
    import torch

    env = {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "git_commit": git_commit(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        # which runs were measured together (benchmarks/gpu_batch.sh sets one id per batch): runs
        # that share it ran on one machine, which is what a ratio between systems must hold fixed
        "run_group": os.environ.get("DHS_RUN_GROUP") or None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env
