// The optimizers' fused in-place updates of parameters from their gradients, as ops below
// optim/ so that optim/ names no device: on the CPU one pass over each parameter and its state
// (torch's _single_tensor SGD and Adam), on a device one kernel for up to kMaxOptimTensors
// parameters at a time (torch's _multi_tensor "foreach" path, cuda/optim.h). Every parameter of
// a call takes the same step (the caller groups them); `state` lists are parallel to `params`.
// Internal.
#pragma once

#include <span>

#include "graph/tensor.h"

namespace ember {

// p -= lr (g + wd p) without momentum; with it, d = g + wd p, b = d on the first step else
// momentum b + keep d (keep = 1 - dampening), p -= lr (nesterov ? d + momentum b : b).
struct SgdStep {
  double lr = 0, weight_decay = 0, momentum = 0, keep = 1;
  bool first = false, nesterov = false;
};
void sgd_step_(std::span<const Tensor> params, std::span<const Tensor> momentum_buffers,
               const SgdStep& s);

// g += l2 p; p *= decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g²;
// p -= step_size m / (sqrt(v) / c2 + eps).
struct AdamStep {
  double l2 = 0, decay = 1, beta1 = 0, beta2 = 0, eps = 0, step_size = 0, c2 = 1;
};
void adam_step_(std::span<const Tensor> params, std::span<const Tensor> exp_avgs,
                std::span<const Tensor> exp_avg_sqs, const AdamStep& s);

}  // namespace ember
