#!/usr/bin/env bash
# Nsight Compute profiles of resolver calls (one device call; no wheels needed):
#   bash benchmarks/gpu_ncu.sh "name|batch|misses|kw" ...
# e.g. bash benchmarks/gpu_ncu.sh "b8m77|8|77|" "b8m0_early|8|0|early_copy=True+copy_programs_per_request=4"
# For each case (3 launches after 2 warm-ups, caches flushed, clocks left alone, warp stalls sampled
# every 32 cycles): the details page and the per-SASS-instruction samples as CSV, the kernel's cubin,
# and benchmarks/ncu_lines.py's per-source-line summary, all in $OUT/ncu.tgz (+ the summaries as .txt).
set -uo pipefail
export PYTHONPATH=$PWD/benchmarks:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_ncu: no ncu on this machine"; exit 1; }
export PATH=$PATH:/usr/local/cuda/bin
$NCU --version | tail -1
for case in "$@"; do
  IFS='|' read -r name batch misses kw <<< "$case"
  echo "== $name: batch $batch, $misses misses, ${kw:-defaults}"
  d=$OUT/ncu/$name
  timeout 240 $NCU --clock-control none --cache-control all --set full --import-source no --warp-sampling-interval 0 \
    --kernel-name regex:_resolver_kernel --launch-skip 2 --launch-count 3 -f -o $d \
    python3 benchmarks/ncu_resolver.py --batch $batch --misses $misses --calls 5 --kw "$kw" --dump-cubin $d.cubin \
    2>&1 | grep -v "^==PROF==" | grep -v "ctc__" | grep -v "^$" | tail -3
  $NCU -i $d.ncu-rep --page details --csv > ${d}_details.csv 2>&1
  $NCU -i $d.ncu-rep --page source --csv --print-source sass > ${d}_sass.csv 2>&1
  rm -f $d.ncu-rep
  grep -E '"(Duration|Registers Per Thread)"' ${d}_details.csv | cut -d, -f1,12- | head -6
  python3 benchmarks/ncu_lines.py ${d}_sass.csv $d.cubin --top 45 \
    --ranges phases \
    > $OUT/ncu_${name}_lines.txt 2>&1
  head -1 $OUT/ncu_${name}_lines.txt; grep "^range" $OUT/ncu_${name}_lines.txt
done
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $OUT/ncu
ls -la $OUT
