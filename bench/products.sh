#!/usr/bin/env bash
# The products table of issue 48: ember_bench's products/ rows (bench/products.cpp) once per
# product library (EMBER_BLAS=openblas, blis, dnnl, and unset: "auto", the layer's own choice for
# this CPU) and their PyTorch twins (torch.mm, MKL), at 1 and 2 threads, REPS times each, all
# interleaved so that a busy phase of the machine hits every column; each program holds
# /tmp/ember-build.lock while it runs. Then bench/products_table.py prints one markdown table per
# thread count: GFLOP/s medians over the reps per library, and auto against torch.
#
#   bench/products.sh [BUILD_DIR]   env: REPS=3  BENCH_TIME=0.5  BENCH_PYTHON=python3 (torch 2.x)
#                                        BENCH_OUT=BUILD_DIR/bench-products  BENCH_THREADS="1 2"
#                                        BENCH_WAIT_POLICY=PASSIVE
# Above one thread OMP_WAIT_POLICY is PASSIVE, as in bench/conv.sh; BENCH_WAIT_POLICY= (empty)
# leaves it unset, OpenMP's default (spin, then sleep). It matters for the small products at 2
# threads: under PASSIVE every parallel product wakes a sleeping thread, which costs torch.mm most
# of its rate below about 2^21 multiply-adds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
OUT=${BENCH_OUT:-$BUILD/bench-products}
PY=${BENCH_PYTHON:-python3}
TIME=${BENCH_TIME:-0.5}
LOCK=(flock /tmp/ember-build.lock)
UNSET=(-u OMP_WAIT_POLICY)  # env's options go before its assignments
mkdir -p "$OUT"
rm -f "$OUT"/*-t*-r*.json
# a copy of ember_bench, so that a rebuild of the shared build directory during the run (another
# build takes the lock between two programs) cannot change the program between reps
"${LOCK[@]}" cp "$BUILD/bench/ember_bench" "$OUT/ember_bench"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
for rep in $(seq 1 "${REPS:-3}"); do
  for threads in ${BENCH_THREADS:-1 2}; do
    ENV=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" EMBER_NUM_THREADS="$threads")
    WAIT=${BENCH_WAIT_POLICY-PASSIVE}
    [ "$threads" -gt 1 ] || WAIT=
    [ -n "$WAIT" ] && ENV+=(OMP_WAIT_POLICY="$WAIT")
    echo "--- rep $rep, $threads thread(s), OMP_WAIT_POLICY ${WAIT:-unset}, load $(uptime | sed 's/.*load average: //')"
    for lib in auto openblas blis dnnl; do
      if [ "$lib" = auto ]; then BLAS=(-u EMBER_BLAS); else BLAS=(EMBER_BLAS="$lib"); fi
      "${LOCK[@]}" env "${UNSET[@]}" "${BLAS[@]}" "${ENV[@]}" "$OUT/ember_bench" --threads "$threads" \
        --time "$TIME" --filter products/ --json "$OUT/$lib-t$threads-r$rep.json" 2>&1 |
        sed "s/^/$(printf '%-9s' "$lib")/"
    done
    "${LOCK[@]}" env "${UNSET[@]}" "${ENV[@]}" "$PY" bench/pytorch/bench_torch.py --threads "$threads" \
      --time "$TIME" --filter products/ --json "$OUT/torch-t$threads-r$rep.json" \
      2>/dev/null | sed 's/^/torch    /'
  done
done
echo "load at the end: $(uptime | sed 's/.*load average: //')"
echo
python3 bench/products_table.py "$OUT"
