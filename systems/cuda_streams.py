"""CUDA streams shared by role within a process.

Engines and KV backends built one after another in a process (a benchmark's rows, a check's
three engines per system) take their long-lived streams from here rather than making new ones:
torch hands out a priority's streams from a pool of 32, round robin, so a stream made per
object would after 32 of them come back as one another role is using (the prefetch stream as
the decode stream, serializing them), and memory the caching allocator holds for one engine's
stream stays reusable by the next engine of that role.
"""

from __future__ import annotations

import torch

_STREAMS: dict[tuple[str, int, int], torch.cuda.Stream] = {}


def current_priority(device: torch.device) -> int:
    """The priority of the calling thread's current stream on ``device``."""
    return getattr(torch.cuda.current_stream(device), "priority", 0)


def shared_stream(device: torch.device, role: str, priority: int | None = None):
    """The process's stream for ``role`` on ``device`` at ``priority`` (None: the current
    stream's), made on first use."""
    if priority is None:
        priority = current_priority(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (role, index, priority)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device, priority=priority)
    return _STREAMS[key]


def is_shared(stream, role: str) -> bool:
    """Whether ``stream`` is one this module made for ``role``."""
    return any(s == stream for (r, _, _), s in _STREAMS.items() if r == role)
