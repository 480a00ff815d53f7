"""Does a row of a bf16 GEMM keep its bits when the batch (M rows) changes? (cuBLAS, the GPU)

    python benchmarks/check_gemm_invariance.py --models glm53_mini,glm53_h200 \
        --out results/cuda_graph/gemm-invariance-h200.json

For each weight shape of a preset's layer (the fused input projection of a full and of a
follower layer, attention output, the MLP's gate-up and down projections, the LM head) every
M in 1 .. 64, then every 8 up to --max-m, is compared with each row computed alone (M = 1):
``differs_at_m`` lists the M whose rows are not bit-identical. Why it matters: a CUDA graph's
padding rows, and the requests beside a request, change M; where cuBLAS picks another kernel
for the new M, greedy tokens can change with the batch (docs/engine.md, batch invariance).
The attention kernels are ours and batch invariant by construction. Both GEMM implementations
are checked (``--impls``; ``model.gemm_impl``, systems/kernels/gemm.py) and timed at M = 1, 8,
32, 128 (median CUDA-event microseconds, L2 flushed before each: benchmarks/gpu_timing.py).
cuBLAS's ranges are reported (the facts docs/engine.md quotes); a row of the batch-invariant
kernel that changes with M exits 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_timing import median_us  # noqa: E402  (benchmarks/, the script's folder)


def layer_shapes(m) -> dict[str, tuple[int, int]]:
    """(K, N) of each GEMM weight of a preset's decode step (systems/models/sparse_model.py)."""
    D, H, d, di = m.hidden_size, m.num_heads, m.kv_dim, m.index_dim
    return {
        "w_in full": (D, d + H * d + 2 * di),
        "w_in follower": (D, d + H * d),
        "wo": (H * d, D),
        "w13": (D, 2 * m.intermediate_size),
        "w2": (m.intermediate_size, D),
        "lm_head": (D, m.vocab_size),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="glm53_mini,glm53_h200")
    ap.add_argument("--max-m", type=int, default=320)
    ap.add_argument("--impls", default="cublas,triton", help="model.gemm_impl values to check")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from harness.records import finish_benchmark
    from systems.engine.config import compose

    if not torch.cuda.is_available():
        sys.exit("check_gemm_invariance: no CUDA device here; run it on the GPU machine")
    from systems.kernels.gemm import mm

    ms = [*range(1, 65), *range(72, args.max_m + 1, 8)]
    g = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # past the 50 MB L2
    rows, bad_triton = [], 0
    for model in args.models.split(","):
        cfg = compose([f"model={model}"]).model
        for name, (K, N) in layer_shapes(cfg).items():
            x = torch.randn(max(ms), K, device="cuda", generator=g).to(torch.bfloat16)
            w = (torch.randn(K, N, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
            row = {"model": model, "weight": name, "K": K, "N": N}
            for impl in args.impls.split(","):
                alone = torch.cat([mm(x[i : i + 1], w, impl) for i in range(max(ms))])
                bad = [m for m in ms if not torch.equal(mm(x[:m], w, impl), alone[:m])]
                key = "" if impl == "cublas" else f"{impl}_"
                row[f"{key}differs_at_m"] = bad
                row[f"{key}us"] = {
                    m: round(median_us(torch, lambda: mm(x[:m], w, impl), flush, 30), 1)
                    for m in (1, 8, 32, 128)
                }
                bad_triton += impl == "triton" and bool(bad)
                first = bad[0] if bad else None
                print(
                    f"[gemm] {model:12s} {name:14s} {K:6d} x {N:6d} {impl:7s}: rows change from "
                    f"M = {first}; us at M 1/8/32/128: {list(row[f'{key}us'].values())}"
                )
            rows.append(row)
    finish_benchmark(
        args.out,
        {"benchmark": "check_gemm_invariance", "args": vars(args), "m_tested": ms, "rows": rows},
        bool(bad_triton),
    )


if __name__ == "__main__":
    main()
