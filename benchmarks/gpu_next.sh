#!/usr/bin/env bash
# The next device session, in parts of one call each (about 9 min apiece), in priority order:
#   DHS_GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_next.sh A   (carry .whl)
# A: Fig. 8c copy-grid sweep (does plain decode want more copy programs?), Fig. 6 both arms
#    (M = 4.2 GiB), Fig. 11 profiles.        B: Fig. 7, blocks 4 / 6 / 8 at one commit.
# C: Fig. 4 (five systems).                   D: Fig. 1.     E: Fig. 9.     F: Fig. 5.
# Runs go to the repository's results/ (finished runs are skipped, so a part cut by its time box
# resumes in the next call) and come back as $OUT/results.tgz; unpack it over results/ here.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
mkdir -p $OUT
rep() {  # experiment, seconds
  timeout "$2" python3 -m harness.reproduce --only "$1" --results results 2>&1 | grep -v Warn | grep -v "^\[20" | tail -14
}
case "${1:-A}" in
  A) timeout 80 python3 benchmarks/bench_resolver.py --skip a --sweep-copy-programs --out $OUT/fig8bc_sweep.json 2>&1 | grep -v Warn | tail -22
     rep fig6 280; rep fig11 170; EXPS="fig6 fig11" ;;
  B) rep fig7 540; EXPS="fig7" ;;
  C) rep fig4 540; EXPS="fig4" ;;
  D) rep fig1 540; EXPS="fig1" ;;
  E) rep fig9 540; EXPS="fig9" ;;
  F) rep fig5 540; EXPS="fig5" ;;
esac
python3 -m harness.summaries --results results >/dev/null 2>&1
tar czf $OUT/results.tgz $(for e in $EXPS; do echo results/$e; done) $(ls -d results/fig6/summary.json results/fig7/summary.json 2>/dev/null)
ls -la $OUT
