"""An on-disk cache of a model's random weights, so that a server start does not draw them again.

The weights come from one seeded CPU generator (the same on every device), drawn in sequence:
about 30 s for glm53_h200's 4.7 B parameters, most of a GPU server's start-up, paid again by every
run of an interleaved protocol. With ``DHS_WEIGHT_CACHE`` set to a directory, the first build
saves the drawn weights there and later builds of the same weights load them (memory-mapped, a
few seconds). The file is named by a digest of everything the weights depend on, the drawing
code included, so a change to either draws anew. Off unless the variable is set: a preset's
weights take ~10 GB of disk. Failing to read or write the cache never fails a build; it logs
and draws.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from systems.pids import remove_files_of_dead_pids

log = logging.getLogger("dhs.weights")
ENV = "DHS_WEIGHT_CACHE"


def cache_path(key: str) -> Path | None:
    """The cache file for ``key`` (any string that fixes the weights), or None when off."""
    root = os.environ.get(ENV)
    if not root:
        return None
    return Path(root) / f"weights-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


def _nbytes(state) -> int:
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_nbytes(v) for v in state)
    return 0


def _to(state, device: torch.device):
    if torch.is_tensor(state):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _to(v, device) for k, v in state.items()}
    if isinstance(state, list):
        return [_to(v, device) for v in state]
    return state


def load_or_draw(key: str, draw: Callable[[], dict], device: torch.device) -> dict:
    """``draw()``'s result (a dict of tensors, lists and dicts of tensors, on ``device``),
    from the cache when it holds ``key``'s weights, else drawn and, with the cache on, saved."""
    path = cache_path(key)
    if path is not None and path.exists():
        try:
            return _to(torch.load(path, mmap=True, weights_only=True), device)
        except Exception as e:  # a truncated or foreign file: draw instead
            log.warning("weight cache %s unreadable (%r): drawing the weights", path, e)
    state = draw()
    if path is not None:
        _save(state, path)
    return state


def _remove_stale(root: Path) -> None:
    """Temporaries of writers that died mid-save (a killed server leaves ~10 GB behind)."""
    remove_files_of_dead_pids(root.glob("weights-*.tmp*"), lambda f: f.suffix.removeprefix(".tmp"))


def _save(state: dict, path: Path) -> None:
    size = _nbytes(state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path.parent)
        if any(path.parent.glob(f"{path.stem}.tmp*")):  # another process is writing them
            log.info("weight cache: %s is being written by another process: not saved", path)
            return
        free = shutil.disk_usage(path.parent).free
        if free < 2 * size:  # leave the disk to the runs' results
            log.warning(
                "weight cache: %.1f GB free at %s, the weights take %.1f GB: not saved",
                free / 1e9,
                path.parent,
                size / 1e9,
            )
            return
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            torch.save(_to(state, torch.device("cpu")), tmp)
            os.replace(tmp, path)  # readers see a whole file or none
        finally:
            tmp.unlink(missing_ok=True)
        log.info("weight cache: saved %.1f GB to %s", size / 1e9, path)
    except Exception as e:
        log.warning("weight cache: not saved to %s (%r)", path, e)
