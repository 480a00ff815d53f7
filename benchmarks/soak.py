"""Soak: sustained concurrency with mixed prompt / output lengths and random client aborts, run in
windows; between windows the load drains and the engine is inspected at rest.

Per window it records latency (TTFT, TPOT), throughput, aborts and errors, and at rest: pages in
use in every page pool (must be 0) and ``check_integrity``, process RSS, live Python objects after
a full collection, optionally tracemalloc's current size, CUDA memory allocated, and the engine's
request bookkeeping. The verdict compares the first measured window (after warm-up) with the last:

- ``leaked_pages``: 0 in every window, and ``check_integrity`` passes;
- ``rss_growth_mib`` / ``object_growth`` / ``cuda_growth_mib``: below their limits;
- ``tpot_ratio``: median TPOT of the last window over the first stays below a generous factor;
- ``server_errors``: no request failed other than by its client's own abort.

The engine and its HTTP server run in this process (the server on this event loop, the engine on
its own thread), so the pools can be inspected directly; requests go over real loopback HTTP.

    python -m benchmarks.soak --minutes 10 --concurrency 64 --prompt-lens 256,1024,4096 \\
        --max-new 16,256 system=adaptive_dhisparse model=glm53_mini hardware=h200

writes ``results/soak/<system>-<model>-<time>.json`` (``--out`` to choose) and exits 1 when a
check fails. ``tests/reliability/test_soak.py`` runs the same for about a minute on CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from harness.records import atomic_write_json  # noqa: E402
from systems.engine.server import build_app, start_server  # noqa: E402
from systems.kv.base import PagePool  # noqa: E402


@dataclass
class SoakConfig:
    overrides: list[str] = field(default_factory=list)  # Hydra overrides: system=, model=, ...
    duration_s: float = 300.0
    windows: int = 10
    warmup_windows: int = 1  # windows before the baseline (caches fill, allocators settle)
    concurrency: int = 16
    prompt_lens: list[int] = field(default_factory=lambda: [8, 40, 120, 300])
    max_new: tuple[int, int] = (4, 96)  # output cap drawn uniformly from this range
    distinct_prompts: int = 24  # more than the prefix cache holds: prefill + eviction too
    abort_prob: float = 0.25  # the client vanishes after a random number of tokens
    cancel_prob: float = 0.05  # the client vanishes before its first token
    seed: int = 0
    trace_malloc: bool = False  # tracemalloc on (slower; Python allocations only)
    drain_timeout_s: float = 120.0
    # limits of the verdict
    max_rss_growth_mib: float = 64.0
    max_object_growth: int = 20_000
    max_cuda_growth_mib: float = 16.0
    max_tpot_ratio: float = 3.0
    out: str | None = None


# ---------------------------------------------------------------- measurements at rest
def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except OSError:  # not Linux: peak RSS is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _pools(backend) -> dict[str, PagePool]:
    return {k: v for k, v in vars(backend).items() if isinstance(v, PagePool)}


def _at_rest(eng) -> dict:
    be = eng.backend
    snap: dict = {}
    try:
        be.check_integrity()
        snap["integrity"] = "ok"
    except AssertionError as e:
        snap["integrity"] = f"FAILED: {e}"
    snap["pages_used"] = {k: p.num_used for k, p in _pools(be).items()}
    snap["leaked_pages"] = sum(snap["pages_used"].values())
    snap["slots_held"] = len(be.active_slots)
    snap["optional_pages"] = getattr(be, "optional_pages", 0)
    snap["engine_requests"] = len(eng.requests)
    snap["engine_live_ids"] = len(eng._live)
    snap["prefix_entries"] = len(eng.prefixes._entries)
    gc.collect()
    snap["py_objects"] = len(gc.get_objects())
    snap["rss_mib"] = _rss_mib()
    snap["tracemalloc_mib"] = (
        tracemalloc.get_traced_memory()[0] / (1 << 20) if tracemalloc.is_tracing() else None
    )
    snap["cuda_allocated_mib"] = None
    if be.device.type == "cuda":
        import torch

        torch.cuda.synchronize(be.device)
        snap["cuda_allocated_mib"] = torch.cuda.memory_allocated(be.device) / (1 << 20)
    return snap


# ---------------------------------------------------------------- load
class _Load:
    def __init__(self, cfg: SoakConfig, vocab: int, context: int):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        lo, hi = cfg.max_new
        if not 1 <= lo <= hi:
            raise ValueError(f"max_new must be 1 <= lo <= hi, got {cfg.max_new}")
        bad = [n for n in cfg.prompt_lens if n + hi > context]
        if bad:
            raise ValueError(f"prompt lengths {bad} + max_new {hi} exceed the context {context}")
        g = random.Random(cfg.seed + 1)
        self.prompts = [
            [g.randrange(2, vocab) for _ in range(cfg.prompt_lens[i % len(cfg.prompt_lens)])]
            for i in range(cfg.distinct_prompts)
        ]

    def next(self) -> tuple[dict, int | None]:
        """A request body and, for a client that will vanish, after how many tokens."""
        c, r = self.cfg, self.rng
        n = r.randint(*c.max_new)
        body = {
            "input_ids": r.choice(self.prompts),
            "stream": True,
            "sampling_params": {
                "max_new_tokens": n,
                "ignore_eos": True,
                "temperature": r.choice((0.0, 0.7)),
            },
        }
        u = r.random()
        if u < c.cancel_prob:
            return body, 0
        if u < c.cancel_prob + c.abort_prob and n > 1:
            return body, r.randint(1, n - 1)
        return body, None


async def _one(s: aiohttp.ClientSession, body: dict, vanish_after: int | None) -> dict:
    rec = {
        "send": time.perf_counter(),
        "first": None,
        "last": None,
        "tokens": 0,
        "status": None,
        "error": None,
        "vanished": vanish_after is not None,
    }
    try:
        if vanish_after == 0:  # gone before any token
            t = asyncio.ensure_future(s.post("/generate", json=body))
            await asyncio.sleep(0.002)
            t.cancel()
            try:
                (await t).close()
            except asyncio.CancelledError:
                pass
            return rec
        async with s.post("/generate", json=body) as r:
            rec["status"] = r.status
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}: {(await r.text())[:200]}"
                return rec
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    break
                ev = json.loads(payload)
                if "error" in ev:
                    rec["error"] = ev["error"].get("message", "error event")
                    break
                now = time.perf_counter()
                rec["first"] = rec["first"] or now
                rec["last"] = now
                rec["tokens"] += len(ev["output_ids"])
                if vanish_after is not None and rec["tokens"] >= vanish_after:
                    r.close()  # drop the connection mid-stream
                    return rec
            if (
                vanish_after is None
                and rec["error"] is None
                and rec["tokens"] != body["sampling_params"]["max_new_tokens"]
            ):
                rec["error"] = f"short stream: {rec['tokens']} tokens"
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _window_stats(recs: list[dict], wall_s: float) -> dict:
    done = [r for r in recs if not r["vanished"] and r["error"] is None and r["first"]]
    tpot = [(r["last"] - r["first"]) / (r["tokens"] - 1) * 1e3 for r in done if r["tokens"] > 1]
    ttft = [(r["first"] - r["send"]) * 1e3 for r in done]
    return {
        "requests": len(recs),
        "completed": len(done),
        "vanished": sum(r["vanished"] for r in recs),
        "server_errors": sum(1 for r in recs if r["error"] is not None),
        "error_examples": sorted({r["error"] for r in recs if r["error"]})[:3],
        "tokens": sum(r["tokens"] for r in recs),
        "output_tok_s": sum(r["tokens"] for r in recs) / max(wall_s, 1e-9),
        "tpot_ms_median": statistics.median(tpot) if tpot else None,
        "tpot_ms_p90": _pct(tpot, 0.9),
        "ttft_ms_median": statistics.median(ttft) if ttft else None,
        "ttft_ms_p90": _pct(ttft, 0.9),
    }


# ---------------------------------------------------------------- the soak
def _verdict(cfg: SoakConfig, windows: list[dict], eng) -> dict:
    base = windows[min(cfg.warmup_windows, len(windows) - 1)]
    last = windows[-1]
    checks = {}

    def check(name, value, limit, ok):
        checks[name] = {"value": value, "limit": limit, "ok": bool(ok)}

    leaked = max(w["at_rest"]["leaked_pages"] for w in windows)
    check("leaked_pages", leaked, 0, leaked == 0)
    bad = [w["index"] for w in windows if w["at_rest"]["integrity"] != "ok"]
    check("integrity_failures", bad, [], not bad)
    held = max(
        w["at_rest"]["slots_held"]
        + w["at_rest"]["engine_requests"]
        + w["at_rest"]["engine_live_ids"]
        for w in windows
    )
    check("requests_left_at_rest", held, 0, held == 0)
    g = last["at_rest"]["rss_mib"] - base["at_rest"]["rss_mib"]
    check("rss_growth_mib", round(g, 2), cfg.max_rss_growth_mib, g <= cfg.max_rss_growth_mib)
    g = last["at_rest"]["py_objects"] - base["at_rest"]["py_objects"]
    check("object_growth", g, cfg.max_object_growth, g <= cfg.max_object_growth)
    if base["at_rest"]["cuda_allocated_mib"] is not None:
        g = last["at_rest"]["cuda_allocated_mib"] - base["at_rest"]["cuda_allocated_mib"]
        check("cuda_growth_mib", round(g, 2), cfg.max_cuda_growth_mib, g <= cfg.max_cuda_growth_mib)
    t0, t1 = base["load"]["tpot_ms_median"], last["load"]["tpot_ms_median"]
    ratio = (t1 / t0) if t0 and t1 else None
    check(
        "tpot_ratio", ratio, cfg.max_tpot_ratio, ratio is not None and ratio <= cfg.max_tpot_ratio
    )
    errs = sum(w["load"]["server_errors"] for w in windows)
    check("server_errors", errs, 0, errs == 0)
    check("engine_failed_requests", eng.stats["failed_total"], 0, eng.stats["failed_total"] == 0)
    return checks


async def run_soak(cfg: SoakConfig, engine=None, progress=print) -> dict:
    """Run the soak; returns the record (also written to ``cfg.out`` when set)."""
    from systems.engine.config import compose_engine_config
    from systems.engine.engine import Engine

    if cfg.windows < cfg.warmup_windows + 1:
        raise ValueError("windows must exceed warmup_windows")
    if cfg.trace_malloc:
        tracemalloc.start()
    eng = engine or Engine(compose_engine_config(list(cfg.overrides)))
    ecfg = eng.cfg
    load = _Load(cfg, ecfg.model.vocab_size, eng.backend.max_total_tokens)
    eng.start()
    serving = await start_server(build_app(eng))
    port = serving.port
    window_s = cfg.duration_s / cfg.windows
    windows: list[dict] = []
    t_start = time.time()
    try:
        async with aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{port}", connector=aiohttp.TCPConnector(limit=0)
        ) as s:
            for w in range(cfg.windows):
                recs: list[dict] = []
                t0 = time.perf_counter()
                deadline = t0 + window_s

                async def worker():
                    while time.perf_counter() < deadline:
                        recs.append(await _one(s, *load.next()))

                await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
                wall = time.perf_counter() - t0
                await eng.wait_idle_async(cfg.drain_timeout_s)
                win = {
                    "index": w,
                    "warmup": w < cfg.warmup_windows,
                    "wall_s": wall,
                    "load": _window_stats(recs, wall),
                    "at_rest": _at_rest(eng),
                }
                windows.append(win)
                ld, ar = win["load"], win["at_rest"]
                progress(
                    f"[soak] window {w}: {ld['requests']} req ({ld['vanished']} vanished, "
                    f"{ld['server_errors']} errors) {ld['output_tok_s']:.0f} tok/s "
                    f"TPOT {ld['tpot_ms_median'] or float('nan'):.2f} ms | leaked pages "
                    f"{ar['leaked_pages']} rss {ar['rss_mib']:.0f} MiB objects "
                    f"{ar['py_objects']}"
                )
    finally:
        await serving.close()
        if engine is None:
            eng.stop()
        if cfg.trace_malloc:
            tracemalloc.stop()
    checks = _verdict(cfg, windows, eng)
    record = {
        "kind": "soak",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "system": ecfg.kv.backend + ("+spec" if ecfg.speculation else ""),
        "model": ecfg.model.name,
        "device": ecfg.device,
        "config": dataclasses.asdict(cfg),
        "engine_stats": dict(eng.stats),
        "backend_metrics": eng.backend.metrics(),
        "windows": windows,
        "checks": checks,
        "passed": all(c["ok"] for c in checks.values()),
    }
    if cfg.out:
        from harness.environment import environment

        record["env"] = environment()
        atomic_write_json(cfg.out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--warmup-windows", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-lens", default="8,40,120,300", help="comma-separated")
    ap.add_argument("--max-new", default="4,96", help="LO,HI output cap range")
    ap.add_argument("--distinct-prompts", type=int, default=24)
    ap.add_argument("--abort-prob", type=float, default=0.25)
    ap.add_argument("--cancel-prob", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--max-rss-growth-mib", type=float, default=64.0)
    ap.add_argument("--max-tpot-ratio", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="JSON record (default results/soak/...)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. system=hisparse")
    a = ap.parse_args(argv)
    lo, hi = (int(x) for x in a.max_new.split(","))
    cfg = SoakConfig(
        overrides=a.overrides,
        duration_s=a.minutes * 60,
        windows=a.windows,
        warmup_windows=a.warmup_windows,
        concurrency=a.concurrency,
        prompt_lens=[int(x) for x in a.prompt_lens.split(",")],
        max_new=(lo, hi),
        distinct_prompts=a.distinct_prompts,
        abort_prob=a.abort_prob,
        cancel_prob=a.cancel_prob,
        seed=a.seed,
        trace_malloc=a.tracemalloc,
        max_rss_growth_mib=a.max_rss_growth_mib,
        max_tpot_ratio=a.max_tpot_ratio,
    )
    if a.out is None:
        tag = (
            "-".join(
                o.split("=", 1)[1] for o in a.overrides if o.split("=", 1)[0] in ("system", "model")
            )
            or "default"
        )
        a.out = str(REPO / "results" / "soak" / f"{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    cfg.out = a.out
    rec = asyncio.run(run_soak(cfg))
    for name, c in rec["checks"].items():
        print(f"[soak] {'ok  ' if c['ok'] else 'FAIL'} {name}: {c['value']} (limit {c['limit']})")
    print(f"[soak] {'PASSED' if rec['passed'] else 'FAILED'} -> {cfg.out}")
    return 0 if rec["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
