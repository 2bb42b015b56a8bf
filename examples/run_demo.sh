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
# G2P: a short, bounded run (20,000 train words, a small model, 10 epochs: under a minute on 2
# cores) that shows dev WER falling, then pronounces a few words with the saved model. The full
# run (docs/examples.md, "Grapheme-to-phoneme on CMUdict") is `build/examples/g2p --out out/g2p`.
if [ -x "$build/examples/g2p" ]; then
  echo "=== g2p (short) ==="
  "$build/examples/g2p" --limit 20000 --eval-limit 1000 --epochs 10 --layers 2 --d-model 128 \
    --d-ff 256 --heads 4 --warmup 150 --lr-factor 0.3 --log-every 1000 --out out/g2p_demo
  "$build/examples/g2p" --load out/g2p_demo --predict ember tensor gradient pytorch
  ran=1
fi
# The physics-informed network, short: 500 Adam steps and 1,000 L-BFGS iterations (relative
# error ~0.1, under a minute on 2 cores); the full run (docs/examples.md, "A physics-informed
# network") is `build/examples/pinn --out out/pinn`.
if [ -x "$build/examples/pinn" ]; then
  echo "=== pinn (short) ==="
  "$build/examples/pinn" --adam-iters 500 --lbfgs-iters 1000 --out out/pinn_demo
  ran=1
fi
# Fashion-MNIST, short: the CNN on the first 12,000 training images for 2 epochs (about 88%
# test accuracy, under a minute on 2 cores).
# The full run (docs/examples.md, "Fashion-MNIST") is `build/examples/fashion_mnist`.
if [ -x "$build/examples/fashion_mnist" ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  echo "=== fashion_mnist (short) ==="
  "$build/examples/fashion_mnist" --train-size 12000 --test-size 2000 --epochs 2 --log-every 50 \
    --out out/fashion_mnist_demo
  ran=1
fi
[ "$ran" = 1 ] || { echo "no example program was built in $build/examples" >&2; exit 1; }
