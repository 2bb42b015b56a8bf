// Shape ops that are views: they share the input's storage and change only shape, strides and
// offset (reshape copies only when no view can express the result). reshape/view take one -1.
#pragma once

#include "graph/tensor.h"

namespace ember {

Tensor reshape(const Tensor& x, Shape shape);  // a view when strides allow, else a copy
Tensor view(const Tensor& x, Shape shape);     // a view, or an error when strides forbid one
Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor unsqueeze(const Tensor& x, int64_t d);
Tensor squeeze(const Tensor& x, int64_t d);   // no-op when size(d) != 1, as torch
Tensor expand(const Tensor& x, Shape shape);  // -1 keeps a dim; new dims are prepended
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);

}  // namespace ember
