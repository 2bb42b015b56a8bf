#!/usr/bin/env bash
# Builds and runs tests/consumer, a user's C++-only project, against Ember one of two ways:
#   run.sh package BUILD_DIR WORK_DIR [MPIEXEC]   cmake --install BUILD_DIR into a fresh prefix,
#                                                  then find_package(ember) from there alone, and
#                                                  every installed header compiled alone
#   run.sh subdirectory SOURCE_DIR WORK_DIR [MPIEXEC]   add_subdirectory(SOURCE_DIR)
# With MPIEXEC (Ember was built with MPI) ember::distributed must exist, and all_reduce runs
# alone and on two processes.
set -euo pipefail
mode=$1 from=$2 work=$3 mpiexec=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
expect_distributed=OFF
[ -n "$mpiexec" ] && expect_distributed=ON
rm -rf "$work"
mkdir -p "$work"
case "$mode" in
  package)
    cmake --install "$from" --prefix "$work/prefix" > "$work/install.log"
    # Only the fresh prefix: no package registry, no system-wide ember.
    cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
      -DEMBER_EXPECT_DISTRIBUTED=$expect_distributed -DEMBER_CHECK_HEADERS=ON ;;
  subdirectory)
    # No build type: Ember's sources compile without optimisation, the quickest build.
    cmake -S "$here" -B "$work/build" -DEMBER_SOURCE_DIR="$from" \
      -DEMBER_EXPECT_DISTRIBUTED=$expect_distributed ;;
  *) echo "run.sh: unknown mode '$mode' (package or subdirectory)" >&2; exit 2 ;;
esac
cmake --build "$work/build" -j2
"$work/build/fit_line"
if [ -n "$mpiexec" ]; then
  "$work/build/all_reduce"
  OMP_NUM_THREADS=1 "$mpiexec" -n 2 --allow-run-as-root --oversubscribe --bind-to none \
    "$work/build/all_reduce"
fi
echo "consumer ($mode): built and ran"
