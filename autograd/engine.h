// The backward engine (autograd/engine.cpp), above ops/: Tensor::backward calls run_backward.
//
// Note [First-order only]
// Backward runs under NoGradGuard with raw kernels, so it records no graph: gradients of
// gradients (double backward, create_graph=true) are not supported, and asking for them throws.
#pragma once

#include "graph/autograd.h"

namespace ember {

// Runs backward from `root` (seeded with `grad`, or 1 for a one-element root).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

}  // namespace ember
