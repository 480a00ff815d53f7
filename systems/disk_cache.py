"""On-disk caches of tensors a server start would otherwise compute again: a model's random
weights (``DHS_WEIGHT_CACHE``) and the prefilled KV of shared prompts (``DHS_PREFIX_CACHE``).

Why: every run of an interleaved protocol starts its own server. Drawing glm53_h200's 4.7 B
random parameters takes ~30 s, most of a GPU server's start-up; a DeepSeek-like run prefills 16
prepared prompts of 125,000 tokens before it measures. With a cache directory set, the first
start saves what it computed there and later starts of the same inputs load it (memory-mapped,
seconds). A file is named by a digest of everything its contents depend on, the code included,
so a change to either computes anew. Off unless the variable is set (a preset's weights take
~10 GB of disk). Failing to read or write a cache never fails a start: it logs and computes.
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

log = logging.getLogger("dhs.disk_cache")
WEIGHTS_ENV = "DHS_WEIGHT_CACHE"
FREE_MARGIN_BYTES = 8 * 10**9  # disk a saved cache file leaves free
PREFIX_ENV = "DHS_PREFIX_CACHE"


def cache_path(key: str, env: str, kind: str) -> Path | None:
    """The file for ``key`` (any string that fixes the contents) in the directory ``$env``,
    or None when that cache is off."""
    root = os.environ.get(env)
    if not root:
        return None
    return Path(root) / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt"


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


def load_or_compute(
    key: str, compute: Callable[[], dict], device: torch.device, *, env: str, kind: str
) -> tuple[dict, bool]:
    """(``compute()``'s result, whether it came from the cache). The result is a dict of
    tensors, numbers, and lists and dicts of them, on ``device``; with the cache on, a computed
    result is saved."""
    path = cache_path(key, env, kind)
    if path is not None and path.exists():
        try:
            return _to(torch.load(path, mmap=True, weights_only=True), device), True
        except Exception as e:  # a truncated or foreign file: compute instead
            log.warning("%s cache %s unreadable (%r): computing it", kind, path, e)
    state = compute()
    if path is not None:
        save(state, path, kind)
    return state, False


def load_or_draw(key: str, draw: Callable[[], dict], device: torch.device) -> dict:
    """A model's drawn weights, from ``DHS_WEIGHT_CACHE`` when it holds ``key``'s."""
    return load_or_compute(key, draw, device, env=WEIGHTS_ENV, kind="weights")[0]


def _remove_stale(root: Path, kind: str) -> None:
    """Temporaries of writers that died mid-save (a killed server leaves ~10 GB behind)."""
    remove_files_of_dead_pids(root.glob(f"{kind}-*.tmp*"), lambda f: f.suffix.removeprefix(".tmp"))


def save(state: dict, path: Path, kind: str) -> None:
    size = _nbytes(state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path.parent, kind)
        if any(path.parent.glob(f"{path.stem}.tmp*")):  # another process is writing it
            log.info("%s cache: %s is being written by another process: not saved", kind, path)
            return
        free = shutil.disk_usage(path.parent).free
        # the file, and room for the runs' results and logs beside it (a run's are megabytes);
        # twice the file would refuse dsv41_h200's 30 GB weights on the GPU machine's 64 GiB disk,
        # and every server start would draw them again (minutes)
        if free < size + FREE_MARGIN_BYTES:
            log.warning(
                "%s cache: %.1f GB free at %s, the file takes %.1f GB: not saved",
                kind,
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
        log.info("%s cache: saved %.1f GB to %s", kind, size / 1e9, path)
    except Exception as e:
        log.warning("%s cache: not saved to %s (%r)", kind, path, e)
