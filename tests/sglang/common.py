"""Helpers shared by the SGLang tests (importable in both environments: stdlib + hydra)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.sglang_launch import compose

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
FAKE_SGLANG = Path(__file__).with_name("fake_sglang.py")
MODEL_PATH = "/models/target"  # never opened: argument lists are parsed, not launched
DRAFT_PATH = "/models/draft"


def conf_names(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))


def sglang_cfg(*overrides: str):
    """Our composed config with server=sglang and the paths SGLang needs."""
    return compose(
        [
            "server=sglang",
            f"server.sglang.model_path={MODEL_PATH}",
            f"server.sglang.speculative.draft_model_path={DRAFT_PATH}",
            *overrides,
        ]
    )


def repo_env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        **extra,
    )
