"""One entry for every collector: ``maybe_profile(cfg.profile)``.

    from profiling.collectors import maybe_profile

    with maybe_profile(cfg.profile, out_dir=run_dir, source=engine) as prof:
        while running:
            did_work = engine.step()
            if prof and did_work:
                prof.step(sessions=len(engine.scheduler.running))

``cfg.name`` picks the collector (conf/profile/<name>.yaml):

    none     yields None (no cost at all)
    kernels  torch.profiler kernel families per step          -> <out>/kernels/
    memory   memory_report() per session and over time        -> <out>/memory/
    census   retrieval counters per token / request / step    -> <out>/census/
    nsight   resolver kernels under Nsight Compute            -> <out>/nsight/
    host     the server's threads sampled, the CUDA syncs  -> <out>/host/

Enter it in the engine thread: torch.profiler records ranges and CPU ops of the entering thread
only. Every yielded collector has ``step(sessions=None)`` (once per engine step that decoded; those that
sample over time rate-limit themselves to ``interval_s``), ``sample()`` (read now) and is
finalized (outputs written) when the block exits, also on error. ``source`` is the engine (or a
backend) the memory and census collectors read; ``out_dir`` overrides ``cfg.output_dir``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from profiling.kernel_timeline import _opt, maybe_profile_kernels

NAMES = ("none", "kernels", "nsight", "memory", "census", "host")


def _out(cfg: Any, out_dir: Any) -> Path:
    return Path(out_dir or _opt(cfg, "output_dir", "outputs/profile"))


@contextlib.contextmanager
def maybe_profile(
    cfg: Any, *, out_dir: str | Path | None = None, source: Any = None
) -> Iterator[Any]:
    name = str(_opt(cfg, "name", "none")) if cfg is not None else "none"
    if name not in NAMES:
        raise ValueError(f"profile.name must be one of {NAMES}, got {name!r}")
    if name == "none":
        yield None
        return
    if name == "kernels":
        with maybe_profile_kernels(cfg, out_dir=_out(cfg, out_dir)) as prof:
            yield prof
        return
    if name == "memory":
        from profiling.memory import MemorySampler

        col = MemorySampler(source, interval_s=float(_opt(cfg, "interval_s", 1.0)))
        col.sample()
        try:
            yield col
        finally:
            col.sample()
            col.save(_out(cfg, out_dir) / "memory")
        return
    if name == "host":
        from profiling.host import HostProfile

        col = HostProfile(
            _out(cfg, out_dir) / "host",
            wait=int(_opt(cfg, "wait", 100)),
            active=int(_opt(cfg, "active", 300)),
            top=int(_opt(cfg, "top", 40)),
            syncs=bool(_opt(cfg, "syncs", True)),
            interval_ms=float(_opt(cfg, "interval_ms", 1.0)),
            switch_interval_ms=(
                None
                if _opt(cfg, "switch_interval_ms") is None
                else float(cfg["switch_interval_ms"])
            ),
        )
        try:
            yield col
        finally:
            col.finish()
        return
    if name == "census":
        from profiling.census import CensusCollector, retrieval_geometry

        geom = None
        model_cfg = getattr(getattr(source, "cfg", None), "model", None)
        hot = getattr(getattr(source, "backend", None), "B", None)  # resolved B; None: no cache
        if model_cfg is not None and hasattr(model_cfg, "layers") and hot:
            geom = retrieval_geometry(model_cfg, hot)
        col = CensusCollector(source, geometry=geom, interval_s=float(_opt(cfg, "interval_s", 1.0)))
        col.start()
        try:
            yield col
        finally:
            col.sample()
            _save_census(col, _out(cfg, out_dir) / "census")
        return
    # nsight
    from profiling.nsight import NsightResolverProfiler, nsight_available

    ok, why = nsight_available()
    if not ok:
        print(f"[profiling] profile=nsight skipped: {why}", file=sys.stderr)
        yield None
        return
    col = NsightResolverProfiler(cfg, _out(cfg, out_dir) / "nsight")
    try:
        yield col
    finally:
        if bool(_opt(cfg, "run_on_exit", True)):
            col.finalize()


def _save_census(col: Any, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res = col.result()
    payload = {
        "census": res.as_dict() if res is not None else None,
        "geometry": col.geometry.as_dict() if col.geometry is not None else None,
        "samples": len(col.samples),
    }
    with open(out / "census.json", "w") as f:
        json.dump(payload, f, indent=1)
    series = col.series()
    if series:
        from profiling.kernel_timeline import write_rows_csv

        write_rows_csv(series, out / "census_series.csv")
