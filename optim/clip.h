// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "graph/tensor.h"

namespace ember::optim {

// total = the norm of order norm_type (2: sqrt of the summed squares; inf: the largest |entry|)
// over every gradient together; when max_norm / (total + 1e-6) < 1 each gradient is scaled by it
// in place (a NaN total makes every gradient NaN, as torch). error_if_nonfinite: a NaN or Inf
// total throws instead. Parameters without a gradient are skipped. Returns total.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace ember::optim
