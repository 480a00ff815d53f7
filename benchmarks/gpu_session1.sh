#!/usr/bin/env bash
# One device call: engine step benchmark + the embedded default + tests of kernels on GPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
mkdir -p $OUT
python3 benchmarks/bench_decode_step.py model=glm53_mini system=resident --context 8192 --out $OUT/engine_step_glm53_mini.json 2>&1 | tee $OUT/bench_step.log
python3 -m harness.run experiment=default_h200 results_dir=$OUT/results 2>&1 | tail -30 | tee $OUT/default_run.log
