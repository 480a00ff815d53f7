"""Resolver kernels under Nsight Compute, through nsight-python (optional extra ``nsight``).

    python -m profiling.nsight --preset fig8a --runs 3 --out results/nsight/<run>
    python -m profiling.nsight --preset smoke --events      # CUDA-event timing, no ncu needed

Each ``ResolverCase`` builds one synthetic resolver call (R requests, Q queries of k selections,
a hot cache of B rows filled with known positions, a number of distinct host misses per query,
selections resolved directly through the ready-page map) and profiles exactly one launch of
``_resolver_kernel`` per run; the cache state is restored before every run, outside the
annotated region. Reported per case: kernel duration (``gpu__time_duration.sum``), any other
ncu metrics asked for, the host payload the call copied (from the kernel's own counters) and
the achieved host-read throughput = payload / duration (the paper's Fig. 8a rate: 49.4 GB/s).

nsight-python attaches Nsight Compute when ``nsight`` is imported, which must happen before CUDA
is initialized: run this module in a fresh process (the CLI does), not after an engine ran.
Without nsight-python, ``ncu`` or a GPU, ``profile_resolver`` prints why and returns None.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed")
DURATION_METRIC = "gpu__time_duration.sum"


@dataclass
class ResolverCase:
    """One resolver call. Per query: ``misses`` distinct rows from host, ``direct`` selections
    resolved through the ready-page map, the remaining k - misses - direct hot-cache hits.
    ``disjoint``: each query selects its own rows (unique misses = Q * misses), else all queries
    select the same rows (unique misses = misses)."""

    name: str = ""
    batch: int = 8  # R
    queries: int = 1  # Q
    k: int = 512
    hot_rows: int = 1024  # B
    misses: int = 0
    direct: int = 0
    disjoint: bool = False
    row_bytes: int = 656
    history: int = 0  # positions per request; 0 = enough for the case
    page_size: int = 64
    seed: int = 0

    def label(self) -> str:
        return self.name or (
            f"R{self.batch}-Q{self.queries}-k{self.k}-B{self.hot_rows}-"
            f"m{self.misses}-d{self.direct}{'-disj' if self.disjoint else ''}"
        )


PRESETS: dict[str, list[ResolverCase]] = {
    "smoke": [ResolverCase(batch=4, k=64, hot_rows=128, misses=m) for m in (0, 16)],
    # Fig. 8a (scaled k): time against unique host-miss payload, verification width 8, batch 32
    "fig8a": [
        ResolverCase(batch=32, queries=8, k=512, hot_rows=1024, misses=m, disjoint=d)
        for m, d in (
            (0, False),
            (8, False),
            (64, False),
            (256, False),
            (512, False),
            (64, True),
            (256, True),
            (512, True),
        )
    ],
    # Fig. 8b: the scan grows with B, no miss; the direct path skips it
    "fig8b": [
        ResolverCase(batch=b, k=128, hot_rows=B, misses=0, direct=dr)
        for b in (8, 160)
        for B in (512, 2048)
        for dr in (0,)
    ]
    + [ResolverCase(batch=b, k=128, hot_rows=2048, direct=128) for b in (8, 160)],
    # Fig. 8c: misses add in proportion to the batch
    "fig8c": [
        ResolverCase(batch=b, k=128, hot_rows=2048, misses=m) for b in (8, 160) for m in (0, 77)
    ],
}


# nsight-python 1.x attaches to the running process and needs Nsight Compute >= 2026.2.1
MIN_NCU_FOR_NSIGHT_1 = (2026, 2, 1)


def ncu_version(ncu: str | None = None) -> tuple[int, ...] | None:
    import re
    import subprocess

    ncu = ncu or shutil.which("ncu")
    if ncu is None:
        return None
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except Exception:
        return None
    m = re.search(r"Version\s+(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else None


def nsight_available() -> tuple[bool, str]:
    """Whether nsight-python, a usable ncu and a GPU are all here (imports nothing that
    attaches Nsight Compute)."""
    if importlib.util.find_spec("nsight") is None:
        return False, (
            "nsight-python is not installed (pip install 'nsight-python' or the "
            "project extra '.[nsight]')"
        )
    if shutil.which("ncu") is None:
        return False, "Nsight Compute CLI `ncu` is not on PATH"
    try:
        from importlib.metadata import version

        major = int(version("nsight-python").split(".")[0])
    except Exception:
        major = 1
    ver = ncu_version()
    if major >= 1 and ver is not None and ver < MIN_NCU_FOR_NSIGHT_1:
        return False, (
            f"nsight-python {major}.x needs Nsight Compute >= "
            f"{'.'.join(map(str, MIN_NCU_FOR_NSIGHT_1))}, found ncu "
            f"{'.'.join(map(str, ver))} (use --events timing, or ncu directly)"
        )
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA device"
    except Exception as e:  # pragma: no cover
        return False, f"torch unavailable: {e}"
    return True, ""


# ------------------------------------------------------------------ building one call
@dataclass
class ResolverCall:
    case: ResolverCase
    args: dict
    pristine: tuple  # (hot_pos, hot_lru) to restore before every run
    host_bytes: int = 0
    unique_misses: int = 0
    counters: list = field(default_factory=list)

    def reset(self) -> None:
        self.args["hot_pos"].copy_(self.pristine[0])
        self.args["hot_lru"].copy_(self.pristine[1])

    def __call__(self, impl: str = "triton", check: bool = False):
        from systems.kernels import resolver as rz

        a = self.args
        pos = (
            a["selections"],
            a["tail_start"],
            a["tail_loc"],
            a["hot_pos"],
            a["hot_lru"],
            a["hot_loc_base"],
            a["host_page_table"],
            a["kv_pool"],
            a["host_pool"],
            a["stamp"],
        )
        kw = dict(
            page_size=a["page_size"],
            direct_page_table=a["direct_page_table"],
            staging_loc_base=a["staging_loc_base"],
            out=a["out"],
        )
        if impl == "triton":
            return rz.resolve_triton(*pos, workspace=a["workspace"], check=check, **kw)
        return rz.resolve_reference(*pos, **kw)


def build_call(case: ResolverCase, device: Any = "cuda") -> ResolverCall:
    """Tensors of one resolver call (pinned host pool on CUDA)."""
    import torch

    from systems.kernels.resolver import ResolverWorkspace

    dev = torch.device(device)
    R, Q, k, B, m, dr = (case.batch, case.queries, case.k, case.hot_rows, case.misses, case.direct)
    h = k - m - dr
    if h < 0:
        raise ValueError(f"{case.label()}: misses + direct = {m + dr} exceed k = {k}")
    if h > B:
        raise ValueError(f"{case.label()}: {h} hits per query do not fit B = {B}")
    ps = case.page_size
    uniq_m = m * (Q if case.disjoint else 1)
    uniq_d = dr * (Q if case.disjoint else 1)
    # positions: [0, B) in the hot cache, then the host-only misses, then whole pages that are
    # ready on the device (direct map); the tail is empty (tail_start = L)
    miss_lo = B
    direct_lo = _ceil_to(miss_lo + uniq_m, ps)
    dpages = -(-uniq_d // ps)
    L = max(case.history, direct_lo + dpages * ps, ps)
    P = -(-L // ps)
    T = 16
    QK = Q * k
    # device rows per request: hot slots | tail | staging (Q*k) | pad | direct pages
    direct_off = _ceil_to(B + T + QK, ps)
    per_req = direct_off + dpages * ps  # a multiple of ps: every request starts on a page
    g = torch.Generator().manual_seed(case.seed)

    sel = torch.empty(R, Q, k, dtype=torch.int32)
    for r in range(R):
        hot_perm = torch.randperm(B, generator=g)
        for q in range(Q):
            off = q if case.disjoint else 0
            hits = torch.roll(hot_perm, -off * h)[:h]
            misses = torch.arange(miss_lo + off * m, miss_lo + (off + 1) * m)
            direct = torch.arange(direct_lo + off * dr, direct_lo + (off + 1) * dr)
            row = torch.cat([hits, misses, direct]).to(torch.int32)
            sel[r, q] = row[torch.randperm(k, generator=g)]
    base = torch.arange(R, dtype=torch.int64) * per_req
    hot_pos = torch.arange(B, dtype=torch.int32).repeat(R, 1)
    hot_lru = torch.arange(1, B + 1, dtype=torch.int64).repeat(R, 1)
    host_pt = (torch.arange(R).unsqueeze(1) * P + torch.arange(P)).to(torch.int32)
    dpt = torch.full((R, P), -1, dtype=torch.int32)
    if dpages:
        first = direct_lo // ps
        for r in range(R):
            page0 = (int(base[r]) + direct_off) // ps
            dpt[r, first : first + dpages] = torch.arange(page0, page0 + dpages, dtype=torch.int32)
    pin = dev.type == "cuda"
    host_pool = torch.randint(0, 256, (R * P * ps, case.row_bytes), dtype=torch.uint8, generator=g)
    if pin:
        host_pool = host_pool.pin_memory()
    kv_pool = torch.zeros(R * per_req, case.row_bytes, dtype=torch.uint8, device=dev)
    args = {
        "selections": sel.to(dev),
        "tail_start": torch.full((R,), L, dtype=torch.int32, device=dev),
        "tail_loc": (base.unsqueeze(1) + B + torch.arange(T)).to(torch.int32).to(dev),
        "hot_pos": hot_pos.to(dev),
        "hot_lru": hot_lru.to(dev),
        "hot_loc_base": base.to(torch.int32).to(dev),
        "host_page_table": host_pt.to(dev),
        "kv_pool": kv_pool,
        "host_pool": host_pool,
        "stamp": B + 10,
        "page_size": ps,
        "direct_page_table": dpt.to(dev) if dpages else None,
        "staging_loc_base": (base + B + T).to(torch.int32).to(dev),
        "workspace": ResolverWorkspace(dev),
        "out": (
            torch.empty(R, Q, k, dtype=torch.int32, device=dev),
            torch.empty(R, 4, dtype=torch.int64, device=dev),
            torch.empty(R, dtype=torch.int32, device=dev),
        ),
    }
    call = ResolverCall(case, args, (args["hot_pos"].clone(), args["hot_lru"].clone()))
    call.unique_misses = uniq_m
    return call


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def warm(call: ResolverCall, impl: str = "triton") -> ResolverCall:
    """One checked call (compiles the kernel, validates arguments), then read its counters:
    the host payload every later run of the same case moves."""
    from systems.kernels.resolver import COUNTER_HOST_COPIES

    call.reset()
    res = call(impl=impl, check=True) if impl == "triton" else call(impl=impl)
    c = res.counters.sum(0).tolist()
    call.counters = c
    call.host_bytes = int(c[COUNTER_HOST_COPIES]) * call.case.row_bytes
    call.reset()
    return call


# ------------------------------------------------------------------ profiling
def _case_row(call: ResolverCall) -> dict:
    return {
        "case": call.case.label(),
        **{f"case_{k}": v for k, v in asdict(call.case).items()},
        "unique_misses_per_request": call.unique_misses,
        "host_bytes": call.host_bytes,
    }


def profile_resolver(
    cases: Sequence[ResolverCase],
    *,
    metrics: Sequence[str] = DEFAULT_METRICS,
    runs: int = 3,
    out_dir: str | Path | None = None,
    quiet: bool = False,
) -> Any:
    """Profile each case's resolver launch under ncu; a pandas DataFrame with one row per
    case (duration, metrics, host bytes, achieved GB/s), or None (with a message) when
    nsight-python, ncu or a GPU is missing."""
    ok, why = nsight_available()
    if not ok:
        print(f"[profiling.nsight] skipped: {why}", file=sys.stderr)
        return None
    import torch

    if torch.cuda.is_initialized() and not quiet:
        print(
            "[profiling.nsight] warning: CUDA was initialized before nsight was imported; "
            "ncu may fail to attach (run `python -m profiling.nsight` in a fresh process)",
            file=sys.stderr,
        )
    try:
        import nsight
    except Exception as e:
        print(f"[profiling.nsight] skipped: importing nsight failed: {e}", file=sys.stderr)
        return None
    import pandas as pd

    metrics = list(metrics)
    if DURATION_METRIC not in metrics:
        metrics.insert(0, DURATION_METRIC)
    calls = [warm(build_call(c, "cuda")) for c in cases]
    torch.cuda.synchronize()
    kw = {}
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        kw["output_prefix"] = str(Path(out_dir) / "nsight_")

    @nsight.analyze.kernel(
        configs=list(range(len(calls))),
        runs=int(runs),
        metrics=metrics,
        combine_kernel_metrics=lambda a, b: a + b,
        **kw,
    )
    def resolver_call(case_index):
        c = calls[case_index]
        c.reset()
        with nsight.annotate("resolver"):
            c()

    try:
        df = resolver_call().to_dataframe()
    except Exception as e:  # ncu could not attach / read counters: say so, do not crash
        print(
            f"[profiling.nsight] Nsight Compute profiling failed: {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return None
    rows = []
    for i, call in enumerate(calls):
        row = _case_row(call)
        sub = df[df["case_index"] == i] if "case_index" in df.columns else df.iloc[0:0]
        for _, r in sub.iterrows():
            row[str(r["Metric"])] = float(r["AvgValue"])
            if str(r["Metric"]) == DURATION_METRIC:
                row["duration_std_ns"] = float(r.get("StdDev", float("nan")))
                row["kernel"] = r.get("Kernel")
        _derive(row)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out_dir is not None:
        out.to_csv(Path(out_dir) / "nsight_resolver.csv", index=False)
    return out


def _derive(row: dict) -> None:
    t = row.get(DURATION_METRIC)
    row["duration_ms"] = t / 1e6 if t else None
    row["achieved_host_GBps"] = row["host_bytes"] / t if t else None  # bytes/ns = GB/s


def time_resolver_events(
    cases: Sequence[ResolverCase], *, runs: int = 20, out_dir: str | Path | None = None
) -> Any:
    """Fallback without ncu: CUDA-event timing of the same calls (median of ``runs``)."""
    import statistics

    import pandas as pd
    import torch

    if not torch.cuda.is_available():
        print("[profiling.nsight] skipped: no CUDA device", file=sys.stderr)
        return None
    rows = []
    for case in cases:
        call = warm(build_call(case, "cuda"))
        ts = []
        for _ in range(int(runs)):
            call.reset()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e6)  # ns
        row = _case_row(call)
        row[DURATION_METRIC] = statistics.median(ts)
        row["duration_std_ns"] = statistics.pstdev(ts)
        row["timing"] = "cuda_events"
        _derive(row)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        out.to_csv(Path(out_dir) / "resolver_events.csv", index=False)
    return out


def cases_from_cfg(cfg: Any) -> list[ResolverCase]:
    """``cases``: a preset name or a list of ResolverCase fields (conf/profile/nsight.yaml)."""
    spec = cfg.get("cases", "smoke") if hasattr(cfg, "get") else getattr(cfg, "cases", "smoke")
    if isinstance(spec, str):
        return list(PRESETS[spec])
    out = []
    for c in spec:
        c = dict(c.items()) if hasattr(c, "items") else dict(c)
        out.append(ResolverCase(**c))
    return out


class NsightResolverProfiler:
    """What ``maybe_profile`` yields for ``profile=nsight``: ``run()`` profiles the configured
    cases once (``finalize`` calls it when it has not run)."""

    name = "nsight"

    def __init__(self, cfg: Any, out_dir: Path):
        self.cfg = cfg
        self.out_dir = out_dir
        self.result = None
        self._ran = False

    def step(self, sessions: int | None = None) -> None:
        pass

    def sample(self) -> None:
        pass

    def run(self):
        self._ran = True
        get = self.cfg.get if hasattr(self.cfg, "get") else (lambda k, d=None: d)
        self.result = profile_resolver(
            cases_from_cfg(self.cfg),
            metrics=list(get("metrics", DEFAULT_METRICS) or DEFAULT_METRICS),
            runs=int(get("runs", 3) or 3),
            out_dir=self.out_dir,
        )
        return self.result

    def finalize(self) -> None:
        if not self._ran:
            self.run()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="smoke", choices=sorted(PRESETS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    ap.add_argument("--out", default="outputs/profile/nsight")
    ap.add_argument(
        "--events",
        action="store_true",
        help="time with CUDA events instead of ncu (no nsight-python needed)",
    )
    args = ap.parse_args(argv)
    repo = Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    cases = PRESETS[args.preset]
    if args.events:
        df = time_resolver_events(cases, runs=max(args.runs, 5), out_dir=args.out)
    else:
        ok, why = nsight_available()
        if ok:
            import nsight  # noqa: F401  -- attach ncu before anything initializes CUDA
        df = profile_resolver(
            cases,
            metrics=[m for m in args.metrics.split(",") if m],
            runs=args.runs,
            out_dir=args.out,
        )
    if df is None:
        return 0
    cols = [c for c in ("case", "host_bytes", "duration_ms", "achieved_host_GBps") if c in df]
    print(df[cols].to_string(index=False))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "cases.json", "w") as f:
        json.dump([asdict(c) for c in cases], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
