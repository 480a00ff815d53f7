"""Files a process names after its pid (a launch config, a half-written cache file): whether
their writer still runs, and removing those of writers that died before cleaning up."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("dhs.pids")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_files_of_dead_pids(files: Iterable[Path], pid_of: Callable[[Path], str]) -> list[Path]:
    """Delete each file whose ``pid_of(file)`` names a process that is gone (never this one's,
    nor a live one's: another lane's). Returns the files removed."""
    removed = []
    for f in files:
        pid = pid_of(f)
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            f.unlink(missing_ok=True)
            removed.append(f)
    return removed


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGTERM this process when the process that started it dies, even by SIGKILL
    (PR_SET_PDEATHSIG: the signal follows the parent *thread* that started it, so start
    children from a thread that lives as long as the process); a parent already gone means
    exit now. Elsewhere a no-op."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return
    if os.getppid() != parent_pid:  # it died before the prctl
        sys.exit(f"parent {parent_pid} is gone")
