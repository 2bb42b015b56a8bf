#!/usr/bin/env bash
# `make demo`: runs the example trainers that are built (short, default settings).
set -euo pipefail
build=${1:-build}
ran=0
for program in nw_regression mlp_regression transformer_copy; do
  if [ -x "$build/examples/$program" ]; then
    echo "=== $program ==="
    "$build/examples/$program" --out "out/$program"
    ran=1
  fi
done
[ "$ran" = 1 ] || { echo "no example program was built in $build/examples" >&2; exit 1; }
