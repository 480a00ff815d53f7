#!/usr/bin/env bash
# Nsight Compute profiles of single kernel calls (one device call; no wheels needed):
#   bash benchmarks/gpu_ncu.sh "name|batch|misses|kw" ...                  (the resolver)
#   NCU_KERNEL=topk bash benchmarks/gpu_ncu.sh "name|batch|q|context" ...  (the indexer's top-k)
# e.g. bash benchmarks/gpu_ncu.sh "b8m77|8|77|" "b8m0_early|8|0|early_copy=True+copy_programs_per_request=4"
#      NCU_KERNEL=topk bash benchmarks/gpu_ncu.sh "b1|1|1|16384" "b32|32|1|16384"
# For each case (3 launches after 2 warm-ups, caches flushed, clocks left alone, warp stalls sampled
# every 32 cycles): the details page and the per-SASS-instruction samples as CSV, the kernel's cubin,
# and benchmarks/ncu_lines.py's per-source-line summary with the share of each of the kernel's
# phases, all in $OUT/ncu.tgz (+ the summaries as .txt).
case "${1:-}" in -h|--help)  # the header above is the usage
  sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
set -uo pipefail
export PYTHONPATH=$PWD/benchmarks:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_ncu: no ncu on this machine"; exit 1; }
export PATH=$PATH:/usr/local/cuda/bin
$NCU --version | tail -1
KERNEL=${NCU_KERNEL:-resolver}
case $KERNEL in
  resolver) REGEX=_resolver_kernel; SRC=resolver.py ;;
  topk) REGEX=_topk_kernel; SRC=topk.py ;;
  *) echo "gpu_ncu: NCU_KERNEL must be resolver or topk, not $KERNEL"; exit 2 ;;
esac
for case in "$@"; do
  IFS='|' read -r name a b c <<< "$case"
  d=$OUT/ncu/$name
  if [ "$KERNEL" = topk ]; then
    echo "== $name: batch $a, $b queries each, context $c"
    cmd=(python3 benchmarks/ncu_topk.py --batch "$a" --q "$b" --context "$c" --calls 5 --dump-cubin $d.cubin)
  else
    echo "== $name: batch $a, $b misses, ${c:-defaults}"
    cmd=(python3 benchmarks/ncu_resolver.py --batch "$a" --misses "$b" --calls 5 --kw "$c" --dump-cubin $d.cubin)
  fi
  timeout 240 $NCU --clock-control none --cache-control all --set full --import-source no --warp-sampling-interval 0 \
    --kernel-name regex:$REGEX --launch-skip 2 --launch-count 3 -f -o $d "${cmd[@]}" \
    2>&1 | grep -v "^==PROF==" | grep -v "ctc__" | grep -v "^$" | tail -3
  $NCU -i $d.ncu-rep --page details --csv > ${d}_details.csv 2>&1
  $NCU -i $d.ncu-rep --page source --csv --print-source sass > ${d}_sass.csv 2>&1
  rm -f $d.ncu-rep
  grep -E '"(Duration|Registers Per Thread)"' ${d}_details.csv | cut -d, -f1,12- | head -6
  python3 benchmarks/ncu_lines.py ${d}_sass.csv $d.cubin --file $SRC --top 45 \
    --ranges phases \
    > $OUT/ncu_${name}_lines.txt 2>&1
  head -1 $OUT/ncu_${name}_lines.txt; grep "^range" $OUT/ncu_${name}_lines.txt
done
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $OUT/ncu
ls -la $OUT
