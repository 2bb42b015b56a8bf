// Ops that gather, scatter or copy data into a new layout: repeat, repeat_interleave, cat,
// stack, index_select, gather, scatter_add, masked_select, triu/tril, sort and topk; and
// multinomial, which draws indices.
#pragma once

#include <string>

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

struct SortResult {
  Tensor values, indices;
};
struct TopkResult {
  Tensor values, indices;
};

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// gather and scatter_add whose index out of range is told with `range` (a format with one "{}"
// for the index) instead of the op's own words, for ops built on them (a loss's targets); on a
// device, at the host's next wait for it (Note [Checks on the device]). "" keeps the op's words.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, const std::string& range);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   const std::string& range);

}  // namespace ember
