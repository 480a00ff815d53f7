#!/usr/bin/env bash
# Device call (about 9.5 min): CUDA-graph replay vs eager tokens on four systems, then the
# Fig. 6 load step (residency on/off) and the Fig. 7 block sweep. Pass DHS_GIT_COMMIT=<sha>.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT/res
timeout 100 python3 benchmarks/check_cuda_graph.py --systems hisparse,adaptive_hisparse,resident_dflash2,adaptive_dhisparse --context 2048 --new-tokens 24 --out $OUT/cuda_graph_check.json 2>&1 | grep -v Warn | tail -6
timeout 215 python3 -m harness.reproduce --only fig6 --results $OUT/res 2>&1 | grep -v Warn | grep -v "^\[20" | tail -12
timeout 245 python3 -m harness.reproduce --only fig7 --results $OUT/res 2>&1 | grep -v Warn | grep -v "^\[20" | tail -16
(cd $OUT/res && tar czf $OUT/results.tgz .) 2>/dev/null
ls -la $OUT
