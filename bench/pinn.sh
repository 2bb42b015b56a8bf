#!/usr/bin/env bash
# examples/pinn against its PyTorch twin bench/pytorch/pinn.py at equal iterations and threads:
# each side's train_seconds (Adam then L-BFGS, from the first step to the last; start-up, data
# and evaluation excluded), REPEAT runs a side in turn, the median and the ratio Ember / PyTorch.
#
#   bench/pinn.sh [BUILD_DIR]
#   env: PYTHON=/usr/bin/python3 (the torch to run)  THREADS="1 2"  REPEAT=3
#        ADAM=200 LBFGS=200 (iterations)  WAIT_POLICY= (PyTorch's OMP_WAIT_POLICY; unset: its
#        default, which at 2 threads beat PASSIVE here)
#        EMBER_ARGS= (more flags for examples/pinn, e.g. "--derivatives forward")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${1:-build}
PY=${PYTHON:-/usr/bin/python3}
ITERS=(--adam-iters "${ADAM:-200}" --lbfgs-iters "${LBFGS:-200}")
# torch's L-BFGS keeps a curvature pair when y·s > 1e-10: Ember's twin does the same here.
EMBER_ONLY=(--lbfgs-curvature-eps 1e-10 ${EMBER_ARGS:-})
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; torch $("$PY" -c 'import torch; print(torch.__version__)')"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for t in ${THREADS:-1 2}; do
  : >"$OUT/ember" && : >"$OUT/torch"
  for _ in $(seq "${REPEAT:-3}"); do
    "$BUILD/examples/pinn" "${ITERS[@]}" "${EMBER_ONLY[@]}" --threads "$t" --out "$OUT/run" >/dev/null
    "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["train_seconds"])' \
      "$OUT/run/metrics.json" >>"$OUT/ember"
    env OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" ${WAIT_POLICY:+OMP_WAIT_POLICY=$WAIT_POLICY} \
      "$PY" bench/pytorch/pinn.py "${ITERS[@]}" --threads "$t" |
      "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["train_seconds"])' >>"$OUT/torch"
  done
  e=$(median <"$OUT/ember") p=$(median <"$OUT/torch")
  echo "threads $t: Ember $e s, PyTorch $p s (medians of ${REPEAT:-3}; runs: $(paste -sd' ' "$OUT/ember") / $(paste -sd' ' "$OUT/torch")), ratio $(awk -v a="$e" -v b="$p" 'BEGIN { printf "%.2f", a / b }')"
done
