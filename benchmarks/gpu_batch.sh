#!/usr/bin/env bash
# Run a batch of experiments on a GPU machine, one lane per GPU, and pack what the batch wrote.
#
#   bash benchmarks/gpu_batch.sh "<lane 0 items>" ["<lane 1 items>" ...] [-- <override> ...]
#
# e.g. bash benchmarks/gpu_batch.sh "fig6:150 fig7:380" "fig4:560"
#      bash benchmarks/gpu_batch.sh "fig9+system=hisparse+where=b_over_k=4,8+point=c128:300 @bench_resolver:120"
#
# Lane i runs on GPU i (its own server and port; the lanes share the host), its items in order,
# each in a time box of its own (seconds after the last colon; default 540):
#   EXP[:SECS]                      python -m harness.reproduce --only EXP
#   EXP+system=S+where=k=v1,v2+point=c128[:SECS]
#                                   the same for a subset (--system / --where / --point)
#   EXP+ov=^rerun=2[:SECS]          adds a Hydra override to this item only; ^ stands for Hydra's +
#                                   (+ separates fields here): a new key, so new run ids
#   EXP+rerun-before=20261203T103000Z[:SECS]
#                                   measures again the finished runs measured before that UTC time
#                                   (same run ids; harness.reproduce --rerun-before); unpack the
#                                   batch's results with `python -m harness.unpack`, which replaces
#                                   a re-measured run's directory whole
#   EXP+any-gpu[:SECS]              an experiment of the H200 presets (*_h200) on another GPU
#                                   (harness.reproduce stops them elsewhere: their figures
#                                   compare H200 runs)
#   @NAME[:SECS]                    python benchmarks/NAME.py --out $OUT/NAME.json $DHS_ARGS_NAME
#   @NAME#K[:SECS]                  the same benchmark again with $DHS_ARGS_NAME_K, into NAME_K.json
# Overrides after -- go to every harness run of the batch.
#
# Before the lanes start, once per batch:
# - the wheels in .whl/ (what the GPU machine lacks, built here with e.g.
#   `pip wheel -w .whl hydra-core==1.3.2 "omegaconf>=2.3,<2.4" antlr4-python3-runtime==4.9.3`)
#   are installed into /tmp/site, so the machine's own CUDA torch is used;
# - Triton's kernel cache comes in from .triton_cache/ (unpack the $OUT/triton_cache.txz, or
#   .tgz where the machine has no xz, the previous batch returned over the repository root):
#   with an empty cache each system's first run compiles its kernels during its load and
#   measures 2x slow (results/cold_cache/);
# - the model weights are drawn once and cached in /tmp/dhs-weights (DHS_WEIGHT_CACHE): drawing
#   them takes most of a server's start-up (~35 s for glm53_h200); shared prompts are prefilled
#   once and cached in /tmp/dhs-prefixes (DHS_PREFIX_CACHE: 16 prompts of 125K tokens for the
#   DeepSeek-like preset);
# - each lane makes one throwaway serving run (DHS_PREWARM=0 skips it, about 30 s): a fresh
#   machine's first run is slow even with the cache carried in;
# - an interleaved group's per-system warm-up runs once per machine and configuration
#   (DHS_WARM_DIR, /tmp/dhs-warm): a later item of the batch that runs the same experiment's
#   systems again (another repeat, say), or a later call on the same held machine, skips it.
# DHS_PREDRAW="dsv41_h200 ...": those presets' weights are drawn into the weight cache on the CPU
# beside the batch's items (python -m systems.models.predraw, in a process session of its own,
# so it goes on after this call on a machine still held; log /tmp/dhs-predraw.log, returned as
# $OUT/predraw.log): the next call's first server of such a preset loads them in seconds
# (drawing dsv41_h200's 30 GB is minutes of a fresh machine's first start). Not beside
# items of that preset (their first server would draw them too) nor beside dsv41_h200 serving,
# whose pinned host backing leaves too little host memory for 30 GB more.
# Every run of the batch records one id (env.json's run_group; DHS_RUN_GROUP, default the time and
# host): the figures pair systems measured together by it. A call that resumes a group the
# previous call's time box cut, on the same machine still held (the device tool's lease says
# warm), may pass that call's id (printed first in its log) so the group's pairs stay paired.
# vmstat and nvidia-smi dmon log the host and each GPU's PCIe / SM / memory use to $OUT, so a
# lane slowed by another shows why.
# DHS_BENCH_CLIENT=1 also runs the client-overhead benchmark on two spare cores.
#
# Runs go to the repository's results/ (finished runs are skipped, so an item cut by its time box
# resumes in the next batch. On a machine still held, a batch first unpacks the archives of the
# batches before it there (kept in DHS_KEEP_BATCHES, default /tmp/dhs-batches; DHS_RESTORE=0
# skips it); a fresh machine knows only the tree, so unpack a batch's results.tgz into the tree
# before sending the next,
# since the copy of the tree the GPU machine receives is what says which runs are finished; run
# `make compact` and commit them first: the device tool copies at most 64 MiB of tracked and
# untracked files, and uncompressed request records can pass it). What
# comes back in $OUT: results.tgz (the finished run directories this batch wrote, plus the server
# logs and experiment summaries it changed; `python -m harness.unpack results.tgz` at the
# repository root (a re-measured run replaces its directory whole), then `make
# compact`), triton_cache.txz (.tgz without xz), lane<i>.log (each item's last 40 lines; the whole output of
# an experiment in reproduce-<experiment>.log), vmstat.log, dmon.log. results.tgz is re-packed every
# 30 s, so a call cut off by the device tool's limit still returns the runs finished before it.
# DHS_BATCH_SECONDS=N caps the items' time boxes so that the batch ends N seconds after it starts
# (set it to the call's limit less the machine's start-up when device time runs short: the
# tool's limit is then below the asked timeout); an item with no time left is skipped.
# Do not pair a serving lane with bench_resolver's part (a), which streams host memory: pass
# DHS_ARGS_bench_resolver="--skip a" there.
# The GPU machine's copy of the tree may carry a stale git HEAD: pass the commit the runs measure,
# e.g. DHS_GIT_COMMIT=$(git rev-parse HEAD) in the command, or env.json records the stale one.
case "${1:-}" in -h|--help)  # the header above is the usage
  sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
set -uo pipefail
: "${OUT:?set OUT to the folder that comes back}"
LANES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do LANES+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#LANES[@]} -gt 0 ] || { sed -n '2,40p' "$0"; exit 2; }

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
# the runs' servers load the random weights drawn by the first, and the prefills of shared
# prompts made by the first (systems/disk_cache.py)
export DHS_WEIGHT_CACHE="${DHS_WEIGHT_CACHE:-/tmp/dhs-weights}"
export DHS_PREFIX_CACHE="${DHS_PREFIX_CACHE:-/tmp/dhs-prefixes}"
# a system warmed up for a configuration is not warmed up again on this machine (harness.reproduce)
export DHS_WARM_DIR="${DHS_WARM_DIR:-/tmp/dhs-warm}"
export DHS_RUN_GROUP="${DHS_RUN_GROUP:-$(date -u +%Y%m%dT%H%M%SZ)-$(hostname)}"
export TRITON_CACHE_DIR=$PWD/.triton_cache; mkdir -p "$TRITON_CACHE_DIR" "$OUT"
echo "[gpu_batch] run group $DHS_RUN_GROUP; Triton cache: $(ls "$TRITON_CACHE_DIR" | wc -l) compiled kernels carried in"
START=$(date +%s)
# What earlier batches finished on this machine, while the device tool held it between calls:
# the tree each call copies in lacks their runs until they are unpacked here and committed, so
# a later item would measure them again (--rerun-before: every one). Their archives are kept in
# DHS_KEEP_BATCHES and their finished runs unpacked first, each named in the log (harness.unpack
# --runs-only). DHS_RESTORE=0 skips it: for a call that must measure again what an earlier one
# here finished (its archive lost, or its runs thrown away).
export DHS_KEEP_BATCHES="${DHS_KEEP_BATCHES:-/tmp/dhs-batches}"; mkdir -p "$DHS_KEEP_BATCHES"
if [ "${DHS_RESTORE:-1}" != 0 ]; then
  while read -r kept; do
    [ -n "$kept" ] || continue
    python3 -m harness.unpack --runs-only "$kept" 2>&1 | sed 's/^/[gpu_batch] an earlier batch here: /'
  done < <(ls -tr "$DHS_KEEP_BATCHES"/*.tgz 2>/dev/null)
fi
KEEP="$DHS_KEEP_BATCHES/$(date +%s)-$$.tgz"  # this batch's archive, for the next call here
MARK=$(mktemp)  # run directories newer than this come back (not whole experiment folders)
if [ -n "${DHS_PREDRAW:-}" ]; then
  # at low priority and on four threads: the batch's servers keep the host's other cores
  # shellcheck disable=SC2086  # a list of presets
  OMP_NUM_THREADS=4 setsid nice -n 10 python3 -m systems.models.predraw $DHS_PREDRAW > /tmp/dhs-predraw.log 2>&1 < /dev/null &
  echo "[gpu_batch] drawing the weights of $DHS_PREDRAW into $DHS_WEIGHT_CACHE beside the batch"
fi

pack() {  # what this batch wrote so far into $OUT/results.tgz (replaced whole, never half-written)
  # its finished run directories (an experiment writes to results/<its experiment_name>, fig4_more
  # to results/fig4) and failed ones (error.txt says why; a run cut by a time box has neither and
  # is left out: the next batch redoes it), the server-log folders (.server-*: a server that
  # failed to start leaves no run directory) or, where such a folder already existed, the logs
  # written in it, and the experiments' summaries; whole experiment folders would pass the 16 MB a
  # returned file may have. The list unchanged since the last pack: nothing to do (the final
  # pack forces one).
  local d rc new=() part="$OUT/results.tgz.part.$BASHPID"
  while read -r d; do
    [ -n "$d" ] || continue
    if [ -f "$d/summary.json" ] || [ -f "$d/error.txt" ] || [[ "$(basename "$d")" == .* ]]; then
      new+=("$d")
    fi
  done < <(find results -mindepth 2 -maxdepth 2 -type d -newer "$MARK" ! -name '*.superseded-*' 2>/dev/null | sort)
  # the loose files: server logs (depth 3, under a dot folder) and experiment summaries (depth
  # 2 only: a run's own summary.json, written before its folder qualified above, must not come
  # back without the rest of its run)
  while read -r d; do
    [ -n "$d" ] && new+=("$d")
  done < <({ find results -mindepth 3 -maxdepth 3 -type f -newer "$MARK" -path 'results/*/.*/*'
             find results -mindepth 2 -maxdepth 2 -type f -newer "$MARK" -name summary.json
           } 2>/dev/null \
     | grep -v -F -f <(printf '%s/\n' ${new[@]+"${new[@]}"} /no-such-folder) | sort)
  [ ${#new[@]} -gt 0 ] || return 1
  # the same list as last time and nothing in it written since (a profile moved into a run after
  # its summary, say): nothing to do
  if [ "${1:-}" != force ] && [ "${new[*]}" = "$(cat "$MARK.packed" 2>/dev/null)" ] \
     && [ -z "$(find "${new[@]}" -newer "$MARK.packed" -print -quit 2>/dev/null)" ]; then
    return 0
  fi
  # exit status 1: a file (a live server's log) changed while read; the archive is still whole
  tar czf "$part" "${new[@]}" 2>/dev/null; rc=$?
  if [ $rc -le 1 ]; then
    mv "$part" "$OUT/results.tgz" && echo "${new[*]}" > "$MARK.packed"
    cp "$OUT/results.tgz" "$KEEP.part" && mv "$KEEP.part" "$KEEP"
  fi
  rm -f "$part"
}

item_seconds() {  # an item's time box, capped by what DHS_BATCH_SECONDS leaves (0: no time left)
  local secs=$1 left
  if [ -n "${DHS_BATCH_SECONDS:-}" ]; then
    left=$((START + DHS_BATCH_SECONDS - $(date +%s) - 30))  # 30 s to summarize and pack
    [ "$left" -lt 30 ] && left=0
    [ "$left" -lt "$secs" ] && secs=$left
  fi
  echo "$secs"
}

rep() {  # experiment, seconds, harness.reproduce arguments
  # the whole output in $OUT/reproduce-<experiment>.log, its last 40 lines in the lane's log
  timeout "$2" python3 -m harness.reproduce --only "$1" --results results "${@:3}" 2>&1 \
    | tee -a "$OUT/reproduce-$1.log" | grep -v Warn | grep -v "^\[20" | tail -40
}

lane() {  # GPU index, "items", overrides
  local gpu=$1 items=$2 item spec exp secs b a n o x
  shift 2
  if [ "${DHS_PREWARM:-1}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=$gpu timeout 120 python3 -m harness.run experiment=hisparse_e2e system=adaptive_dhisparse \
      'workload.concurrency=[8]' workload.num_requests=16 +prewarm=1 results_dir=/tmp/prewarm$gpu \
      hydra.run.dir=/tmp/prewarm_hydra$gpu 2>&1 | grep -A3 "^system" | tail -1 | sed "s/^/[gpu$gpu] prewarm: /"
  fi
  for item in $items; do
    spec=${item%:*}; secs=${item##*:}
    if [ "$spec" = "$item" ]; then secs=540; fi  # no :SECS
    secs=$(item_seconds "$secs")
    if [ "$secs" = 0 ]; then echo "[lane $gpu] ${spec}: skipped, DHS_BATCH_SECONDS spent"; continue; fi
    echo "[lane $gpu] ${spec} (time box ${secs} s)"
    case "$spec" in
      @*) b=${spec#@}; n=${b/\#/_}; b=${b%%#*}; a="DHS_ARGS_$n"  # @NAME#2: DHS_ARGS_NAME_2
          CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" python3 benchmarks/$b.py --out $OUT/$n.json ${!a:-} 2>&1 \
            | grep -v Warn | tail -40 | sed "s/^/[gpu$gpu] /" ;;
      *)  exp=${spec%%+*}; local sel=() ovs=() kv=()
          IFS=+ read -ra kv <<< "${spec#"$exp"}"
          for x in "${kv[@]}"; do
            case "$x" in
              "") ;;
              ov=*) o=${x#ov=}; ovs+=("${o//^/+}") ;;
              *=*) sel+=("--${x%%=*}" "${x#*=}") ;;
              *) sel+=("--$x") ;;  # a flag
            esac
          done
          CUDA_VISIBLE_DEVICES=$gpu rep "$exp" "$secs" ${sel[@]+"${sel[@]}"} ${ovs[@]+"${ovs[@]}"} "$@" 2>&1 \
            | sed "s/^/[gpu$gpu] /" ;;
    esac
  done > $OUT/lane$gpu.log
}

vmstat -t 2 > $OUT/vmstat.log 2>&1 & MON=($!)
nvidia-smi dmon -s putm -d 2 -o T > $OUT/dmon.log 2>&1 & MON+=($!)
# every 30 s the finished runs so far are packed (at low priority, beside the lanes' runs): a
# call the device tool cuts off at its limit still returns them. When the batch's own last pack
# is due it is stopped: at once while it sleeps, after its tar when inside a pack (bash runs the
# trap once the command in hand ends), so two packs never write at once.
( trap 'exit 0' TERM; while :; do sleep "${DHS_PACK_EVERY:-30}" & wait $!; pack; done ) & PACKER=$!
renice -n 19 -p $PACKER >/dev/null 2>&1; ionice -c 3 -p $PACKER >/dev/null 2>&1
trap 'kill ${MON[*]} $PACKER 2>/dev/null' EXIT  # also when the machine's time limit ends the script
PIDS=()
for i in "${!LANES[@]}"; do
  [ -z "${LANES[$i]// /}" ] && continue
  lane "$i" "${LANES[$i]}" "$@" & PIDS+=($!)
done
if [ "${DHS_BENCH_CLIENT:-0}" = 1 ]; then
  n=$(nproc); timeout 240 python3 benchmarks/bench_client.py --client-cpu $((n-1)) --server-cpu $((n-2)) \
    --event-loops asyncio --repeats 1 --quiet-wait-s 5 --out-dir $OUT/bench_client > $OUT/bench_client.log 2>&1
  tail -40 $OUT/bench_client.log; (cd $OUT && tar czf bench_client.tgz bench_client && rm -rf bench_client)
fi
wait "${PIDS[@]}"; kill ${MON[*]} 2>/dev/null
for i in "${!LANES[@]}"; do cat $OUT/lane$i.log 2>/dev/null; done

python3 -m harness.summaries --results results >/dev/null 2>&1
kill -TERM $PACKER 2>/dev/null; wait $PACKER 2>/dev/null; rm -f "$OUT"/results.tgz.part.*
pack force && du -h $OUT/results.tgz
[ -f /tmp/dhs-predraw.log ] && cp /tmp/dhs-predraw.log "$OUT/predraw.log"
# xz: the cache gzip'd passed 20 MB of the 64 MiB a device call may carry in (xz: ~3 MB)
if command -v xz >/dev/null; then
  tar cf - .triton_cache | xz -6 -T0 > $OUT/triton_cache.txz && du -h $OUT/triton_cache.txz
else
  tar czf $OUT/triton_cache.tgz .triton_cache && du -h $OUT/triton_cache.tgz
fi
ls -la $OUT
