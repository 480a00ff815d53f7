"""CUDA graphs against the eager step on the GPU: same greedy tokens, and the step time of each.

    python benchmarks/check_cuda_graph.py --systems resident,hisparse,adaptive_hisparse \
        --batch 8 --context 4096 --new-tokens 32 --out results/cuda_graph/check.json

For every system, three engines serve the same prompts greedily: one with
``engine.disable_cuda_graph=true`` (eager, scans bucketed like the graphs), one with graphs, and
one with graphs, ``engine.overlap_schedule=false`` and ``engine.async_handoffs=false``
(synchronous steps and handoffs). The tokens must be identical (a replay must reproduce the eager step bit for bit: the same
selections, the same hot-cache decisions, the same bytes). The hot cache is kept small
(``--hot-cache-rows``) so that host misses, victims and the follower prefetch all happen inside
the graphs. Step times are medians of the decode steps after the first ``--warmup`` ones
(synchronized). Batch invariance under graphs: a prompt of repeated tokens (bit-equal indexer
scores) is served alone and beside the longer prompts; its greedy tokens must be the same.
``--stagger N`` gives request i an output cap of ``--new-tokens`` + N i, so the batch drains
and sizes without a graph replay a larger one with padding rows (``padded_replays`` in the
graph stats); the eager and graph engines' selection counters must then agree too (padding
rows count nothing). Exits 1 on any token or counter mismatch.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _serve(overrides, prompts, new_tokens, warmup, stagger=0):
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    from systems.engine.config import compose, resolve_engine_config
    from systems.engine.engine import Engine
    from systems.engine.request import Request, SamplingParams

    eng = Engine(resolve_engine_config(compose(overrides)))
    reqs = [
        Request(eng.new_rid(), p, SamplingParams(max_new_tokens=new_tokens + stagger * i))
        for i, p in enumerate(prompts)
    ]
    for r in reqs:
        eng.submit(r)
    times, lent = [], 0
    while not eng.is_idle:
        sync()
        t0 = time.perf_counter()
        eng.step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        # optional pages in free slots' index history (adaptive backends), outside the timing
        lent = max(lent, eng.backend.metrics().get("dhs_optional_pages_lent", 0))
    steady = times[1 + warmup : -1] or times  # drop the admission step and the last one
    out = {
        "tokens": [r.output_ids for r in reqs],
        "step_ms_median": statistics.median(steady),
        "steps": len(times),
        "failed": eng.stats["failed_total"],
    }
    if eng.graph_runner is not None:
        out["graph_stats"] = dict(eng.graph_runner.stats, broken=eng.graph_runner.broken)
        out["drafter_graph_stats"] = dict(
            eng.graph_runner.drafter.stats, broken=eng.graph_runner.drafter.broken
        )
    m = eng.backend.metrics()
    out["host_rows_copied"] = m.get("dhs_host_rows_copied_total")
    out["selection_counters"] = {k: v for k, v in m.items() if k.startswith("dhs_selected_rows")}
    out["optional_pages_lent_max"] = lent
    # whether the adaptive backends' reclaim path ran at all (a roomy pool never reclaims)
    out["reclaimed_pages"] = m.get("dhs_reclaimed_pages_total")
    del eng
    gc.collect()  # the engine and its decoder refer to each other: free its pools now
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        # pinned host blocks go back to a cache, not to the OS: ten engines in one process
        # would otherwise hold ten host stores
        getattr(torch._C, "_host_emptyCache", lambda: None)()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--systems",
        default="resident,hisparse,adaptive_hisparse,resident_dflash2,adaptive_dhisparse",
    )
    ap.add_argument("--model", default="glm53_mini")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--stagger", type=int, default=0, help="request i's output cap: new tokens + stagger * i"
    )
    ap.add_argument("--hot-cache-rows", type=int, default=512, help="B (= k: misses every step)")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every engine")
    ap.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="exercise the script on CPU: tiny model, emulated graphs",
    )
    args = ap.parse_args()

    import torch

    from harness.records import finish_benchmark

    dev = ["device=cuda", "hardware=h200"]
    if args.cpu_dry_run:
        dev = [
            "device=cpu",
            "+engine.cuda_graph_emulate=true",
            "engine.cuda_graph_scan_step=64",
        ]
    elif not torch.cuda.is_available():
        sys.exit("check_cuda_graph: no CUDA device here; run it on the GPU machine")
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(2, 32000, (args.context + 7 * i,), generator=g).tolist()
        for i in range(args.batch)
    ]
    vocab = 512 if args.cpu_dry_run else 32000
    prompts = [[t % vocab for t in p] for p in prompts]
    base = [
        *dev,
        f"model={args.model}",
        f"hardware.kv_pool_gib={1 if args.cpu_dry_run else 8}",
        f"hardware.host_pool_gib={0.25 if args.cpu_dry_run else 4}",
        # a slot more than the batch: the CUDA graph ladder ends at the slots, and a draining
        # batch's sizes off it (3 of 4 slots) then replay a larger graph with padding rows
        f"hardware.max_running_requests={args.batch + 1}",
        f"model.max_context_len="
        f"{args.context + 8 * args.batch + args.new_tokens + args.stagger * args.batch + 16}",
        f"+reproduce.kv.hot_cache_rows={args.hot_cache_rows}",  # the hierarchy systems read it
        f"workload.input_len={args.context}",
        f"workload.output_len={args.new_tokens}",
    ]
    rows, bad = [], 0
    for system in args.systems.split(","):
        ov = [*base, f"system={system}", *args.overrides]
        if "dflash2" in system or "dhisparse" in system:
            ov.append("system.speculation.acceptance=exact")
        eager = _serve(
            [*ov, "engine.disable_cuda_graph=true"],
            prompts,
            args.new_tokens,
            args.warmup,
            args.stagger,
        )
        graph = _serve(ov, prompts, args.new_tokens, args.warmup, args.stagger)
        sync = _serve(
            [*ov, "engine.overlap_schedule=false", "engine.async_handoffs=false"],
            prompts,
            args.new_tokens,
            args.warmup,
            args.stagger,
        )
        same = eager["tokens"] == graph["tokens"]
        counted = eager["selection_counters"] == graph["selection_counters"]
        overlap_same = sync["tokens"] == graph["tokens"]
        rep = ([7, 11, 13, 17, 19, 23] * (args.context // 6 + 1))[: args.context]
        alone = _serve(ov, [rep], args.new_tokens, args.warmup)["tokens"][0]
        beside = _serve(ov, [*prompts, rep], args.new_tokens, args.warmup)["tokens"][-1]
        invariant = alone == beside
        bad += (not same) + (not invariant) + (not overlap_same) + (not counted)
        row = {
            "system": system,
            "tokens_identical": same,
            "selection_counters_identical": counted,
            "batch_invariant": invariant,
            "overlap_identical": overlap_same,
            "eager_step_ms": eager["step_ms_median"],
            "graph_step_ms": graph["step_ms_median"],
            "sync_graph_step_ms": sync["step_ms_median"],
            "speedup": eager["step_ms_median"] / graph["step_ms_median"],
            "graph_stats": graph.get("graph_stats"),
            "drafter_graph_stats": graph.get("drafter_graph_stats"),
            "failed": [eager["failed"], graph["failed"]],
            "host_rows_copied": [eager["host_rows_copied"], graph["host_rows_copied"]],
            "optional_pages_lent_max": graph["optional_pages_lent_max"],
            "reclaimed_pages": [eager["reclaimed_pages"], graph["reclaimed_pages"]],
        }
        rows.append(row)
        print(
            f"[cuda_graph] {system:22s} identical={same} counters={counted} "
            f"batch_invariant={invariant} overlap_identical={overlap_same} "
            f"eager {row['eager_step_ms']:.2f} ms "
            f"graph {row['graph_step_ms']:.2f} ms ({row['speedup']:.1f}x) "
            f"{row['graph_stats']} lent pages (max) {row['optional_pages_lent_max']} "
            f"reclaimed pages {row['reclaimed_pages']}",
            flush=True,
        )
    finish_benchmark(
        args.out, {"benchmark": "check_cuda_graph", "args": vars(args), "rows": rows}, bool(bad)
    )


if __name__ == "__main__":
    main()
