// Ops that gather, scatter or copy data into a new layout: repeat, repeat_interleave, cat,
// stack, index_select, gather, scatter_add, masked_select, triu/tril, sort and topk; and
// multinomial, which draws indices.
#pragma once

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

}  // namespace ember
