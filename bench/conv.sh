#!/usr/bin/env bash
# The convolution measurement of BENCHMARKS.md ("Convolution kernels"): ember_bench's conv/ rows,
# their PyTorch twins (NCHW and channels_last) and conv_dnnl (oneDNN beside Ember's conv2d in one
# process), at 1 and 2 threads, REPS times each, the three programs interleaved so that a busy
# phase of the machine hits all of them; each program holds /tmp/ember-build.lock while it runs.
#
#   bench/conv.sh [BUILD_DIR]   env: REPS=3  BENCH_TIME=0.5  BENCH_PYTHON=python3 (torch 2.x)
#                                    BENCH_OUT=BUILD_DIR/bench-conv  BENCH_THREADS="1 2"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
OUT=${BENCH_OUT:-$BUILD/bench-conv}
PY=${BENCH_PYTHON:-python3}
LOCK=(flock /tmp/ember-build.lock)
mkdir -p "$OUT"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
for rep in $(seq 1 "${REPS:-3}"); do
  for threads in ${BENCH_THREADS:-1 2}; do
    ENV=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" EMBER_NUM_THREADS="$threads")
    [ "$threads" -gt 1 ] && ENV+=(OMP_WAIT_POLICY=PASSIVE)
    echo "--- rep $rep, $threads thread(s), load $(uptime | sed 's/.*load average: //')"
    "${LOCK[@]}" env "${ENV[@]}" "$BUILD/bench/ember_bench" --threads "$threads" \
      --time "${BENCH_TIME:-0.5}" --filter conv/ --json "$OUT/ember-t$threads-r$rep.json" |
      sed 's/^/ember   /'
    "${LOCK[@]}" env "${ENV[@]}" "$PY" bench/pytorch/bench_torch.py --threads "$threads" \
      --time "${BENCH_TIME:-0.5}" --filter conv/ --json "$OUT/torch-t$threads-r$rep.json" \
      2>/dev/null | sed 's/^/pytorch /'
    "${LOCK[@]}" env "${ENV[@]}" "$BUILD/bench/conv_dnnl" --threads "$threads" \
      --json "$OUT/dnnl-t$threads-r$rep.json" | sed 's/^/dnnl    /'
  done
done
