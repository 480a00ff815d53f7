"""Decode step time of the bundled engine against its byte floor (issue: engine foundation).

    python benchmarks/bench_decode_step.py model=glm53_mini system=resident --batches 1,16,64 \
        --context 8192

Byte floor of one decode step = bytes it must read once: all weights (bf16) + the selected KV
rows (B x layers x k x row_bytes). We also report the floor including the indexer's scan of
every visible index key (B x selecting layers x L x index_row_bytes), which a DSA-style indexer
pays per token. Time is the median of engine steps (schedule + forward + sample + postprocess,
synchronized) after warm-up; floors use the measured 4.22 TB/s device copy rate (docs/design.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HBM_BPS = 4.22e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=8192, help="prompt length per request")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--kv-pool-gib", type=float, default=40.0)
    ap.add_argument("--phases", action="store_true",
                    help="speculative systems: time the round's phases (propose, verify, "
                         "accept+commit, catch-up, emit) with CUDA events")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import torch

    from harness.environment import environment
    from systems.engine.config import compose, resolve_engine_config
    from systems.engine.engine import Engine
    from systems.engine.request import Request, SamplingParams

    if not torch.cuda.is_available():
        sys.exit("bench_decode_step: no CUDA device here; run it on the GPU machine")
    batches = [int(b) for b in args.batches.split(",")]
    new_tokens = args.warmup + args.steps + 2
    cfg = compose(["device=cuda", f"hardware.kv_pool_gib={args.kv_pool_gib}",
                   f"hardware.max_running_requests={max(batches)}",
                   f"workload.input_len={args.context}", f"workload.output_len={new_tokens}",
                   *args.overrides])
    ecfg = resolve_engine_config(cfg)
    m = ecfg.model
    rows = []
    for B in batches:
        eng = Engine(ecfg)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(2, m.vocab_size, (args.context,), generator=g).tolist()
        reqs = [Request(eng.new_rid(), prompt, SamplingParams(max_new_tokens=new_tokens))
                for _ in range(B)]
        for r in reqs:
            eng.submit(r)
        eng.step()  # prefill once, admit all (handoffs), first decode step
        assert len(eng.scheduler.running) == B, (len(eng.scheduler.running), B)
        times = []
        timer = None
        for i in range(args.warmup + args.steps):
            if args.phases and i == args.warmup and hasattr(eng.decoder, "phase_timer"):
                from systems.spec.decoder import PhaseTimer
                timer = eng.decoder.phase_timer = PhaseTimer(eng.device)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            eng.step()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        step_s = statistics.median(times)
        w_bytes = m.weight_bytes(2)
        kv_bytes = B * m.num_layers * m.index_topk * m.row_bytes
        idx_bytes = B * m.num_selecting_layers * (args.context + args.warmup) * m.index_row_bytes
        floor = (w_bytes + kv_bytes) / HBM_BPS
        floor_idx = (w_bytes + kv_bytes + idx_bytes) / HBM_BPS
        row = {"batch": B, "context": args.context, "step_ms_median": step_s * 1e3,
               "step_ms_p10": statistics.quantiles(times, n=10)[0] * 1e3,
               "step_ms_p90": statistics.quantiles(times, n=10)[-1] * 1e3,
               "weight_bytes": w_bytes, "selected_kv_bytes": kv_bytes,
               "index_scan_bytes": idx_bytes, "floor_ms": floor * 1e3,
               "floor_with_index_ms": floor_idx * 1e3, "ratio_to_floor": step_s / floor,
               "ratio_to_floor_with_index": step_s / floor_idx,
               # graphs on unless engine.disable_cuda_graph=true or a capture failed
               "cuda_graph": eng.graph_runner is not None and not eng.graph_runner.broken,
               "graph_stats": dict(eng.graph_runner.stats) if eng.graph_runner else None}
        if timer is not None:
            torch.cuda.synchronize()
            row["phases_ms_median"] = {p: statistics.median(v) for p, v in timer.ms().items() if v}
            eng.decoder.phase_timer = None
        rows.append(row)
        if "phases_ms_median" in row:
            print(f"B={B:4d} round phases (ms): " + ", ".join(
                f"{p} {v:.2f}" for p, v in row["phases_ms_median"].items()), flush=True)
        print(f"B={B:4d} step {row['step_ms_median']:8.3f} ms  floor {row['floor_ms']:7.3f} ms "
              f"(x{row['ratio_to_floor']:.1f})  floor+index {row['floor_with_index_ms']:7.3f} ms "
              f"(x{row['ratio_to_floor_with_index']:.1f})", flush=True)
        del eng
        torch.cuda.empty_cache()
    env = environment()
    rec = {"benchmark": "decode_step", "model": m.name, "system": cfg.system.name,
           "overrides": args.overrides, "hbm_bytes_per_s": HBM_BPS, "rows": rows, "env": env,
           "model_config": {k: getattr(m, k) for k in ("num_layers", "index_topk", "row_bytes",
                                                        "hidden_size", "kv_dim", "index_dim")}}
    out = Path(args.out) if args.out else REPO / "results" / "engine_step" / \
        f"{m.name}-{cfg.system.name}-{env['git_commit'][:8]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
