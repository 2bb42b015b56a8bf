#!/usr/bin/env bash
# Data-parallel training on one machine (issue 15): the copy-task step A and an epoch of the small
# copy model, as 1 process x 2 threads and as 2 processes x 1 thread (mpirun), with the time per
# step, the time backward waited for the all-reduce, and how much of a lone all-reduce the
# overlap hid (bench/ddp/ddp_bench.cpp). BENCHMARKS.md has the figures and the cost model.
#
#   bench/ddp.sh [BUILD_DIR]      env: DDP_STEPS=10 (timed steps of A; epochs: DDP_STEPS / 4)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"${JOBS:-2}" --target ddp_bench
BIN="$BUILD/bench/ddp_bench"
STEPS=${DDP_STEPS:-10}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
# One process needs no mpirun: MPI is never initialised, DDP does nothing.
"$BIN" --threads 2 --steps "$STEPS"
# --bind-to core: one core per rank, as mpirun does by default for 2 ranks.
mpirun --allow-run-as-root -np 2 --bind-to core "$BIN" --threads 1 --steps "$STEPS"
