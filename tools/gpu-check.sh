#!/usr/bin/env bash
# The GPU run of issue 35, the same every time: build here, carry the bundle, run it there.
#
#   tools/gpu-check.sh bundle   # here: a portable CUDA build (x86-64-v3, not -march=native: the GPU
#                               # machine's processor may lack this one's AVX-512) into build-gpu/,
#                               # then gpu-bundle.tar.xz: its test and example binaries and the
#                               # shared libraries they need beyond the base system (ldd), 12 MB
#                               # packed (66 MB unpacked, over what a device call carries)
#   tools/gpu-check.sh run      # there, from the repository root, gpu-bundle.tar.xz carried (the
#                               # device tool's carry: ["gpu-bundle.tar.xz"], it is ignored): the
#                               # machine (nvidia-smi, the processor), the CUDA suite
#                               # (DEVICE_TESTS below), the copy task trained with --device cuda,
#                               # char_lm's ms/iter against PyTorch's on the same GPU (Float32,
#                               # bfloat16 products/autocast, torch.compile), and the
#                               # transformer steps A, B, C against PyTorch eager (Float32 and
#                               # bfloat16) and torch.compile, step C against its products alone,
#                               # with cudaMalloc and host-wait counts (bench/gpu_summary.py), to
#                               # logs under $OUT (default out/gpu-check); several minutes
#
# The GPU machine has CUDA's driver, none of Ember's Debian packages and no network: the bundle
# carries OpenBLAS, fmt, Boost.Test, libgomp, libgfortran and the CUDA runtime Ember was built
# against; cuBLAS it finds there. A suite's CUDA cases skip with one line where no GPU is usable, so `run` works here
# too (as a check of the bundle).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUNDLE=gpu-bundle
# The CUDA suite: the device cases and the op tables' rows on the device (tests/CMakeLists.txt's
# device_emulated runs the same on the emulated device)
DEVICE_TESTS="test_device:*/table_on_device"
case "${1:-}" in
bundle)
  # x86-64-v3 (AVX2, FMA): what any GPU machine's processor has, and the kernels' AVX2 paths
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DEMBER_NATIVE=OFF -DEMBER_CUDA=ON \
    -DEMBER_MPI=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target ember_tests transformer_copy char_lm pinn \
    ember_bench
  rm -rf "$BUNDLE" "$BUNDLE.tar.xz" && mkdir -p "$BUNDLE/lib"
  cp build-gpu/tests/ember_tests build-gpu/examples/{transformer_copy,char_lm,pinn} \
    build-gpu/bench/ember_bench "$BUNDLE/"
  # every library the binaries load except the C library's own and libstdc++/libgcc_s (the GPU
  # machine's are newer, and backward compatible)
  for bin in "$BUNDLE"/ember_tests "$BUNDLE"/transformer_copy; do ldd "$bin"; done |
    awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" "$BUNDLE/lib/"; done
  strip "$BUNDLE"/ember_tests "$BUNDLE"/transformer_copy "$BUNDLE"/char_lm "$BUNDLE"/pinn \
    "$BUNDLE"/ember_bench
  # char_lm's text (Debian's fortunes, not installed there): the files without a dot
  mkdir -p "$BUNDLE/fortunes"
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$BUNDLE/fortunes/" \;
  tar -cJf "$BUNDLE.tar.xz" "$BUNDLE" && rm -rf "$BUNDLE"
  for ignored in "/$BUNDLE/" "/$BUNDLE.tar.xz"; do
    grep -qxF "$ignored" .git/info/exclude || echo "$ignored" >>.git/info/exclude
  done
  ls -l "$BUNDLE.tar.xz"
  ;;
run)
  OUT=${OUT:-out/gpu-check}
  mkdir -p "$OUT"
  UNPACKED=$(mktemp -d)
  tar -C "$UNPACKED" -xJf "$BUNDLE.tar.xz"
  BIN="$UNPACKED/$BUNDLE"
  # cuBLAS (600 MB, over what a device call carries) is the machine's own: its CUDA toolkit's,
  # or the nvidia-cublas wheel PyTorch runs on
  CUBLAS=$(find /usr/local/cuda*/ /usr/lib /usr/local/lib /opt -name 'libcublas.so.13' 2>/dev/null |
    head -n 1)
  [ -n "$CUBLAS" ] || CUBLAS=$(python3 -c 'import nvidia, os; print(" ".join(nvidia.__path__))' \
    2>/dev/null | xargs -r -I{} find {} -name 'libcublas.so.13' 2>/dev/null | head -n 1)
  echo "cuBLAS: ${CUBLAS:-not found}"
  export LD_LIBRARY_PATH="$BIN/lib${CUBLAS:+:$(dirname "$CUBLAS")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export EMBER_GOLDEN_DIR="$ROOT/tests/golden"
  { nvidia-smi || echo "no nvidia-smi"; lscpu | sed -n 's/^Model name: *//p'; } >"$OUT/machine.txt" 2>&1
  status=0
  "$BIN/ember_tests" --run_test="$DEVICE_TESTS" --log_level=message >"$OUT/device.log" 2>&1 ||
    status=1
  tail -n 3 "$OUT/device.log"
  # The copy task trained on the GPU (a small config): it runs and learns
  "$BIN/transformer_copy" --device cuda --layers 2 --d-model 128 --d-ff 256 --heads 4 --epochs 3 \
    --out "$OUT/transformer_copy" >"$OUT/transformer_copy.log" 2>&1 || status=1
  tail -n 2 "$OUT/transformer_copy.log"
  # char_lm's iteration (nanoGPT's CPU config), Ember and PyTorch on the same GPU, ms/iter from
  # each side's metrics.json; the evaluations are left out of both timings
  LM="--iters ${LM_ITERS:-300} --eval-interval 100000 --eval-iters 1 --log-every 100"
  # each side in Float32 and with bfloat16 products (Ember's medium precision, torch.autocast),
  # and torch.compile's Float32
  for run in "ember:" "ember_bf16:--matmul-precision medium"; do
    "$BIN/char_lm" --device cuda --data "$BIN/fortunes" $LM --sample 20 ${run#*:} \
      --out "$OUT/char_lm_${run%%:*}" >"$OUT/char_lm_${run%%:*}.log" 2>&1 || status=1
  done
  for run in "torch:" "torch_autocast:--autocast" "torch_compile:--compile"; do
    python3 bench/pytorch/char_lm.py --device cuda --data "$BIN/fortunes" $LM ${run#*:} \
      --out "$OUT/char_lm_${run%%:*}" >"$OUT/char_lm_${run%%:*}.log" 2>&1 || status=1
  done
  for side in ember ember_bf16 torch torch_autocast torch_compile; do
    python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(sys.argv[2], "ms/iter",
      round(m["ms_per_iter"], 3), "val", m["val_loss"][-1])' \
      "$OUT/char_lm_$side/metrics.json" "$side" 2>/dev/null || echo "$side: no metrics"
  done | tee "$OUT/char_lm.txt"
  # The transformer steps (bench/transformer_steps.cpp and its twin in bench_torch.py), each
  # side's Float32 and bfloat16 runs, torch.compile's, and Ember's books of a steady step
  T=${BENCH_TIME:-2}
  "$BIN/ember_bench" --device cuda --filter transformer/ --time "$T" --json "$OUT/ember.json" \
    >"$OUT/ember_bench.log" 2>&1 || status=1
  "$BIN/ember_bench" --device cuda --filter transformer/ --time "$T" --matmul-precision medium \
    --json "$OUT/ember_bf16.json" >>"$OUT/ember_bench.log" 2>&1 || status=1
  for mode in "torch:" "torch_autocast:--autocast" "torch_compile:--compile"; do
    python3 bench/pytorch/bench_torch.py --device cuda --filter transformer/ --time "$T" \
      ${mode#*:} --json "$OUT/${mode%%:*}.json" >>"$OUT/torch_bench.log" 2>&1 || status=1
  done
  python3 bench/gpu_summary.py "$OUT" | tee "$OUT/summary.md" || status=1
  exit "$status"
  ;;
*)
  echo "usage: tools/gpu-check.sh bundle|run" >&2
  exit 2
  ;;
esac
