"""Calibrate the indexer's selection-locality knob (the one calibrated input, docs/design.md).

HiSparse's share of selected rows fetched from host should follow the paper's numbers: for the
GLM-like presets Fig. 9e (33% at B = k falling to 3.9% at B = 8k) and Table A1 (13.8% at B = 2k,
the budget the serving experiments run at); for the DeepSeek-like ones (``dsv*``) Fig. 9g's ends
(36% at B = 2k, 9.5% at 16k, their serving budget). For each candidate lambda we admit N
requests over one prepared prefix, decode a whole output (1,024 steps by default) and read the
resolver census over all of it, as a served run's share counts every position of its requests'
outputs (the hot cache warms over decode: the first steps' share can be several times the whole
output's, see each point's ``host_share_pct_by_window``). The outputs are sampled at
--temperature (1.0, the serving experiments' ``workload.temperature``): a greedy output of
random weights can settle into a cycle of a few tokens, which repeats one query and so fetches
nothing, so whether a prompt's greedy output cycles would decide its share (docs/presets.md).
By default a grid of lambdas is measured at --budgets and the fit minimizes the squared error
in log-share at the published points; one knob may not follow the whole curve, so
``--solve-at 2`` instead bisects lambda until the share at that budget meets the paper's.
Results go to results/calibration/locality.json (locality-<model>.json for another model, e.g.
glm53_h200), written after every point; the fit belongs in the preset
(conf/model/<model>.yaml: selection_locality).

    python benchmarks/calibrate_locality.py --lams 0,0.5,0.7,0.8,0.9 --requests 16 --context 16384
    python benchmarks/calibrate_locality.py --model glm53_h200 --context 50000 --lams 0.7,0.8 \
        --solve-at 2    # bisect lambda to the paper's share at the serving experiments' budget
    python benchmarks/calibrate_locality.py --model dsv41_h200 --context 125000 --lams 0.6,0.9 \
        --solve-at 16   # the DeepSeek-like preset at its budget (B / k = 16)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# HiSparse's % of selected rows fetched from host by B / k, per paper model. GLM-5.3 at 100K:
# Fig. 9e's ends (C128) and Table A1's residency-off share at B = 2k, the budget the serving
# experiments run at (13.79 % at C256, 14.21 / 13.98 % at C16: the share barely moves with
# load). DeepSeek-V4.1-Flash at 500K: sec. 4.3.4, at C128 the host-miss rate falls from 36 %
# at B = 2k to 9.5 % at 16k (Fig. 9g), the budget its serving experiments run at.
PAPER_BY_MODEL = {"glm": {1: 33.0, 2: 13.8, 8: 3.9}, "deepseek": {2: 36.0, 16: 9.5}}


def paper_points(model: str) -> dict[int, float]:
    """The published points for a preset: the DeepSeek-like ones (``dsv*``) or GLM's."""
    return PAPER_BY_MODEL["deepseek" if "dsv" in model else "glm"]


def measure(lam: float, b_over_k: int, args) -> dict:
    import torch

    from systems.engine.config import compose, resolve_engine_config
    from systems.engine.engine import Engine
    from systems.engine.request import Request, SamplingParams

    cfg = compose(
        [
            f"model={args.model}",
            "system=hisparse",
            f"device={args.device}",
            f"model.selection_locality={lam}",
            f"hardware.kv_pool_gib={args.pool_gib}",
            f"hardware.host_pool_gib={args.host_gib}",
            f"hardware.max_running_requests={args.requests}",
            f"model.max_context_len={args.context + args.steps + 64}",
            f"workload.input_len={args.context}",
            f"workload.output_len={args.steps + 8}",
        ]
    )
    cfg.system.kv.hot_cache_rows = b_over_k * cfg.model.index_topk
    ecfg = resolve_engine_config(cfg)
    eng = Engine(ecfg)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, ecfg.model.vocab_size, (args.context,), generator=g).tolist()
    params = SamplingParams(max_new_tokens=args.steps + 8, temperature=args.temperature)
    reqs = [Request(eng.new_rid(), prompt, params) for _ in range(args.requests)]
    for r in reqs:
        eng.submit(r)
    while len(eng.scheduler.running) < args.requests:  # admission: prefill, handoffs
        eng.step()
        failed = [r.finish_reason for r in reqs if r.finish_reason]
        if failed:  # a request that failed (out of memory, say) never runs: say why, not hang
            raise RuntimeError(f"lambda {lam}, B/k {b_over_k}: a request failed: {failed[0]}")
    keys = (
        "dhs_selected_rows_total",
        "dhs_selected_rows_from_host_total",
        "dhs_host_rows_copied_total",
        "dhs_selected_rows_hot_total",
    )
    m0 = eng.backend.metrics()
    # the share counts every decode step from admission to the output cap: a served run's
    # requests sit at every position of their output, and the hot cache warms over decode,
    # so a window right after admission overstates the whole run's share (windows below)
    windows, mw = [], m0
    t0 = None
    for i in range(args.steps):
        if i == args.warmup:  # step time from here: capture and first launches are behind
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        eng.step()
        if (i + 1) % args.window == 0 or i + 1 == args.steps:
            m = eng.backend.metrics()
            rows_ = m[keys[0]] - mw[keys[0]]
            windows.append(100.0 * (m[keys[1]] - mw[keys[1]]) / max(1, rows_))
            mw = m
    if args.device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    m1 = eng.backend.metrics()
    d = {k: m1[k] - m0[k] for k in keys}
    share = 100.0 * d["dhs_selected_rows_from_host_total"] / max(1, d["dhs_selected_rows_total"])
    # a greedy output of random weights can settle into a short cycle, which repeats one query
    # and so fetches nothing: the fewest distinct tokens among the requests' last window shows it
    distinct = min(len(set(r.output_ids[-args.window :])) for r in reqs)
    # the engine and its parts refer to each other: only a collection frees its weights and
    # pools, and without one the next point's engine found the GPU full (a 30 GB preset on an
    # 80 GB card)
    del eng
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return {
        "lambda": lam,
        "b_over_k": b_over_k,
        "host_share_pct": share,
        "step_ms": 1e3 * dt / (args.steps - args.warmup),
        "host_share_pct_by_window": windows,
        "window_steps": args.window,
        "min_distinct_tokens_last_window": distinct,
        **d,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="glm53_mini")
    ap.add_argument("--lams", default="0,0.5,0.7,0.8,0.9")
    ap.add_argument("--budgets", default=None, help="B / k values (default: the published ones)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument(
        "--steps", type=int, default=1024, help="decode steps counted (default: a 1,024-token cap)"
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the decoded outputs, the serving experiments' "
        "workload.temperature (greedy outputs of random weights fall into cycles)",
    )
    ap.add_argument("--warmup", type=int, default=8, help="steps left out of the step time only")
    ap.add_argument("--window", type=int, default=128, help="steps per reported share window")
    ap.add_argument(
        "--solve-at",
        type=int,
        default=None,
        metavar="B_OVER_K",
        help="instead of the grid: bisect lambda between the two --lams until the share at this "
        "budget meets the paper's (e.g. 2: Table A1's 13.8%%, where the serving experiments run)",
    )
    ap.add_argument("--iters", type=int, default=4, help="bisection steps after the two ends")
    ap.add_argument(
        "--widen",
        type=int,
        default=2,
        help="--solve-at: times an end that does not bracket the paper's share moves outward",
    )
    ap.add_argument("--pool-gib", type=float, default=8.0)
    ap.add_argument("--host-gib", type=float, default=8.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--out",
        default=None,
        help="default: results/calibration/locality.json for glm53_mini, "
        "locality-<model>.json for another model",
    )
    args = ap.parse_args()
    if not 0 <= args.warmup < args.steps:
        ap.error("--warmup must be below --steps")
    paper = paper_points(args.model)
    if args.budgets is None:
        args.budgets = ",".join(str(b) for b in sorted(paper))
    if args.solve_at is not None:
        if args.solve_at not in paper:
            ap.error(f"--solve-at must be one of the published budgets {sorted(paper)}")
        if len(args.lams.split(",")) != 2:
            ap.error("--solve-at bisects between two --lams, e.g. --lams 0.7,0.8")
    if args.solve_at is None and not set(paper) <= {int(x) for x in args.budgets.split(",")}:
        ap.error(f"the grid fit needs every published budget: --budgets {sorted(paper)}")
    if args.out is None:  # a bisection beside the grid's file, not over it
        name = "locality" if args.model == "glm53_mini" else f"locality-{args.model}"
        tail = "" if args.solve_at is None else f"-at{args.solve_at}k"
        args.out = str(REPO / "results" / "calibration" / f"{name}{tail}.json")
    from harness.environment import environment

    env = environment()
    from systems.engine.config import compose, model_config_from
    from systems.models.config import GEOMETRY_KEYS

    model = model_config_from(compose([f"model={args.model}"]).model, "cpu")
    geometry = {k: getattr(model, k) for k in GEOMETRY_KEYS if hasattr(model, k)}
    rows = []
    # --solve-at: the paper's share lies between the two ends (no fit until both are measured)
    bracketed = args.solve_at is None

    targets = paper if args.solve_at is None else {args.solve_at: paper[args.solve_at]}

    def err(lam):
        e = 0.0
        for bk, want in targets.items():
            ours = [r["host_share_pct"] for r in rows if r["lambda"] == lam and r["b_over_k"] == bk]
            if not ours:
                return math.inf
            e += (math.log(max(ours[0], 1e-3)) - math.log(want)) ** 2
        return e

    def write() -> float | None:
        """The points so far and the fit over the lambdas measured at every published budget:
        written after every point, so a run cut by its time box keeps what it measured."""
        lams = sorted({r["lambda"] for r in rows})
        best = min(lams, key=err) if lams else None
        fitted = bracketed and best is not None and math.isfinite(err(best))
        out = {
            "model": args.model,
            "paper_host_share_pct": paper,
            "fitted_lambda": best if fitted else None,
            "fit_error_log2": err(best) if fitted else None,
            "points": rows,
            "settings": vars(args),
            "model_geometry": geometry,
            "env": env,
            "bracketed": bracketed,
            "fit": "grid over every published budget"
            if args.solve_at is None
            else f"bisection at B/k = {args.solve_at} (the nearest measured lambda)",
            "note": "fit of model.selection_locality; the single calibrated input",
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return best if fitted else None

    def point(lam: float, bk: int) -> float:
        r = measure(lam, bk, args)
        rows.append(r)
        print(
            f"lambda={lam:.3f} B/k={bk}: host share {r['host_share_pct']:6.2f}% "
            f"step {r['step_ms']:.1f} ms, >= {r['min_distinct_tokens_last_window']} distinct "
            "tokens per output's last window",
            flush=True,
        )
        write()
        return r["host_share_pct"]

    lams = [float(x) for x in args.lams.split(",")]
    if args.solve_at is None:
        for lam in lams:
            for bk in [int(x) for x in args.budgets.split(",")]:
                point(lam, bk)
    else:  # the share falls as lambda grows: keep the paper's share between the two ends
        bk, goal = args.solve_at, paper[args.solve_at]
        lo, hi = sorted(lams)
        s_lo, s_hi = point(lo, bk), point(hi, bk)
        # an end on the wrong side moves outward by the ends' distance, up to --widen times
        # (a lost GPU call costs more than a few points)
        for _ in range(args.widen):
            if s_hi <= goal <= s_lo:
                break
            step = hi - lo
            if s_lo < goal and lo > 0.0:  # too little fetched even at the lower end
                lo, hi, s_hi = max(0.0, round(lo - step, 4)), lo, s_lo
                s_lo = point(lo, bk)
            elif s_hi > goal and hi < 1.0:  # too much fetched even at the upper end
                lo, hi, s_lo = hi, min(1.0, round(hi + step, 4)), s_hi
                s_hi = point(hi, bk)
            else:
                break
        if not s_hi <= goal <= s_lo:
            bracketed = False
            write()
            sys.exit(
                f"the paper's {goal}% is not between {s_lo:.2f}% and {s_hi:.2f}% (lambda "
                f"{lo} / {hi}): widen --lams -> {args.out}"
            )
        else:
            bracketed = True
            for _ in range(args.iters):
                mid = round((lo + hi) / 2, 4)
                if point(mid, bk) > goal:
                    lo = mid
                else:
                    hi = mid
    best = write()
    if best is None:
        print(f"no fit: no lambda was measured at B/k = {sorted(targets)} -> {args.out}")
    else:
        print(f"fitted lambda = {best} (log-error {err(best):.3f}) -> {args.out}")


if __name__ == "__main__":
    main()
