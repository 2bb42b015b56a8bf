// The backward engine (autograd/engine.cpp), above ops/: Tensor::backward calls run_backward.
//
// Note [First-order only]
// Backward runs under NoGradGuard with raw kernels, so it records no graph: gradients of
// gradients (double backward, create_graph=true) are not supported, and asking for them throws.
#pragma once

#include <functional>

#include "graph/autograd.h"

namespace ember {

// Runs backward from `root` (seeded with `grad`, or 1 for a one-element root).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

// Queues fn to run once the backward pass running on this thread has run every Node, before that
// backward returns (torch's Variable._execution_engine.queue_callback). Callable only from inside
// a backward (a Node, a leaf's post-accumulate-grad hook); callbacks run in the order queued, and
// one may queue more. DistributedDataParallel waits for its all-reduces here.
void queue_callback(std::function<void()> fn);

}  // namespace ember
