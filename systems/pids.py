"""Files a process names after its pid (a launch config, a half-written cache file): whether
their writer still runs, and removing those of writers that died before cleaning up."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


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
