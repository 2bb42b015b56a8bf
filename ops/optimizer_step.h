// The optimizers' fused in-place updates of one parameter from its gradient (torch's
// _single_tensor SGD and Adam), as ops below optim/: one pass over the parameter and its state
// on the CPU, one kernel on a device (cuda/optim.h), so that optim/ names no device. Internal.
#pragma once

#include "graph/tensor.h"

namespace ember {

// p -= lr (g + wd p) without momentum; with it, d = g + wd p, b = d on the first step else
// momentum b + keep d (keep = 1 - dampening), p -= lr (nesterov ? d + momentum b : b).
struct SgdStep {
  double lr = 0, weight_decay = 0, momentum = 0, keep = 1;
  bool first = false, nesterov = false;
};
void sgd_step_(const Tensor& param, const Tensor& momentum_buffer, const SgdStep& s);

// g += l2 p; p *= decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g²;
// p -= step_size m / (sqrt(v) / c2 + eps).
struct AdamStep {
  double l2 = 0, decay = 1, beta1 = 0, beta2 = 0, eps = 0, step_size = 0, c2 = 1;
};
void adam_step_(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s);

}  // namespace ember
