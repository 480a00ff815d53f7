"""The asyncio event loop a server or client runs on: uvloop where installed (extra ``fast``),
else asyncio's own. Light on imports: the load generator uses it too."""

from __future__ import annotations

import asyncio
from typing import Any

CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> Any:
    """Event-loop factory for ``choice`` ("auto" | "uvloop" | "asyncio") for
    ``asyncio.Runner(loop_factory=...)``; None = asyncio's default. "auto" is uvloop when it is
    importable. The code that runs on the loop is the same on either."""
    if choice not in CHOICES:
        raise ValueError(f"event_loop must be 'auto', 'uvloop' or 'asyncio', got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError(
                "event_loop='uvloop' but uvloop is not installed (pip install -e '.[fast]')"
            ) from None
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"`` (the top-level package of the loop's class)."""
    return type(loop).__module__.split(".")[0]
