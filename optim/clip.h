// Gradient clipping by the global L2 norm, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "graph/tensor.h"

namespace ember::optim {

// total = sqrt(sum of every gradient's squared entries); when max_norm / (total + 1e-6) < 1 each
// gradient is scaled by it in place. Parameters without a gradient are skipped. Returns total.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace ember::optim
