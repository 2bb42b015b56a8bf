// Reductions: sum, mean, var, std, logsumexp, cumsum (a scan), max/argmax, and sum_to (the
// broadcast-gradient reduction the engine applies). Dims may be negative; an empty dims list
// reduces every dim, as torch.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

struct MaxResult {
  Tensor values, indices;
};

// Sums `x` down to `shape`, which x's shape is a broadcast of.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace ember
