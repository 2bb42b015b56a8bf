// Arguments shared by the spatial ops (convolution, pooling, padding, resampling): IntList, one
// value for every spatial dim or one per dim, as torch's `_pair`/`_single`; and inputs taken
// batched (N, C, spatial…) or unbatched (C, spatial…).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "graph/tensor.h"

namespace ember {

using IntList =
    std::vector<int64_t>;  // one value for every spatial dim, or one per dim: {2} or {2, 1}

// `values` for n spatial dims: a single value repeated n times, or exactly n values; anything
// else is an Error naming `op` and the argument `arg`.
IntList expand_param(const IntList& values, int64_t n, std::string_view op, std::string_view arg);

// x of n spatial dims as (N, C, spatial…): a (C, spatial…) input gains a batch of one
// (unbatched = true, a view); any other rank, or a non-floating x, is an Error naming `op`.
struct SpatialInput {
  Tensor x;
  bool unbatched = false;
};
SpatialInput batched_input(const Tensor& x, int64_t n, std::string_view op);

}  // namespace ember
