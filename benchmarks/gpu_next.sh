#!/usr/bin/env bash
# Device calls, in parts of one call each (about 9 min apiece):
#   DHS_GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_next.sh <part> [overrides]   (carry .whl)
# Plan for the next session. Since the last runs (commit eff3e9e): CUDA graphs are captured at a
# key's 3rd use (engine.cuda_graph_capture_after; capturing every passing batch size took 69-71%
# of the hierarchy's engine time at C128), and the output caps keep the paper's input : output
# ratios (fig4 family 320, fig5 family 128, fig1 1,024), so every experiment reruns (new run ids;
# the figures use the newest output cap only). Runs are about 5x longer than at a 64-token cap.
#   1. nvidia-h200-x2: L "fig4+system=hisparse+system=adaptive_hisparse+system=adaptive_dhisparse:560"
#                        "fig4+system=resident+system=resident_dflash2:330 fig6:230"
#   2. nvidia-h200-x2: L "fig5:560" "fig9+point=c128:560"
#   3. then fig4_more (C32, C256), fig9 C8, fig9_dsv, fig7, fig1, fig11, and the resolver's scan
#      tile and copy pipelining (issue 4): DHS_ARGS_bench_resolver="--check --sweep-scan
#      1024,2048,4096 --sweep-copy-stages 1,2,3" with a lane item @bench_resolver:240 (the
#      stages sweep checks each depth's result against the plain loop: cp.async from UVA memory).
#   The index scan runs at ~430 GB/s at batch 128 (results/attention/h200-mma.json): the lane item
#   @bench_attention:100 now also sweeps its tile (rows of history per program x warps).
#   The DeepSeek-like hierarchy runs (fig5, fig9_dsv) ran eagerly: their capture failed on the
#   H200 ("operation failed due to a previous error during capture"). Likely cause, fixed since:
#   finish_forward joined the follower-prefetch stream although no DeepSeek-like step forks it
#   (no followers), and a capturing stream waiting on a stream outside the capture invalidates
#   it. Verify first, on one GPU (capture failures now log their traceback):
#     python3 benchmarks/check_cuda_graph.py --model dsv41_mini --systems resident,hisparse \
#       --context 4096 --new-tokens 8 --out $OUT/graph_dsv.json
#   Check each call's engine time split in REPRODUCTION.md (decode / capture / handoff / other).
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
mkdir -p $OUT
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
     lane 0 "${LANES[0]}" "$@" &
     lane 1 "${LANES[1]}" "$@" &
     if [ "${DHS_BENCH_CLIENT:-0}" = 1 ]; then
       n=$(nproc); timeout 240 python3 benchmarks/bench_client.py --client-cpu $((n-1)) --server-cpu $((n-2)) \
         --event-loops asyncio --repeats 1 --quiet-wait-s 5 --out-dir $OUT/bench_client > $OUT/bench_client.log 2>&1
       tail -40 $OUT/bench_client.log; (cd $OUT && tar czf bench_client.tgz bench_client && rm -rf bench_client)
     fi
     wait; cat $OUT/lane0.log $OUT/lane1.log ;;
esac
python3 -m harness.summaries --results results >/dev/null 2>&1
[ -n "$EXPS" ] && tar czf $OUT/results.tgz $(for e in $EXPS; do echo results/$e; done) $(ls -d results/fig6/summary.json results/fig7/summary.json 2>/dev/null)
ls -la $OUT
