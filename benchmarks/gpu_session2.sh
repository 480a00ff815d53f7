#!/usr/bin/env bash
# One device call (issue 2 default run, issue 4 Fig. 8 + calibration + e2e). Each part is
# time-boxed so one failure cannot eat the call; outputs land in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi -L
timeout 210 python3 benchmarks/bench_resolver.py --check --out $OUT/fig8_summary.json 2>&1 | tail -40 | tee $OUT/fig8.log
timeout 130 python3 benchmarks/calibrate_locality.py --lams 0.5,0.7,0.8,0.9 --budgets 1,2,4,8 --requests 16 --context 12288 --host-gib 4 --out $OUT/locality.json 2>&1 | tail -20 | tee $OUT/calib.log
timeout 150 python3 -m harness.run -m experiment=hisparse_e2e system=resident,hisparse results_dir=$OUT/res 2>&1 | grep -v Warn | tail -14 | tee $OUT/e2e.log
(cd $OUT/res && tar czf $OUT/e2e_results.tgz hisparse_e2e) 2>/dev/null
timeout 100 python3 -m harness.run experiment=default_h200 results_dir=$OUT/res 2>&1 | tail -8 | tee $OUT/default.log
(cd $OUT/res && tar czf $OUT/default_results.tgz default_h200) 2>/dev/null
