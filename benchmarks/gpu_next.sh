#!/usr/bin/env bash
# Device calls, in parts of one call each (about 9 min apiece):
#   DHS_GIT_COMMIT=<commit, a literal from this machine> bash benchmarks/gpu_next.sh <part> [overrides]   (carry .whl and .triton_cache)
# Plan for the next session (written at the end of the 2026-11-30 evening session).
#   State: every number of REPRODUCTION.md is measured; issue 8 is closed. Issue 4's resolver speed
#   targets are met at the new defaults (results/fig8/summary.json, one run at f995b44): batch 8 / 160
#   no miss 16.5 / 33.3 us, 77 misses 28.5 / 218.5 us (paper 18.7 / 36.9 / 29.3 / 243.3), with the
#   early copy and roles by program id for small batches (results/fig8/pid_roles_2be2deb-h200.json).
#   The host path (44.2 GB/s against 50) is out of this machine's reach for 656-byte rows: streaming
#   pinned reads 50.7 GB/s, scattered whole-line rows 47.6-49.1, 656-byte rows 39.4-44.4 whatever the
#   host row stride (results/fig8/host_stride_8755145-h200.json).
#   Only nvidia-h200 (one GPU) may be lent: L "<items>" "" runs one lane on GPU 0.
#   The tracked tree is ~57 MB against the device's 64 MiB: `python -m harness.compact --prune-unused
#   --prune-traces` (commit first) and `make compact` after every unpack.
#   The first serving run on a fresh machine is slow (results/cold_cache/: 442-564 tok/s against
#   1,000-1,230 for the same run a minute later; 736 with the Triton cache carried in). Each call now
#   carries .triton_cache in and back ($OUT/triton_cache.tgz) and each lane of part L starts with a
#   throwaway run. Runs committed before that which were the first of their (model, system) in their
#   call are listed in results/cold_cache/first_runs.json (104 of 322): re-run the ones a claim
#   rests on (Fig. 1 / Fig. 4 C128 ratios) in calls with the prewarm before trusting their spread.
#   Tools: benchmarks/gpu_ncu.sh "name|batch|misses|kw" profiles resolver calls under Nsight Compute
#   (per-source-line warp-stall samples; the copy programs' polling dominates the samples, so read
#   the resolver's ranges relative to each other).
#   Never pair a serving lane with bench_resolver's part (a) (host streaming): use --skip a there.
#   The L part logs vmstat and nvidia-smi dmon (PCIe, SM, memory per GPU) to $OUT.
# Parts: A: kernels + graph check + Fig. 8 copy-grid sweep + Fig. 6.  B: Fig. 6, 7, 11.  C: Fig. 4.
# D: Fig. 1.  E: Fig. 9.  F: Fig. 5.  K: attention kernels and graph replay only.
# L: lanes, one per GPU of an nvidia-h200-x2 (twice the runs per device-second; each lane has its
#    own GPU, server and port, the host is shared), e.g.
#      bash benchmarks/gpu_next.sh L "fig6:150 fig7:380" "fig4:560"
#    Each lane runs its experiments in order with per-experiment time boxes (seconds); an item
#    @name:secs runs benchmarks/name.py --out $OUT/name.json $DHS_ARGS_name instead; an experiment
#    item may pick a subset: fig9+system=hisparse+where=b_over_k=4,8+point=c128:300, and add
#    overrides of its own: fig4+point=c128+ov=^rerun=2:170 (^ = Hydra's +; a new key, new run ids).
#    DHS_BENCH_CLIENT=1 also runs the client-overhead benchmark on two spare cores.
# An override after the part letter (after the lanes for L) is appended to every harness run.
# Runs go to the repository's results/ (finished runs are skipped, so a part cut by its time box
# resumes in the next call) and come back as $OUT/results.tgz; unpack it over the repo root here.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
# every run of this call records it in env.json (device_call): the figures pair systems by it
export DHS_DEVICE_CALL="${DHS_DEVICE_CALL:-$(date -u +%Y%m%dT%H%M%SZ)-$(hostname)}"
mkdir -p $OUT
# Triton's kernel cache travels from call to call (carry .triton_cache; unpack the returned
# $OUT/triton_cache.tgz over the repo root here): every call starts on a fresh machine, and with
# an empty cache the first run of each system compiles its kernels during its load
# (results/cold_cache/: 564 against 1,229 tok/s for the same run a minute later)
export TRITON_CACHE_DIR=$PWD/.triton_cache; mkdir -p $TRITON_CACHE_DIR
echo "[gpu_next] Triton cache: $(ls $TRITON_CACHE_DIR | wc -l) compiled kernels carried in"
MARK=$(mktemp)  # run directories newer than this come back (not whole experiment folders)
PART="${1:-A}"; shift || true
rep() {  # experiment, seconds
  timeout "$2" python3 -m harness.reproduce --only "$1" --results results "${@:3}" 2>&1 | grep -v Warn | grep -v "^\[20" | tail -40
}
case "$PART" in
  A) # a check that fails (or does not finish) switches the runs below to the safe path
     SAFE=()
     timeout 75 python3 benchmarks/bench_attention.py --out $OUT/attention.json > $OUT/attention.log 2>&1 \
       || SAFE+=(model.attention_impl=reference)
     grep -v Warn $OUT/attention.log | tail -18
     timeout 90 python3 benchmarks/check_cuda_graph.py --systems hisparse,adaptive_dhisparse --context 2048 --new-tokens 24 --out $OUT/cuda_graph_check.json > $OUT/graph.log 2>&1 \
       || SAFE+=(engine.disable_cuda_graph=true)
     grep -v Warn $OUT/graph.log | tail -3
     echo "[gpu_next] runs below add: ${SAFE[*]:-nothing}"
     timeout 160 python3 benchmarks/bench_resolver.py --sweep-copy-programs --out $OUT/fig8_sweep.json 2>&1 | grep -v Warn | tail -30
     rep fig6 240 ${SAFE[@]+"${SAFE[@]}"}; EXPS="fig6" ;;
  K) timeout 100 python3 benchmarks/bench_attention.py --reps 20 --out $OUT/attention.json 2>&1 | grep -v Warn | tail -30
     for impl in triton triton_mma; do
       timeout 100 python3 benchmarks/check_cuda_graph.py --systems hisparse,adaptive_dhisparse --context 2048 \
         --new-tokens 24 --out $OUT/graph_$impl.json model.attention_impl=$impl 2>&1 | grep -v Warn | tail -3
     done
     # what a speculative round costs against a plain step (paper: 2.2x at block 4), by phase
     for sys in resident resident_dflash2; do
       timeout 100 python3 benchmarks/bench_decode_step.py model=glm53_mini system=$sys --batches 8,32 \
         --context 4096 --steps 20 --kv-pool-gib 20 --phases --out $OUT/step_$sys.json 2>&1 | grep -v Warn | tail -5
     done
     # issue 3's client target on a quiet 16-core host: 1000 streams, the issue point and the
     # capacity point (8 ms gaps, 8 tokens per event, staggered), two repeats each
     n=$(nproc); mkdir -p $OUT/bench_client
     timeout 200 python3 benchmarks/bench_client.py --streams 1000 --capacity-itl-ms 8 \
       --capacity-tokens-per-chunk 1,8 --capacity-starts staggered --repeats 2 --event-loops asyncio \
       --client-cpu $((n-1)) --server-cpu $((n-2)) --quiet-wait-s 10 --out-dir $OUT/bench_client 2>&1 \
       | grep -v Warn | tail -8
     (cd $OUT && tar czf bench_client.tgz bench_client && rm -rf bench_client)
     EXPS="" ;;
  B) rep fig6 120 "$@"; rep fig7 330 "$@"; rep fig11 120 "$@"; EXPS="fig6 fig7 fig11" ;;
  C) rep fig4 540 "$@"; EXPS="fig4" ;;
  D) rep fig1 540 "$@"; EXPS="fig1" ;;
  E) rep fig9 540 "$@"; EXPS="fig9" ;;
  F) rep fig5 540 "$@"; EXPS="fig5" ;;
  L) lane() {  # GPU index, "exp:seconds ..."
       local gpu=$1 item; shift
       [ -z "${1// /}" ] && return 0
       if [ "${DHS_PREWARM:-1}" = 1 ]; then
         # a throwaway run first: the first serving run on a fresh machine is slow even with the
         # Triton cache carried in (results/cold_cache/: 736 against 1,137 tok/s; 442-564 without
         # the cache), so no measured run is a call's first (DHS_PREWARM=0 skips it, ~30 s)
         CUDA_VISIBLE_DEVICES=$gpu timeout 120 python3 -m harness.run experiment=hisparse_e2e system=adaptive_dhisparse \
           'workload.concurrency=[8]' workload.num_requests=16 +prewarm=1 results_dir=/tmp/prewarm$gpu \
           hydra.run.dir=/tmp/prewarm_hydra$gpu 2>&1 | grep -A3 "^system" | tail -1 | sed "s/^/[gpu$gpu] prewarm: /"
       fi
       for item in $1; do
         echo "[lane $gpu] ${item%%:*}"
         case "$item" in
           @*) b=${item%%:*}; b=${b#@}  # a benchmark script: @bench_attention:90
               a="DHS_ARGS_$b"  # its extra arguments, e.g. DHS_ARGS_bench_resolver="--skip a"
               CUDA_VISIBLE_DEVICES=$gpu timeout "${item##*:}" python3 benchmarks/$b.py --out $OUT/$b.json ${!a:-} 2>&1 \
                 | grep -v Warn | tail -40 | sed "s/^/[gpu$gpu] /" ;;
           *) # exp[+system=S][+where=k=v1,v2][+point=c128]:secs -> harness.reproduce --system S ...
              # (+ov=<hydra override> adds an override to this item only; ^ stands for Hydra's +,
              #  which separates fields here: ov=^rerun=2 -> +rerun=2, a new key that forces a rerun)
              spec=${item%:*}; exp=${spec%%+*}; sel=(); ovs=(); IFS=+ read -ra kv <<< "${spec#"$exp"}"
              for x in "${kv[@]}"; do
                case "$x" in "") ;; ov=*) o=${x#ov=}; ovs+=("${o//^/+}") ;; *) sel+=("--${x%%=*}" "${x#*=}") ;; esac
              done
              CUDA_VISIBLE_DEVICES=$gpu rep "$exp" "${item##*:}" ${sel[@]+"${sel[@]}"} ${ovs[@]+"${ovs[@]}"} "${@:2}" 2>&1 | sed "s/^/[gpu$gpu] /" ;;
         esac
       done > $OUT/lane$gpu.log
     }
     LANES=("$1" "$2"); shift 2
     EXPS=$(for l in "${LANES[@]}"; do for i in $l; do case "$i" in @*) ;; *) i=${i%%:*}; echo -n "${i%%+*} " ;; esac; done; done | tr ' ' '\n' | sort -u | tr '\n' ' ')
     # the host both lanes share: CPU (vmstat) and each GPU's PCIe / SM / memory use (dmon), so a
     # lane slowed by the other shows why (results of a lane beside host-heavy work differed by 30%)
     vmstat -t 2 > $OUT/vmstat.log 2>&1 & MON=($!)
     nvidia-smi dmon -s putm -d 2 -o T > $OUT/dmon.log 2>&1 & MON+=($!)
     trap 'kill ${MON[*]} 2>/dev/null' EXIT  # also when the call's time limit ends the script
     lane 0 "${LANES[0]}" "$@" & L0=$!
     lane 1 "${LANES[1]}" "$@" & L1=$!
     if [ "${DHS_BENCH_CLIENT:-0}" = 1 ]; then
       n=$(nproc); timeout 240 python3 benchmarks/bench_client.py --client-cpu $((n-1)) --server-cpu $((n-2)) \
         --event-loops asyncio --repeats 1 --quiet-wait-s 5 --out-dir $OUT/bench_client > $OUT/bench_client.log 2>&1
       tail -40 $OUT/bench_client.log; (cd $OUT && tar czf bench_client.tgz bench_client && rm -rf bench_client)
     fi
     wait $L0 $L1; kill ${MON[*]} 2>/dev/null; cat $OUT/lane0.log $OUT/lane1.log 2>/dev/null ;;
esac
python3 -m harness.summaries --results results >/dev/null 2>&1
# only what this call wrote: its run directories (an experiment writes to results/<its
# experiment_name>, fig4_more to results/fig4) and the server logs; whole experiment folders
# passed the 16 MB a returned file may have
NEW=$(find results -mindepth 2 -maxdepth 2 -type d -newer $MARK | sort)
# and the files a call changed inside folders that already existed: server logs (a server that
# failed to start leaves no run directory) and the experiments' summaries
NEW="$NEW $(find results -mindepth 2 -maxdepth 3 -type f -newer $MARK \( -name server.log -o -name summary.json \) \
  | grep -v -F -f <(echo "$NEW" | sed '/^$/d;s|$|/|') | sort)"
[ -n "${NEW//[[:space:]]/}" ] && tar czf $OUT/results.tgz $NEW && du -h $OUT/results.tgz
tar czf $OUT/triton_cache.tgz .triton_cache && du -h $OUT/triton_cache.tgz
ls -la $OUT
