#!/usr/bin/env bash
# Nsight Compute profiles of resolver calls (one device call; carry .whl is not needed):
#   bash benchmarks/gpu_ncu.sh "name|batch|misses|kw" ...
# e.g. bash benchmarks/gpu_ncu.sh "b8m77|8|77|" "b8m0_early|8|0|early_copy=True+copy_programs_per_request=4"
# For each case: $OUT/ncu_<name>.ncu-rep (full set, source counters, 3 launches after 2 warm-ups),
# the details page and the per-source-line / per-SASS-instruction stall samples as CSV.
set -uo pipefail
export PYTHONPATH=$PWD/benchmarks:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_ncu: no ncu on this machine"; exit 1; }
$NCU --version | tail -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
for case in "$@"; do
  IFS='|' read -r name batch misses kw <<< "$case"
  echo "== $name: batch $batch, $misses misses, ${kw:-defaults}"
  timeout 240 $NCU --clock-control none --cache-control all --set full --import-source yes \
    --kernel-name regex:_resolver_kernel --launch-skip 2 --launch-count 3 -f -o $OUT/ncu_$name \
    python3 benchmarks/ncu_resolver.py --batch $batch --misses $misses --calls 5 --kw "$kw" 2>&1 | grep -v "^==PROF==" | tail -4
  $NCU -i $OUT/ncu_$name.ncu-rep --page details --csv > $OUT/ncu_${name}_details.csv 2>&1
  $NCU -i $OUT/ncu_$name.ncu-rep --page source --csv --print-source cuda > $OUT/ncu_${name}_src.csv 2>&1
  $NCU -i $OUT/ncu_$name.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${name}_sass.csv 2>&1
  grep -E '"(Duration|Registers Per Thread|Achieved Occupancy|Elapsed Cycles)"' $OUT/ncu_${name}_details.csv | cut -d, -f1,5,12- | head -8
done
ls -la $OUT
