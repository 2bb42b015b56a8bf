#!/usr/bin/env bash
# Ember vs PyTorch, side by side: installs Debian's python3-torch when missing (never linked),
# builds ember_bench in Release, runs every workload of both sides at 1 and 2 threads and prints
# one table. Each family of workloads (op/, overhead/, sgemm/, nw/) runs in its own process, in
# increasing size, and each transformer step alone, so the max RSS reported is that workload's
# (for the smaller members of a family, an upper bound).
#
#   bench/run.sh [BUILD_DIR] [ember_bench selection args, e.g. --filter nw/]
#   env: BENCH_THREADS="1 2"  BENCH_TIME=1.0 (seconds per workload)  BENCH_OUT=BUILD_DIR/bench-results
#        BENCH_SKIP_BUILD=1 (use the ember_bench already built)
#        BENCH_PYTHON=venv/bin/python (another torch)  BENCH_WAIT_POLICY=PASSIVE (OMP_WAIT_POLICY)
#        BENCH_EMBER_ARGS="--matmul-precision medium" and BENCH_TORCH_ARGS="--autocast" (or
#        "--matmul-precision medium"): bfloat16 products, given to every program of its side
#        BENCH_RUN=0|1: workload 4, the whole copy-task run (examples/transformer_copy at its
#        defaults against bench/pytorch/copy_task.py, ~5-10 min per side and thread count);
#        on by default when no selection args are given, off otherwise
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
shift || true
SELECT=("$@")
read -r -a EMBER_ARGS <<<"${BENCH_EMBER_ARGS:-}"
read -r -a TORCH_ARGS <<<"${BENCH_TORCH_ARGS:-}"
OUT=${BENCH_OUT:-$BUILD/bench-results}
# BENCH_PYTHON: another interpreter with torch (a venv with a current torch from PyPI, say);
# without it, Debian's.
PY=${BENCH_PYTHON:-/usr/bin/python3}

if [ -z "${BENCH_PYTHON:-}" ] && ! "$PY" -c "import torch" 2>/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "installing python3-torch (the reference side; never linked)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-torch
fi
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
[ -n "${BENCH_SKIP_BUILD:-}" ] ||
  cmake --build "$BUILD" -j"${JOBS:-2}" --target ember_bench transformer_copy
BIN="$BUILD/bench/ember_bench"

rm -rf "$OUT"
mkdir -p "$OUT"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
# The units: one process per family (its names as --exact arguments), one per transformer step.
mapfile -t UNITS < <("$BIN" --list "${SELECT[@]}" | awk '
  { family = $0; sub(/\/.*/, "", family) }
  family == "transformer" { print "--exact\t" $0; next }
  { units[family] = units[family] "--exact\t" $0 "\t"; if (!(family in seen)) { seen[family]; order[++n] = family } }
  END { for (i = 1; i <= n; ++i) print units[order[i]] }')
for threads in ${BENCH_THREADS:-1 2}; do
  ENV=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" EMBER_NUM_THREADS="$threads")
  # OpenMP's wait policy: its default (threads spin a while between parallel regions) unless
  # BENCH_WAIT_POLICY says otherwise. PASSIVE makes every region cost ~40 us on a 2-vCPU VM, for
  # PyTorch as much as for Ember (BENCHMARKS.md, "How the figures are taken").
  [ -n "${BENCH_WAIT_POLICY:-}" ] && ENV+=(OMP_WAIT_POLICY="$BENCH_WAIT_POLICY")
  echo "--- $threads thread(s)"
  i=0
  for unit in "${UNITS[@]}"; do
    i=$((i + 1))
    IFS=$'\t' read -r -a ARGS <<<"$unit"
    # Alternate the sides unit by unit, so a burst of load on the machine hits both.
    env "${ENV[@]}" "$BIN" --threads "$threads" --time "${BENCH_TIME:-1.0}" "${ARGS[@]}" \
      "${EMBER_ARGS[@]}" --json "$OUT/ember-t$threads-$i.json" | sed 's/^/ember   /'
    env "${ENV[@]}" "$PY" bench/pytorch/bench_torch.py --threads "$threads" \
      --time "${BENCH_TIME:-1.0}" "${ARGS[@]}" "${TORCH_ARGS[@]}" \
      --json "$OUT/torch-t$threads-$i.json" |
      sed 's/^/pytorch /'
  done
  if [ "${BENCH_RUN:-$([ ${#SELECT[@]} -eq 0 ] && echo 1 || echo 0)}" = 1 ]; then
    echo "ember   workload 4: transformer_copy at its defaults ($threads thread(s))"
    env "${ENV[@]}" "$BUILD/examples/transformer_copy" --threads "$threads" "${EMBER_ARGS[@]}" \
      --out "$OUT/run-ember-t$threads" | grep -E "^epoch|accuracy|^wrote" | sed 's/^/ember   /'
    echo "pytorch workload 4: bench/pytorch/copy_task.py ($threads thread(s))"
    env "${ENV[@]}" "$PY" bench/pytorch/copy_task.py --threads "$threads" "${TORCH_ARGS[@]}" \
      --out "$OUT/run-pytorch-t$threads" | grep -E "^epoch|accuracy" | sed 's/^/pytorch /'
  fi
done
echo
"$PY" bench/compare.py "$OUT" | tee "$OUT/table.md"
