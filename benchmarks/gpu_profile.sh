#!/usr/bin/env bash
# Device call (about 7.5 min): the collectors on the H200 -- Fig. 11 kernel profiles (profile=kernels,
# graphs on), census and memory collectors on a short adaptive run, the Nsight collector (and its
# CUDA-event fallback) -- and a num_warps probe of the resolver for Fig. 8b/c. DHS_GIT_COMMIT=<sha>.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT/res $OUT/x
timeout 170 python3 -m harness.reproduce --only fig11 --results $OUT/res 2>&1 | grep -v Warn | grep -v "^\[20" | tail -8
for p in census memory; do
  timeout 40 python3 -m harness.run experiment=hisparse_e2e system=adaptive_hisparse profile=$p experiment_name=collect_$p workload.concurrency=[16] workload.num_requests=32 results_dir=$OUT/res 2>&1 | grep -v Warn | tail -3
done
timeout 30 python3 -m profiling.nsight --preset smoke --out $OUT/x/nsight 2>&1 | tail -4
timeout 30 python3 -m profiling.nsight --preset smoke --events --out $OUT/x/nsight_events 2>&1 | tail -4
for nw in 4; do
  timeout 45 python3 benchmarks/bench_resolver.py --skip a --num-warps $nw --out $OUT/x/fig8bc_nw$nw.json 2>&1 | tail -7
done
(cd $OUT && tar czf $OUT/results.tgz res x && rm -rf res x) 2>/dev/null
ls -la $OUT
