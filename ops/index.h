// Ops that gather, scatter or copy data into a new layout: repeat, repeat_interleave, cat,
// stack, index_select, masked_select, triu/tril and sort.
#pragma once

#include "graph/tensor.h"

namespace ember {

struct SortResult {
  Tensor values, indices;
};

// Tiles x: repeats.size() >= x.dim(); leading extra repeats add dims, as torch.repeat.
Tensor repeat(const Tensor& x, std::vector<int64_t> repeats);
// Each element repeated `repeats` times, of the flattened tensor, as torch.
Tensor repeat_interleave(const Tensor& x, int64_t repeats);
// Each slice along `dim` repeated `repeats` times.
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // Int64 index (1-D)
Tensor masked_select(const Tensor& x, const Tensor& mask);  // 1-D, as x[mask]; mask broadcasts
Tensor triu(const Tensor& x, int64_t diagonal = 0);  // zero below the diagonal (last two dims)
Tensor tril(const Tensor& x, int64_t diagonal = 0);  // zero above the diagonal
// Values sorted along dim and the indices they came from; differentiable in the values.
SortResult sort(const Tensor& x, int64_t dim = -1, bool descending = false);

}  // namespace ember
