// Padding and resampling, as torch.nn.functional: pad (constant, reflect, replicate, circular)
// and interpolate (nearest, linear, bilinear, with align_corners). Both are linear in x and
// differentiate any number of times, on every device.
#pragma once

#include <optional>
#include <string_view>

#include "graph/tensor.h"
#include "ops/spatial.h"

namespace ember {

// x padded by (left, right) of the last dim, then of the dim before it, …: pad holds an even
// number of values, at most 2 · x.dim(). "constant" fills with value (a negative pad crops);
// "reflect" mirrors without repeating the edge (pad < size), "replicate" repeats the edge and
// "circular" wraps around (pad <= size), each on x (N, C, spatial…) or unbatched (C, spatial…)
// of 1 to 3 padded spatial dims, as torch.
Tensor pad(const Tensor& x, IntList pad, std::string_view mode = "constant", double value = 0);

// x (N, C, spatial…) resampled to `size` (one value for every spatial dim, or one per dim):
// "nearest" (3-D to 5-D x; torch's legacy nearest, src = floor(dst · in / out)), "linear" (3-D)
// and "bilinear" (4-D), with align_corners (default false; an Error with "nearest", as torch).
Tensor interpolate(const Tensor& x, IntList size, std::string_view mode = "nearest",
                   std::optional<bool> align_corners = {});

}  // namespace ember
