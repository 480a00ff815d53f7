#!/usr/bin/env bash
# Device call 3: Fig. 8 timings (kernel already checked on GPU in call 2), the default run, and
# the hisparse-vs-resident closed loop. Time-boxed parts; outputs in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 200 python3 benchmarks/bench_resolver.py --out $OUT/fig8_summary.json 2>&1 | tail -30 | tee $OUT/fig8.log
timeout 200 python3 -m harness.run -m experiment=hisparse_e2e system=resident,hisparse results_dir=$OUT/res 2>&1 | grep -v Warn | tail -14 | tee $OUT/e2e.log
(cd $OUT/res && tar czf $OUT/e2e_results.tgz --exclude=records.jsonl hisparse_e2e) 2>/dev/null
timeout 130 python3 -m harness.run experiment=default_h200 results_dir=$OUT/res 2>&1 | tail -8 | tee $OUT/default.log
(cd $OUT/res && tar czf $OUT/default_results.tgz default_h200) 2>/dev/null
