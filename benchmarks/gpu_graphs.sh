#!/usr/bin/env bash
# Device call (about 9 min): CUDA graphs on the H200 -- replay vs eager tokens for five systems,
# the decode step with graphs (resident, hisparse), then the GPU soak record of issue 10.
# Pass DHS_GIT_COMMIT=<sha> on the command line.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 170 python3 benchmarks/check_cuda_graph.py --out $OUT/cuda_graph_check.json 2>&1 | grep -v Warn | tail -12
timeout 90 python3 benchmarks/bench_decode_step.py model=glm53_mini system=resident --out $OUT/step_resident.json 2>&1 | tail -5
timeout 100 python3 benchmarks/bench_decode_step.py model=glm53_mini system=hisparse hardware.host_pool_gib=12 --out $OUT/step_hisparse.json 2>&1 | tail -5
timeout 210 python3 -m benchmarks.soak --minutes 2 system=adaptive_hisparse model=glm53_mini hardware=h200 hardware.host_pool_gib=24 --out $OUT/soak.json 2>&1 | tail -9
ls -la $OUT
