#!/usr/bin/env bash
# Next device session, first call (about 6 min): the runs that were cut short by the loadgen
# hang (fixed since): issue 2's embedded default and issue 4's hisparse-vs-resident closed loop,
# plus the GPU soak record of issue 10. Pass DHS_GIT_COMMIT=<sha> on the command line.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 -m harness.run experiment=default_h200 results_dir=$OUT/res 2>&1 | grep -v Warn | tail -8
timeout 200 python3 -m harness.run -m experiment=hisparse_e2e system=resident,hisparse results_dir=$OUT/res 2>&1 | grep -v Warn | tail -12
timeout 150 python3 -m benchmarks.soak --minutes 2 system=adaptive_hisparse model=glm53_mini hardware=h200 --out $OUT/soak.json 2>&1 | tail -5
(cd $OUT/res && tar czf $OUT/results.tgz --exclude='*.failed-*' .) 2>/dev/null
