// Reductions: sum, mean, var, max/argmax, and sum_to (the broadcast-gradient reduction the
// engine applies). Dims may be negative; an empty dims list reduces every dim, as torch.
#pragma once

#include "graph/tensor.h"

namespace ember {

struct MaxResult {
  Tensor values, indices;
};

Tensor sum(const Tensor& x);  // all elements -> 0-d
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
// Variance over dims, divided by N - 1 when unbiased, else N.
Tensor var(const Tensor& x, std::vector<int64_t> dims, bool unbiased = true, bool keepdim = false);
// Largest value along dim and its (first) index; differentiable in the values.
MaxResult max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // largest element -> 0-d; ties share the gradient evenly
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// Sums `x` down to `shape`, which x's shape is a broadcast of.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace ember
