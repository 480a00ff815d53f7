"""Memory per session (Table 1 style) and pool occupancy over time (Fig. 6 counters).

``memory_table(report, sessions)`` splits a backend's ``memory_report()`` (eq. 3: required /
optional / reserve / capacity bytes plus named components) into rows per component, with where
the bytes live (GPU required, GPU optional, host) and the share per session.

``MemorySampler`` records, each time it is called (per step, rate-limited to ``interval_s``, or
once a second from a sampler thread), the timestamp, required / optional / reserve / free bytes,
the number of sessions and every component.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

GiB = float(1 << 30)

GPU_REQUIRED = "gpu_required"
GPU_OPTIONAL = "gpu_optional"
HOST = "host"


def component_location(name: str) -> str:
    """Where a memory_report component lives: host_* on the host, optional_* in optional GPU
    pages, everything else in required GPU memory."""
    n = name.lower()
    if n.startswith("host"):
        return HOST
    if n.startswith("optional"):
        return GPU_OPTIONAL
    return GPU_REQUIRED


def _get(rep: Any, key: str, default: Any = 0) -> Any:
    if isinstance(rep, Mapping):
        return rep.get(key, default)
    return getattr(rep, key, default)


def report_dict(rep: Any) -> dict:
    """A MemoryReport (or a dict with the same keys) as a flat dict of bytes."""
    cap = int(_get(rep, "capacity"))
    req = int(_get(rep, "required"))
    opt = int(_get(rep, "optional", 0) or 0)
    res = int(_get(rep, "reserve", 0) or 0)
    comps = dict(_get(rep, "components", {}) or {})
    return {
        "capacity": cap,
        "required": req,
        "optional": opt,
        "reserve": res,
        "free": cap - req - opt - res,
        "components": {k: int(v) for k, v in comps.items()},
    }


def memory_table(rep: Any, sessions: int) -> list[dict]:
    """Rows per component: bytes in total and per session (GiB too), and where they live.
    The last rows are the totals per location (``component == 'total:<location>'``)."""
    r = report_dict(rep)
    n = max(int(sessions), 0)
    rows, tot = [], {GPU_REQUIRED: 0, GPU_OPTIONAL: 0, HOST: 0}
    for name, b in sorted(r["components"].items()):
        loc = component_location(name)
        tot[loc] += b
        rows.append(_row(name, loc, b, n))
    for loc, b in tot.items():
        rows.append(_row(f"total:{loc}", loc, b, n))
    return rows


def _row(name: str, loc: str, b: int, n: int) -> dict:
    per = b / n if n else None
    return {
        "component": name,
        "location": loc,
        "bytes": b,
        "sessions": n,
        "bytes_per_session": per,
        "gib_per_session": per / GiB if per is not None else None,
    }


def per_session(rep: Any, sessions: int) -> dict:
    """Required GPU memory and host backup per session, in bytes and GiB (Table 1's columns)."""
    r = report_dict(rep)
    n = max(int(sessions), 0)
    host = sum(v for k, v in r["components"].items() if component_location(k) == HOST)
    out = {
        "sessions": n,
        "required_bytes": r["required"],
        "optional_bytes": r["optional"],
        "host_backup_bytes": host,
    }
    for k in ("required", "optional", "host_backup"):
        v = out[f"{k}_bytes"]
        out[f"{k}_bytes_per_session"] = v / n if n else None
        out[f"{k}_gib_per_session"] = v / n / GiB if n else None
    return out


def _report_of(source: Any) -> Callable[[], Any]:
    if hasattr(source, "memory_report"):
        return source.memory_report
    if hasattr(source, "backend") and hasattr(source.backend, "memory_report"):
        return source.backend.memory_report
    if callable(source):
        return source
    raise TypeError(
        "memory source must be an engine, a backend or a callable returning a MemoryReport"
    )


def _sessions_of(source: Any) -> Callable[[], int] | None:
    be = getattr(source, "backend", source)
    if hasattr(be, "active_slots"):
        return lambda: len(be.active_slots)
    return None


class MemorySampler:
    """Pool occupancy over time. ``sample()`` reads the source now; ``step()`` reads it only
    when ``interval_s`` has passed (cheap enough per engine step: memory_report is host-side
    bookkeeping, no device sync)."""

    name = "memory"

    def __init__(
        self, source: Any = None, *, interval_s: float = 1.0, clock: Callable[[], float] = time.time
    ):
        self._report = _report_of(source) if source is not None else None
        self._sessions = _sessions_of(source) if source is not None else None
        self.interval_s = float(interval_s)
        self.clock = clock
        self.rows: list[dict] = []
        self._last = None

    def record(self, rep: Any, *, sessions: int | None = None, ts: float | None = None) -> dict:
        r = report_dict(rep)
        row = {
            "ts": self.clock() if ts is None else ts,
            "sessions": sessions,
            **{k: r[k] for k in ("capacity", "required", "optional", "reserve", "free")},
        }
        for k, v in r["components"].items():
            row[f"component:{k}"] = v
        self.rows.append(row)
        self._last = row["ts"]
        return row

    def sample(self) -> dict | None:
        if self._report is None:
            return None
        n = self._sessions() if self._sessions else None
        return self.record(self._report(), sessions=n)

    def step(self, sessions: int | None = None) -> None:
        if self._last is None or self.clock() - self._last >= self.interval_s:
            self.sample()

    def save(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        if self.rows:
            keys: list[str] = []
            for r in self.rows:
                keys += [k for k in r if k not in keys]
            p = out / "memory_timeline.csv"
            with open(p, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(self.rows)
            paths.append(p)
            # per session at the sample with the most sessions (the latest of those): the last
            # sample is taken after the load drained, with no session left to divide by
            last = max(reversed(self.rows), key=lambda r: r.get("sessions") or 0)
            comps = {k.split(":", 1)[1]: v for k, v in last.items() if k.startswith("component:")}
            rep = {
                **{k: last[k] for k in ("capacity", "required", "optional", "reserve")},
                "components": comps,
            }
            n = last.get("sessions") or 0
            p2 = out / "memory_per_session.json"
            with open(p2, "w") as f:
                json.dump(
                    {
                        "at_ts": last["ts"],
                        "per_session": per_session(rep, n),
                        "table": memory_table(rep, n),
                        "peak_required": max(r["required"] for r in self.rows),
                        "peak_sessions": max((r["sessions"] or 0) for r in self.rows),
                    },
                    f,
                    indent=1,
                )
            paths.append(p2)
        return paths


def occupancy(rows: Sequence[Mapping]) -> dict:
    """Means and peaks of a sampled timeline (fractions of capacity)."""
    if not rows:
        return {}
    cap = max(float(r["capacity"]) for r in rows) or 1.0
    n = len(rows)
    return {
        "samples": n,
        "required_mean": sum(r["required"] for r in rows) / n / cap,
        "required_peak": max(r["required"] for r in rows) / cap,
        "optional_mean": sum(r["optional"] for r in rows) / n / cap,
        "free_min": min(r["free"] for r in rows) / cap,
    }
